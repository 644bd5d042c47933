"""contrib's tensorflow/contrib/recurrent/python/kernel_tests/
functional_rnn_test.py (TF 1.x, commit
a05aa78f0c8ffc356850f8f1ac9f4e0bb0457264), every case, run against
tf_recurrent.contrib's functional_rnn / bidirectional_functional_rnn: each
case's name, logic, shapes, seeds and tolerances kept. As in the original,
every run is a TF1 graph with a Session, the lengths fed to an int32
placeholder of unknown rank, and tf.compat.v1.nn.dynamic_rnn /
bidirectional_dynamic_rnn is the reference; the cells are tf_keras's legacy
cells (tests/compat/tf_peers.py). (`np.int`, gone from NumPy, is `int`.)
"""

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import test_util

from tf_recurrent import contrib as functional_rnn
from tf_peers import PeerTestCase, rnn_cell

v1 = tf.compat.v1


def _CreateStackedLstmCell(*cell_sizes):
  return rnn_cell.MultiRNNCell([rnn_cell.LSTMCell(s) for s in cell_sizes])


class FunctionalRnnTest(PeerTestCase):

  _BATCH_SIZE = 3
  _TOTAL_TIME = 5
  _INPUT_SIZE = 11
  _NUM_UNITS = 7

  _CELLDEFS = {
      "gru": (rnn_cell.GRUCell, [_NUM_UNITS]),
      "lstm": (rnn_cell.LSTMCell, [_NUM_UNITS]),
      "stacked_lstm": (_CreateStackedLstmCell, [_NUM_UNITS] * 3),
  }

  def _CreateCell(self, celldef_name):
    func, args = self._CELLDEFS[celldef_name]
    return func(*args)

  def _CreateInputs(self, time_major=False):
    shape = ([self._TOTAL_TIME, self._BATCH_SIZE, self._INPUT_SIZE]
             if time_major else
             [self._BATCH_SIZE, self._TOTAL_TIME, self._INPUT_SIZE])
    inputs = np.random.random(shape)
    # Always leave one time slot empty, to check max_length behavior.
    sequence_length = np.random.randint(
        0, high=self._TOTAL_TIME - 1, size=self._BATCH_SIZE, dtype=int)
    return (inputs, sequence_length)

  def _CreateSymmetricInputs(self):
    # total time = batch size
    n = self._BATCH_SIZE
    inputs = np.zeros((n, n, self._INPUT_SIZE))
    for i in range(n):
      for j in range(i, n):
        inputs[i][j] = np.random.random([self._INPUT_SIZE])
        inputs[j][i] = inputs[i][j]
    sequence_length = np.random.randint(0, high=n - 1, size=n, dtype=int)
    return (inputs, sequence_length)

  def _CreateRnnGraph(self, create_rnn_computation_func, cell, tf_inputs,
                      tf_sequence_length, is_bidirectional,
                      initial_state=None, time_major=None, scope=None):
    if is_bidirectional:
      tf_result = create_rnn_computation_func(
          cell_fw=cell, cell_bw=cell, inputs=tf_inputs,
          sequence_length=tf_sequence_length, dtype=tf.float32,
          time_major=time_major, scope=scope)
    else:
      tf_result = create_rnn_computation_func(
          cell=cell, inputs=tf_inputs, sequence_length=tf_sequence_length,
          initial_state=initial_state, dtype=tf.float32,
          time_major=time_major, scope=scope)
    grad = tf.gradients(tf_result, v1.trainable_variables())
    return {"inference": tf_result, "grad": grad}

  def _MaybeResetVariables(self, variable_cache, sess, var_list):
    """Sets the variables to the values seen first under the same name."""
    reset_ops = []
    fetches = []
    for var in var_list:
      if var.name in variable_cache:
        reset_ops += [var.assign(variable_cache[var.name])]
      else:
        fetches += [(var.name, var)]
    if reset_ops:
      sess.run(reset_ops)
    if fetches:
      val = sess.run(dict(fetches))
      for n, v in val.items():
        assert n not in variable_cache
        variable_cache[n] = v

  def _RunRnn(self, numpy_inputs, numpy_slen, cell_name, variable_cache,
              is_dynamic, time_major=None, is_bidirectional=False):
    with tf.Graph().as_default() as graph:
      tf_inputs = v1.placeholder(tf.float32, shape=numpy_inputs.shape)
      tf_slen = v1.placeholder(tf.int32)
      feeds = {tf_inputs: numpy_inputs, tf_slen: numpy_slen}
      cell = self._CreateCell(cell_name)
      if is_dynamic:
        fn = (v1.nn.bidirectional_dynamic_rnn if is_bidirectional
              else v1.nn.dynamic_rnn)
      else:
        fn = (functional_rnn.bidirectional_functional_rnn if is_bidirectional
              else functional_rnn.functional_rnn)
      fetches = self._CreateRnnGraph(fn, cell, tf_inputs, tf_slen,
                                     is_bidirectional, time_major=time_major)
      with self.session(graph=graph) as sess:
        sess.run(v1.global_variables_initializer())
        self._MaybeResetVariables(variable_cache, sess,
                                  v1.trainable_variables())
        val = sess.run(fetches, feed_dict=feeds)
      return graph.as_graph_def(), val

  def testRunLstm(self):
    """Runs a simple LSTM. Does not check output."""
    np_inputs, np_slen = self._CreateInputs()
    self._RunRnn(np_inputs, np_slen, "lstm", {}, False)

  def _check_against_dynamic(self, cell_name, time_major=None):
    np_inputs, np_slen = self._CreateInputs(time_major=bool(time_major))
    var_cache = {}
    args = [np_inputs, np_slen, cell_name, var_cache]
    _, func_rnn = self._RunRnn(*(args + [False]), time_major=time_major)
    _, dyn_rnn = self._RunRnn(*(args + [True]), time_major=time_major)
    self.assertAllClose(dyn_rnn["inference"], func_rnn["inference"])
    self.assertAllClose(dyn_rnn["grad"], func_rnn["grad"])

  def testLstm(self):
    self._check_against_dynamic("lstm")

  def testGru(self):
    self._check_against_dynamic("gru")

  def testStackedLstm(self):
    self._check_against_dynamic("stacked_lstm")

  def testLstmWithTimeMajorInputs(self):
    self._check_against_dynamic("lstm", time_major=True)

  def testBidirectionalLstmWithTimeMajorInputs(self):
    time_major = True
    np_inputs, np_slen = self._CreateInputs(time_major)
    var_cache = {}
    args = [np_inputs, np_slen, "lstm", var_cache]
    _, func_rnn = self._RunRnn(*(args + [False]), time_major=time_major,
                               is_bidirectional=True)
    _, dyn_rnn = self._RunRnn(*(args + [True]), time_major=time_major,
                              is_bidirectional=True)
    self.assertAllClose(dyn_rnn["inference"], func_rnn["inference"])
    # The original leaves the gradients unchecked (b/112170761).

  def testBidirectionalLstm(self):
    """Time-major and batch-major runs agree."""
    time_major_inputs, np_slen = self._CreateInputs(True)
    batch_major_inputs = np.transpose(time_major_inputs, [1, 0, 2])
    var_cache = {}
    args = [np_slen, "lstm", var_cache, False]
    _, time_major_rnn = self._RunRnn(*([time_major_inputs] + args),
                                     time_major=True, is_bidirectional=True)
    _, batch_major_rnn = self._RunRnn(*([batch_major_inputs] + args),
                                      time_major=False, is_bidirectional=True)
    outputs, state = batch_major_rnn["inference"]
    outputs = [np.transpose(x, [1, 0, 2]) for x in outputs]
    batch_major_rnn["inference"] = [outputs, state]
    self.assertAllClose(time_major_rnn["inference"],
                        batch_major_rnn["inference"])
    self.assertAllClose(time_major_rnn["grad"], batch_major_rnn["grad"])

  def testBidirectionalLstmWithSymmetricInputs(self):
    """With symmetric inputs time-major and batch-major runs agree."""
    np_inputs, np_slen = self._CreateSymmetricInputs()
    var_cache = {}
    args = [np_inputs, np_slen, "lstm", var_cache]
    runs = {}
    for is_dynamic in (False, True):
      for time_major in (True, False):
        runs[is_dynamic, time_major] = self._RunRnn(
            *(args + [is_dynamic]), time_major=time_major,
            is_bidirectional=True)[1]
    for a, b in (((False, True), (False, False)), ((True, True), (True, False)),
                 ((False, True), (True, False))):
      self.assertAllClose(runs[a]["inference"], runs[b]["inference"])
      self.assertAllClose(runs[a]["grad"], runs[b]["grad"])


class FunctionalRnnKeras3Test(PeerTestCase):
  """testGru and testStackedLstm with Keras 3 cells, in one TF1 graph (one
  cell, so one set of weights), tf.compat.v1.nn.dynamic_rnn given the
  initial state as its reference."""

  def _check(self, make_cell, time_major):
    np.random.seed(0)
    batch, steps, depth = 3, 5, 11
    shape = [steps, batch, depth] if time_major else [batch, steps, depth]
    np_inputs = np.random.random(shape)
    np_slen = np.random.randint(0, high=steps - 1, size=batch, dtype=int)
    with self.session(graph=tf.Graph()) as sess:
      tf_inputs = v1.placeholder(tf.float32, shape=np_inputs.shape)
      tf_slen = v1.placeholder(tf.int32)
      cell = make_cell()
      state0 = tf.nest.map_structure(lambda s: tf.zeros([batch, s]),
                                     cell.state_size)
      if not tf.nest.is_nested(state0):
        state0 = [state0]
      ours = functional_rnn.functional_rnn(
          cell, tf_inputs, tf_slen, dtype=tf.float32, time_major=time_major)
      theirs = v1.nn.dynamic_rnn(cell, tf_inputs, tf_slen,
                                 initial_state=state0, time_major=time_major)
      results = []
      for outputs, state in (ours, theirs):
        flat = [outputs] + tf.nest.flatten(state)
        results.append(flat + tf.gradients(flat, cell.trainable_variables))
      sess.run(v1.global_variables_initializer())
      ours, theirs = sess.run(results, {tf_inputs: np_inputs,
                                        tf_slen: np_slen})
    self.assertAllClose(ours, theirs)

  @test_util.run_deprecated_v1
  def testGru(self):
    self._check(lambda: keras.layers.GRUCell(7), time_major=False)

  @test_util.run_deprecated_v1
  def testStackedLstmWithTimeMajorInputs(self):
    self._check(lambda: keras.layers.StackedRNNCells(
        [keras.layers.LSTMCell(7) for _ in range(3)]), time_major=True)
