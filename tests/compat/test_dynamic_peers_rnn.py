"""TensorFlow's tensorflow/python/kernel_tests/nn_ops/rnn_test.py (commit
0fe08f44ef04f55b49b4069754ed43a265fba2c0), the cases that call dynamic_rnn,
run against tf_recurrent.dynamic_rnn: each case's name, logic, shapes, seeds
and tolerances kept, in the modes its decorators name (run_v1_only becomes
run_deprecated_v1: a TF1 graph with a Session). The cells are the
original's, on tf_keras's legacy RNNCell (tests/compat/tf_peers.py).

Not ported (they call no function of ours): testCellGetInitialState,
testCellsBuild, testBasicLSTMCellInterchangeWithLSTMCell, the benchmarks.
"""

import gc

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context
from tensorflow.python.framework import test_util

from tf_recurrent import dynamic_rnn
from tf_peers import (CallPlus1RNNCell, ScalarStateRNNCell, SeededTestCase,
                      TensorArrayStateRNNCell, UnbalancedOutputRNNCell,
                      rnn_cell, unittest_result_lists)


class RNNTest(SeededTestCase):

  @test_util.run_in_graph_and_eager_modes
  def testInvalidSequenceLengthShape(self):
    cell = CallPlus1RNNCell()
    if tf.executing_eagerly():
      inputs = [tf.constant(np.ones((3, 4)))]
    else:
      inputs = [tf.compat.v1.placeholder(tf.float32, shape=(3, 4))]
    with self.assertRaisesRegex(ValueError, "must be a vector"):
      dynamic_rnn(cell, tf.stack(inputs), dtype=tf.float32,
                  sequence_length=[[4]])

  @test_util.run_in_graph_and_eager_modes
  def testInvalidDtype(self):
    if tf.executing_eagerly():
      inputs = np.zeros((3, 4, 5), dtype=np.int32)
    else:
      inputs = tf.compat.v1.placeholder(tf.int32, shape=(3, 4, 5))
    for cell_cls in (rnn_cell.BasicRNNCell, rnn_cell.GRUCell,
                     rnn_cell.BasicLSTMCell, rnn_cell.LSTMCell):
      with self.cached_session():
        with self.assertRaisesRegex(ValueError,
                                    "RNN cell only supports floating"):
          cell = cell_cls(2, dtype=tf.int32)
          dynamic_rnn(cell, inputs, dtype=tf.int32)

  @test_util.run_in_graph_and_eager_modes
  def testBatchSizeFromInput(self):
    cell = CallPlus1RNNCell()
    in_eager_mode = tf.executing_eagerly()
    if in_eager_mode:
      inputs = np.zeros((3, 4, 5), dtype=np.float32)
      initial_state = np.zeros((3, 5), dtype=np.float32)
    else:
      inputs = tf.compat.v1.placeholder(tf.float32, shape=(3, 4, 5))
      initial_state = tf.compat.v1.placeholder(tf.float32, shape=(3, 5))
    outputs, state = dynamic_rnn(cell, inputs, dtype=tf.float32)
    self.assertEqual(3, outputs.shape[0])
    self.assertEqual(3, state.shape[0])
    outputs, state = dynamic_rnn(cell, inputs, initial_state=initial_state)
    self.assertEqual(3, outputs.shape[0])
    self.assertEqual(3, state.shape[0])
    if not in_eager_mode:
      inputs = tf.compat.v1.placeholder(tf.float32, shape=(None, 4, 5))
      outputs, state = dynamic_rnn(cell, inputs, dtype=tf.float32)
      self.assertEqual(None, outputs.shape.dims[0].value)
      self.assertEqual(None, state.shape.dims[0].value)
      outputs, state = dynamic_rnn(
          cell, inputs,
          initial_state=tf.compat.v1.placeholder(tf.float32, shape=(None, 5)))
      self.assertEqual(None, outputs.shape.dims[0].value)
      self.assertEqual(None, state.shape.dims[0].value)

  def _run_1234(self, cell, stack_state=False):
    """The scalar/unbalanced/TensorArray cases' run on [[[1], [2], [3],
    [4]]]: eagerly, or fed to a placeholder in the test's session."""
    feed = [[[1], [2], [3], [4]]]
    if tf.executing_eagerly():
      inputs = np.array(feed, dtype=np.float32)
    else:
      inputs = tf.compat.v1.placeholder(tf.float32, shape=(1, 4, 1))
    with self.cached_session() as sess:
      outputs, state = dynamic_rnn(cell, inputs, dtype=tf.float32,
                                   sequence_length=[4])
      if stack_state:
        state = (state[0], state[1].stack())
      if not tf.executing_eagerly():
        outputs, state = sess.run([outputs, state], feed_dict={inputs: feed})
    return outputs, state

  @test_util.run_in_graph_and_eager_modes
  def testScalarStateIsAccepted(self):
    outputs, state = self._run_1234(ScalarStateRNNCell())
    self.assertAllEqual([[[1], [2], [3], [4]]], outputs)
    self.assertAllEqual(4, state)

  @test_util.run_in_graph_and_eager_modes
  def testUnbalancedOutputIsAccepted(self):
    outputs, state = self._run_1234(UnbalancedOutputRNNCell())
    self.assertIsInstance(outputs, tuple)
    self.assertAllEqual([[[1], [2], [3], [4]]], outputs[0])
    self.assertAllEqual([[[1, 1], [2, 2], [3, 3], [4, 4]]], outputs[1])
    self.assertAllEqual(4, state)

  def testEagerMemory(self):
    unittest_result_lists(self)
    # The check collects and lists every object gc tracks, twice each: on
    # the heap of a worker that ran many test files before, 27 s. Frozen,
    # the objects alive before it are neither collected nor listed (the
    # counts before and after leave them out alike); what the runs leave
    # behind still is.
    gc.freeze()
    try:
      self._eager_memory()
    finally:
      gc.unfreeze()

  @test_util.assert_no_new_pyobjects_executing_eagerly()
  def _eager_memory(self):
    with context.eager_mode():
      cell = TensorArrayStateRNNCell()
      inputs = np.array([[[1], [2], [3], [4]]], dtype=np.float32)
      dynamic_rnn(cell, inputs, dtype=tf.float32, sequence_length=[4])

  @test_util.run_in_graph_and_eager_modes
  def testTensorArrayStateIsAccepted(self):
    outputs, state = self._run_1234(TensorArrayStateRNNCell(),
                                    stack_state=True)
    self.assertAllEqual([[[1], [2], [3], [4]]], outputs)
    self.assertAllEqual(4, state[0])
    self.assertAllEqual([[[1]], [[2]], [[3]], [[4]]], state[1])
