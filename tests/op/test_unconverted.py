"""AutoGraph converts none of our code (`op/unconverted.py`): an error we
raise is the same, type and message, eagerly, in a `tf.function` and under
XLA; and a user's callable relying on AutoGraph for a Python `if` on a
tensor still works inside a `tf.function`, as while AutoGraph converted our
code and, through it, the user's.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.autograph.impl import conversion  # pylint: disable=g-direct-tensorflow-import

import tf_recurrent
from tf_recurrent import seq2seq
from tf_recurrent.op import unconverted

STATE = {"h": tf.zeros([2])}


def cell(theta, state, x):
  del theta
  return {"h": state["h"] + x}, []


def inputs():
  return tf.ones([3, 2])


class TupleCell:
  """An RNNCell object."""
  state_size, output_size = 3, 3

  def zero_state(self, batch_size, dtype):
    return tf.zeros([batch_size, 3], dtype)

  def __call__(self, x, state):
    return state + tf.reduce_sum(x, -1, keepdims=True), state


def op_case(**kwargs):
  """The op on `cell` over `inputs()`, some arguments replaced."""
  args = dict(theta={}, state0=STATE, inputs=inputs(), cell_fn=cell)
  args.update(kwargs)
  return lambda: tf_recurrent.recurrent(**args)


# The error cases of test_errors.py (the op), test_layers.py (the layers'
# calls: layers are made outside functions) and test_dynamic.py
# (dynamic_rnn and raw_rnn), as calls building their inputs where they run.
# (A leaf TensorFlow cannot convert is left out: TensorFlow's own message,
# which ours quotes, differs between eager and graph.)
ERROR_CASES = {
    "op_cell_fn_not_callable": op_case(cell_fn=3),
    "op_inputs_disagree_on_t": lambda: tf_recurrent.recurrent(
        {}, STATE, {"a": inputs(), "b": tf.ones([4, 2])},
        lambda t, s, x: cell(t, s, x["a"])),
    "op_scalar_input_leaf": lambda: tf_recurrent.recurrent(
        {}, STATE, [inputs(), tf.constant(1.0)],
        lambda t, s, x: cell(t, s, x[0])),
    "op_state_structure": op_case(
        cell_fn=lambda t, s, x: ({"g": s["h"]}, [])),
    "op_state_dtype": op_case(
        cell_fn=lambda t, s, x: ({"h": tf.cast(s["h"], tf.float64)}, [])),
    "op_not_a_pair": op_case(cell_fn=lambda t, s, x: s),
    "op_stateful_random": op_case(cell_fn=lambda t, s, x: (
        {"h": s["h"] + tf.random.uniform([2])}, [])),
    "op_max_input_length": op_case(max_input_length=4),
    "op_bad_seed": op_case(seed=[1, 2, 3]),
    "op_bad_checkpoint_every": op_case(checkpoint_every=0),
    "op_bad_sequence_length": op_case(sequence_length=[1, 2, 3]),
    "op_bad_stop_fn": op_case(stop_fn=lambda t, theta, s: 1.5),
    "op_bad_xla_steps": op_case(xla_steps="sometimes"),
    "step_seed_outside_a_step": tf_recurrent.step_seed,
    "layer_mask_shape": lambda: tf_recurrent.LSTM(3, name="lstm")(
        tf.ones([2, 4, 5]), mask=tf.ones([2, 6], tf.bool)),
    "layer_initial_state": lambda: tf_recurrent.GRU(3, name="gru")(
        tf.ones([2, 4, 5]), initial_state=[tf.zeros([2, 3])] * 2),
    "layer_inputs_rank": lambda: tf_recurrent.SimpleRNN(3, name="rnn")(
        tf.ones([2, 5])),
    "dynamic_not_a_cell": lambda: tf_recurrent.dynamic_rnn(
        lambda a, b: (a, b), tf.ones([2, 3, 4]), dtype=tf.float32),
    "dynamic_no_dtype": lambda: tf_recurrent.dynamic_rnn(
        keras.layers.GRUCell(3), tf.ones([2, 3, 4])),
    "dynamic_initial_state": lambda: tf_recurrent.dynamic_rnn(
        keras.layers.LSTMCell(3), tf.ones([2, 3, 4]),
        initial_state=tf.zeros([2, 3])),
    "dynamic_sequence_length": lambda: tf_recurrent.dynamic_rnn(
        TupleCell(), tf.ones([2, 3, 4]), dtype=tf.float32,
        sequence_length=[1, 2, 3]),
    "raw_loop_fn_not_callable": lambda: tf_recurrent.raw_rnn(
        TupleCell(), None),
    "sequence_loss_rank": lambda: seq2seq.sequence_loss(
        tf.ones([2, 3]), tf.ones([2, 3], tf.int32), tf.ones([2, 3])),
}


def error_of(mode, case):
  """(type, message) of the error `case` raises in `mode`."""
  fn = case if mode == "eager" else tf.function(
      case, jit_compile=mode == "xla")
  with pytest.raises(Exception) as raised:
    fn()
  return type(raised.value), str(raised.value)


@pytest.mark.parametrize("name", list(ERROR_CASES))
def test_errors_are_the_same_in_every_mode(name):
  """Inside a tf.function AutoGraph rebuilt every error passing up through
  converted code: its message prefixed with AutoGraph's traceback, and a
  type it cannot rebuild (UnrecomputableStepError, a ValueError) turned
  into its StagingError, which a user's `except ValueError` misses."""
  eager = error_of("eager", ERROR_CASES[name])
  assert issubclass(eager[0], (ValueError, TypeError, RuntimeError))
  assert error_of("function", ERROR_CASES[name]) == eager
  assert error_of("xla", ERROR_CASES[name]) == eager


def test_our_code_is_never_converted():
  """Our functions, methods and objects are called unconverted, as
  TensorFlow's and Keras's are; the user's are not."""
  ours = [tf_recurrent.recurrent, tf_recurrent.dynamic_rnn,
          seq2seq.dynamic_decode, seq2seq.BasicDecoder.step,
          tf_recurrent.LSTM(2), tf_recurrent.lingvo.Recurrent]
  assert all(conversion.is_allowlisted(fn) for fn in ours)
  assert not conversion.is_allowlisted(cell)


def relu_if(x):
  """A Python `if` on a tensor: only AutoGraph makes it run in a graph."""
  if tf.reduce_sum(x) > 0:
    return x
  return -x


class IfCell(TupleCell):
  def __call__(self, x, state):
    return super().__call__(relu_if(x), state)


def user_code_cases():
  """Each a function of `x` `[T, B, 3]` calling us with a callable of the
  user's that relies on AutoGraph."""
  def op(x):
    return tf_recurrent.recurrent((), tf.zeros([2, 3]), x,
                                  lambda _, h, x_t: (h + relu_if(x_t), []))[1]

  def dynamic(x):
    return tf_recurrent.dynamic_rnn(IfCell(), x, dtype=tf.float32,
                                    time_major=True)[1]

  def raw(x):
    def loop_fn(time, output, state, loop_state):
      state = tf.zeros([2, 3]) if output is None else state
      next_input = relu_if(x[tf.minimum(time, 3)])
      return tf.fill([2], time >= 4), next_input, state, output, loop_state
    return tf_recurrent.raw_rnn(IfCell(), loop_fn)[1]

  def lingvo(x):
    return tf_recurrent.lingvo.Recurrent(
        {}, {"h": tf.zeros([2, 3])}, {"x": x},
        lambda _, s, x_t: ({"h": s["h"] + relu_if(x_t["x"])}, {}))[1]["h"]

  rnn_cell = keras.layers.SimpleRNNCell(3)  # Its variables made outside.
  rnn_cell.build((2, 3))

  def decode(x):
    sampler = seq2seq.CustomSampler(
        initialize_fn=lambda _: (tf.zeros([2], tf.bool), relu_if(x[0])),
        sample_fn=lambda time, outputs, state: tf.zeros([2], tf.int32),
        next_inputs_fn=lambda time, outputs, state, sample_ids: (
            tf.fill([2], time >= 3), relu_if(outputs), state))
    decoder = seq2seq.BasicDecoder(rnn_cell, sampler)
    outputs, _, _ = decoder(None, initial_state=tf.zeros([2, 3]))
    return outputs.rnn_output

  return {"op": op, "dynamic": dynamic, "raw": raw, "lingvo": lingvo,
          "decode": decode}


@pytest.mark.parametrize("kind", ["op", "dynamic", "raw", "lingvo",
                                  "decode"])
def test_user_callables_converted_where_the_caller_is(kind):
  """AutoGraph converted the user's callables through our converted code;
  now that it converts none of ours, we convert them as the caller's code
  is: inside a default tf.function they run with their `if`, and inside one
  with autograph=False they fail as a direct call would."""
  fn = user_code_cases()[kind]
  x = tf.constant(np.random.default_rng(3).normal(size=[4, 2, 3]),
                  tf.float32)
  got = tf.function(fn)(x)
  assert got.shape[-1] == 3 and np.isfinite(got).all()
  with pytest.raises(TypeError, match="as a Python `bool`"):
    tf.function(fn, autograph=False)(x)


def test_errors_as_raised_leaves_the_users_converted_errors_to_autograph():
  """An error raised in the user's converted code keeps AutoGraph's report
  (its traceback into the user's code)."""
  def loop_fn(time, output, state, loop_state):
    del time, output, state, loop_state
    raise KeyError("the user's")

  @tf.function
  def run():
    return tf_recurrent.raw_rnn(TupleCell(), loop_fn)

  with pytest.raises(KeyError, match="the user's") as raised:
    run()
  assert "in user code" in str(raised.value)
  assert unconverted.like_caller(None) is None


def listing_cell(theta, state, x):
  """A cell with Python lists: an empty literal filled by `append`, and
  Lingvo's `[]` for no extras."""
  terms = []
  terms.append(tf.matmul(state["h"], theta["w"]))
  terms.append(x)
  return {"h": tf.tanh(terms[0] + terms[1])}, []


@pytest.mark.parametrize("jit", [False, True], ids=["function", "xla"])
def test_user_callables_converted_with_the_callers_features(jit):
  """The user's callable is converted with the caller's AutoGraph features:
  a default `tf.function` leaves Python lists alone (list conversion is an
  optional feature), so a cell's `[]` stays a list, not a TensorList, which
  XLA cannot compile (it failed to) and which would become an extra."""
  rng = np.random.default_rng(5)
  theta = {"w": tf.constant(rng.normal(size=[3, 3]), tf.float32)}
  x = tf.constant(rng.normal(size=[4, 2, 3]), tf.float32)

  def values_and_grads(theta, x):
    with tf.GradientTape() as tape:
      tape.watch([theta, x])
      acc, final = tf_recurrent.recurrent(
          theta, {"h": tf.zeros([2, 3])}, x, listing_cell)
      loss = tf.reduce_sum(acc["h"] * tf.range(1.0, 4.0)) + tf.reduce_sum(
          final["h"])
    return acc["h"], tape.gradient(loss, [theta["w"], x])

  expected = values_and_grads(theta, x)
  got = tf.function(values_and_grads, jit_compile=jit)(theta, x)
  for g, e in zip(tf.nest.flatten(got), tf.nest.flatten(expected)):
    np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
