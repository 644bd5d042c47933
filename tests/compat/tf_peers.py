"""What the ports of TensorFlow's own RNN tests share: tf_keras's legacy
cells (imported in-process beside Keras 3: tf_keras is its own package and
needs no TF_USE_LEGACY_KERAS), the originals' plain-Python RNNCell test
cells, and the variable-scope check their `_testScope` helpers repeat.

The ported files are test_dynamic_peers_rnn.py (rnn_test.py),
test_dynamic_peers_rnn_cell.py (rnn_cell_test.py) and test_contrib_peers.py
(contrib's functional_rnn_test.py).
"""

import contextlib

import numpy as np
import tensorflow as tf
from tf_keras.src.layers.rnn import legacy_cell_wrappers
from tf_keras.src.layers.rnn import legacy_cells as rnn_cell

DropoutWrapper = legacy_cell_wrappers.DropoutWrapper

__all__ = ["PeerTestCase", "SeededTestCase", "rnn_cell", "DropoutWrapper", "Plus1RNNCell", "CallPlus1RNNCell",
           "ScalarStateRNNCell", "UnbalancedOutputRNNCell",
           "TensorArrayStateRNNCell", "DummyMultiDimensionalLSTM",
           "NestedRNNCell", "TestStateSaver", "check_scope",
           "unittest_result_lists"]


class PeerTestCase(tf.test.TestCase):
  """`tf.test.TestCase` whose `subTest` is a plain context, so that a
  failure in either mode of `run_in_graph_and_eager_modes` fails the test
  (pytest would report a failed subtest of a passing test)."""

  @contextlib.contextmanager
  def subTest(self, msg=None, **params):  # pylint: disable=invalid-name
    del msg, params
    yield

  def test_session(self, *args, **kwargs):
    return super().test_session(*args, **kwargs)

  test_session.__test__ = False  # A helper, not a test to collect.


class SeededTestCase(PeerTestCase):
  """The originals' setUp: NumPy seeded with their seed, 23489."""

  def setUp(self):
    super().setUp()
    self._seed = 23489
    np.random.seed(self._seed)


def unittest_result_lists(test):
  """Gives pytest's unittest result the `errors` and `skipped` lists that
  TensorFlow's assert_no_new_pyobjects_executing_eagerly reads from
  `self._outcome.result` (unittest's own result has them)."""
  result = getattr(getattr(test, "_outcome", None), "result", None)
  for name in ("errors", "skipped"):
    if result is not None and not hasattr(result, name):
      setattr(result, name, [])


class CallPlus1RNNCell(rnn_cell.RNNCell):
  """rnn_test.py's Plus1RNNCell: (output, state) = (input + 1, state + 1),
  through RNNCell's own `__call__`."""

  @property
  def output_size(self):
    return 5

  @property
  def state_size(self):
    return 5

  def call(self, input_, state, scope=None):
    return (input_ + 1, state + 1)


class Plus1RNNCell(CallPlus1RNNCell):
  """rnn_cell_test.py's Plus1RNNCell: the same, overriding `__call__`."""

  def __call__(self, input_, state, scope=None):
    return (input_ + 1, state + 1)


class ScalarStateRNNCell(rnn_cell.RNNCell):
  """(output, state) = (input, state + 1), the state an int32 scalar."""

  @property
  def output_size(self):
    return 1

  @property
  def state_size(self):
    return tf.TensorShape([])

  def zero_state(self, batch_size, dtype):
    return tf.zeros([], dtype=tf.int32)

  def call(self, input_, state, scope=None):
    return (input_, state + 1)


class UnbalancedOutputRNNCell(ScalarStateRNNCell):
  """Outputs (input, [input, input]): an output structure of two sizes."""

  @property
  def output_size(self):
    return tf.TensorShape(1), tf.TensorShape(2)

  def call(self, input_, state, scope=None):
    concatenated = tf.concat((input_, input_), axis=-1)
    return (input_, concatenated), state + 1


class TensorArrayStateRNNCell(rnn_cell.RNNCell):
  """A state of (step, TensorArray): each step writes its input."""

  @property
  def output_size(self):
    return 1

  @property
  def state_size(self):
    return (tf.TensorShape([]), ())

  def zero_state(self, batch_size, dtype):
    return (tf.zeros([], dtype=tf.int32),
            tf.TensorArray(dtype=dtype, size=0, dynamic_size=True))

  def call(self, input_, state, scope=None):
    new_array = state[1].write(state[0], input_)
    return (input_, (state[0] + 1, new_array))


class DummyMultiDimensionalLSTM(rnn_cell.RNNCell):
  """(output, (h, c)) = (input + 1, (h + 1, c + 1)) for inputs of any rank
  after time and batch."""

  def __init__(self, dims):
    super().__init__()
    if not isinstance(dims, tuple):
      raise TypeError("dims must be a tuple of ints")
    self._dims = dims
    self._output_size = tf.TensorShape(dims)
    self._state_size = (tf.TensorShape(dims), tf.TensorShape(dims))

  @property
  def output_size(self):
    return self._output_size

  @property
  def state_size(self):
    return self._state_size

  def __call__(self, input_, state, scope=None):
    h, c = state
    return (input_ + 1, (h + 1, c + 1))


class NestedRNNCell(rnn_cell.RNNCell):
  """Input, output and state each a pair; every tensor gets + 1."""

  @property
  def output_size(self):
    return (5, 5)

  @property
  def state_size(self):
    return (6, 6)

  def __call__(self, input_, state, scope=None):
    h, c = state
    x, y = input_
    return ((x + 1, y + 1), (h + 1, c + 1))


class TestStateSaver:
  """The state saver static_state_saving_rnn reads and writes."""

  __test__ = False

  def __init__(self, batch_size, state_size):
    self._batch_size = batch_size
    self._state_size = state_size
    self.saved_state = {}

  def state(self, name):
    size = self._state_size
    if isinstance(size, int):
      size = (size,)
    return tf.zeros((self._batch_size,) + tuple(size))

  def save_state(self, name, state):
    self.saved_state[name] = state
    return tf.identity(state)

  @property
  def batch_size(self):
    return self._batch_size

  @property
  def state_size(self):
    return self._state_size


def check_scope(test, factory, default, prefix="prefix", use_outer_scope=True):
  """The originals' `_testScope`: in a fresh graph, `factory(scope)` (the
  scope a VariableScope, a name, or None) creates variables only under
  `prefix` (`default` when None)."""
  with test.session(graph=tf.Graph()):
    if use_outer_scope:
      with tf.compat.v1.variable_scope(prefix) as scope:
        factory(scope)
    else:
      factory(prefix)
    tf.compat.v1.global_variables_initializer()
    all_vars = tf.compat.v1.global_variables()
    prefix = prefix or default
    scope_vars = [v for v in all_vars if v.name.startswith(prefix + "/")]
    test.assertEqual(len(scope_vars), len(all_vars))
