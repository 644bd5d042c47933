"""TensorFlow's tensorflow/python/kernel_tests/nn_ops/rnn_cell_test.py (commit
198c80751ab4b95c628d1f05cefc79ea0c6f4358), the cases that call dynamic_rnn,
bidirectional_dynamic_rnn or raw_rnn, run against tf_recurrent's: each
case's name, logic, shapes, seeds and tolerances kept (assertAllEqual stays
exact), in the modes its decorators name (run_v1_only becomes
run_deprecated_v1: a TF1 graph with a Session), with tf_keras's legacy cells
(tests/compat/tf_peers.py). static_rnn, static_bidirectional_rnn and
static_state_saving_rnn, the references, stay tf.compat.v1.nn's.

Not ported: the cases that call none of these functions; and the four
GPU-only cases (TensorArrayOnCorrectDeviceTest's three and
testDeviceWrapperDynamicExecutionNodesAreAllProperlyLocated), which return
without a GPU and otherwise assert where TensorFlow's own while loop places
its TensorArrayWrite/Read/Scatter/Gather nodes, ops our loops do not make.
"""

import itertools

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import random_seed
from tensorflow.python.framework import test_util

from tf_recurrent import bidirectional_dynamic_rnn, dynamic_rnn, raw_rnn
from tf_peers import (DropoutWrapper, DummyMultiDimensionalLSTM,
                      NestedRNNCell, PeerTestCase, SeededTestCase,
                      TestStateSaver, check_scope, rnn_cell)

nn = tf.compat.v1.nn
v1 = tf.compat.v1


def _uniform(seed):
  return v1.random_uniform_initializer(-0.01, 0.01, seed=seed)


class LSTMTest(SeededTestCase):

  @test_util.run_deprecated_v1
  def testDynamicRNNAllowsUnknownTimeDimension(self):
    inputs = v1.placeholder(tf.float32, shape=[1, None, 20])
    cell = rnn_cell.GRUCell(30)
    dynamic_rnn(cell, inputs, dtype=tf.float32)

  def _tuple_states_inputs(self, batch_size, input_size, max_length):
    if not tf.executing_eagerly():
      return max_length * [v1.placeholder(tf.float32, shape=(None, input_size))]
    return max_length * [tf.constant(
        np.random.randn(batch_size, input_size).astype(np.float32))]

  def _compare_static_dynamic(self, sess, inputs, batch_size, input_size,
                              static, dynamic, flatten_state):
    """The tuple-state cases' comparison: exact (assertAllEqual)."""
    (outputs_static, state_static), (outputs_dynamic, state_dynamic) = (
        static, dynamic)
    in_graph_mode = not tf.executing_eagerly()
    if in_graph_mode:
      v1.global_variables_initializer().run()
      input_value = np.random.randn(batch_size, input_size)
      feed = {inputs[0]: input_value}
      outputs_static = sess.run(outputs_static, feed_dict=feed)
      outputs_dynamic = sess.run(outputs_dynamic, feed_dict=feed)
      fetch = tf.nest.flatten if flatten_state else (lambda s: s)
      state_static = sess.run(fetch(state_static), feed_dict=feed)
      state_dynamic = sess.run(fetch(state_dynamic), feed_dict=feed)
    comparison_fn = self.assertAllEqual
    if test_util.is_xla_enabled():
      comparison_fn = self.assertAllClose
    if in_graph_mode:
      comparison_fn(outputs_static, outputs_dynamic)
    else:
      self.assertAllEqual(tf.stack(outputs_static), outputs_dynamic)
      if flatten_state:
        state_static = tf.nest.flatten(state_static)
        state_dynamic = tf.nest.flatten(state_dynamic)
    comparison_fn(np.hstack(state_static), np.hstack(state_dynamic))

  @test_util.run_in_graph_and_eager_modes
  def testDynamicRNNWithTupleStates(self):
    num_units, input_size, batch_size, num_proj, max_length = 3, 5, 2, 4, 8
    sequence_length = [4, 6]
    with self.session(graph=tf.Graph()) as sess:
      initializer = _uniform(self._seed)
      inputs = self._tuple_states_inputs(batch_size, input_size, max_length)
      inputs_c = tf.stack(inputs)
      cell = rnn_cell.LSTMCell(num_units, use_peepholes=True,
                               num_proj=num_proj, initializer=initializer,
                               state_is_tuple=True)
      with v1.variable_scope("root") as scope:
        static = nn.static_rnn(cell, inputs, dtype=tf.float32,
                               sequence_length=sequence_length, scope=scope)
        scope.reuse_variables()
        dynamic = dynamic_rnn(cell, inputs_c, dtype=tf.float32,
                              time_major=True,
                              sequence_length=sequence_length, scope=scope)
      for state in (static[1], dynamic[1]):
        self.assertIsInstance(state, rnn_cell.LSTMStateTuple)
        self.assertIs(state[0], state.c)
        self.assertIs(state[1], state.h)
      self._compare_static_dynamic(sess, inputs, batch_size, input_size,
                                   static, dynamic, flatten_state=False)

  @test_util.run_in_graph_and_eager_modes
  def testDynamicRNNWithNestedTupleStates(self):
    num_units, input_size, batch_size, num_proj, max_length = 3, 5, 2, 4, 8
    sequence_length = [4, 6]
    with self.session(graph=tf.Graph()) as sess:
      initializer = _uniform(self._seed)
      inputs = self._tuple_states_inputs(batch_size, input_size, max_length)
      inputs_c = tf.stack(inputs)

      def _cell(i):
        return rnn_cell.LSTMCell(num_units + i, use_peepholes=True,
                                 num_proj=num_proj + i,
                                 initializer=initializer, state_is_tuple=True)

      cell = rnn_cell.MultiRNNCell([_cell(i) for i in range(4)],
                                   state_is_tuple=True)
      self.assertEqual(len(cell.state_size), 4)
      for i in range(4):
        self.assertEqual(len(cell.state_size[i]), 2)
      test_zero = cell.zero_state(1, tf.float32)
      self.assertEqual(len(test_zero), 4)
      for i in range(4):
        self.assertEqual(test_zero[i][0].get_shape()[1], cell.state_size[i][0])
        self.assertEqual(test_zero[i][1].get_shape()[1], cell.state_size[i][1])
      with v1.variable_scope("root") as scope:
        static = nn.static_rnn(cell, inputs, dtype=tf.float32,
                               sequence_length=sequence_length, scope=scope)
        scope.reuse_variables()
        dynamic = dynamic_rnn(cell, inputs_c, dtype=tf.float32,
                              time_major=True,
                              sequence_length=sequence_length, scope=scope)
      self._compare_static_dynamic(sess, inputs, batch_size, input_size,
                                   static, dynamic, flatten_state=True)

  @test_util.run_deprecated_v1
  def testTF1GraphsExact(self):
    """Issue 49 kind 6, the TF1-graph half of the two cases above: a legacy
    cell's step runs without an XLA cluster, so dynamic_rnn equals
    static_rnn bit for bit (their tuple states, then nested ones)."""
    input_size, batch_size, max_length = 5, 2, 8
    with self.session(graph=tf.Graph()) as sess:
      inputs = max_length * [v1.placeholder(tf.float32,
                                            shape=(None, input_size))]
      cells = [rnn_cell.LSTMCell(3 + i, use_peepholes=True, num_proj=4 + i,
                                 initializer=_uniform(self._seed))
               for i in range(5)]
      pairs = []
      for name, cell in (("tuple", cells[0]),
                         ("nested", rnn_cell.MultiRNNCell(cells[1:]))):
        with v1.variable_scope(name) as scope:
          static = nn.static_rnn(cell, inputs, dtype=tf.float32,
                                 sequence_length=[4, 6], scope=scope)
          scope.reuse_variables()
          pairs.append((static, dynamic_rnn(
              cell, tf.stack(inputs), dtype=tf.float32, time_major=True,
              sequence_length=[4, 6], scope=scope)))
      v1.global_variables_initializer().run()
      values = sess.run(pairs, {inputs[0]: np.random.randn(batch_size,
                                                           input_size)})
    for static, dynamic in values:
      self.assertAllEqual(static[0], dynamic[0])  # The outputs.
      for a, b in zip(tf.nest.flatten(static[1]), tf.nest.flatten(dynamic[1])):
        self.assertAllEqual(a, b)

  def _testDynamicEquivalentToStaticRNN(self, use_sequence_length):
    time_steps, num_units, num_proj, input_size, batch_size = 8, 3, 4, 5, 2
    input_values = np.random.randn(time_steps, batch_size,
                                   input_size).astype(np.float32)
    sequence_length = (np.random.randint(0, time_steps, size=batch_size)
                       if use_sequence_length else None)
    in_graph_mode = not tf.executing_eagerly()

    def make_cell():
      return rnn_cell.LSTMCell(num_units, use_peepholes=True,
                               initializer=_uniform(self._seed),
                               num_proj=num_proj, state_is_tuple=False)

    if not in_graph_mode:  # Eager ignores op seeds: one cell for both.
      cell = make_cell()

    def readouts(concat_inputs, outputs, state):
      """Gradients of the sum and of single outputs w.r.t. the inputs and
      the variables; run in the session with the values."""
      gradients = tf.gradients(outputs + [state], [concat_inputs])
      trainable_variables = v1.get_collection(
          v1.GraphKeys.TRAINABLE_VARIABLES)
      assert len(trainable_variables) > 1
      # Each single output's gradients, TensorFlow's two tf.gradients (the
      # inputs', the variables') as one: one backward graph per output.
      per_output = [tf.gradients(y, [concat_inputs] + trainable_variables)
                    for y in [outputs[0], outputs[-1], state]]
      individual = tf.nest.flatten([grads[:1] for grads in per_output])
      variable_grads = tf.nest.flatten([grads[1:] for grads in per_output])
      feeds = {concat_inputs: input_values}
      v1.global_variables_initializer().run(feed_dict=feeds)
      sess = v1.get_default_session()
      # One run for TensorFlow's five (the same fetches and numbers): each
      # new set of fetches prunes and optimizes the graph anew, a third of
      # the test's time.
      return sess.run((outputs, state, gradients, individual, variable_grads),
                      feed_dict=feeds)

    def concat_placeholder():
      if in_graph_mode:
        return v1.placeholder(tf.float32,
                              shape=(time_steps, batch_size, input_size))
      return tf.constant(input_values)

    with self.session(graph=tf.Graph()):
      concat_inputs = concat_placeholder()
      inputs = tf.unstack(concat_inputs)
      if in_graph_mode:
        cell = make_cell()
      with v1.variable_scope("dynamic_scope"):
        outputs_static, state_static = nn.static_rnn(
            cell, inputs, sequence_length=sequence_length, dtype=tf.float32)
      if in_graph_mode:
        static = readouts(concat_inputs, outputs_static, state_static)

    with self.session(graph=tf.Graph()):
      concat_inputs = concat_placeholder()
      if in_graph_mode:
        cell = make_cell()
      with v1.variable_scope("dynamic_scope"):
        outputs_dynamic, state_dynamic = dynamic_rnn(
            cell, inputs=concat_inputs, sequence_length=sequence_length,
            time_major=True, dtype=tf.float32)
        split_outputs_dynamic = tf.unstack(outputs_dynamic, time_steps)
      if in_graph_mode:
        dynamic = readouts(concat_inputs, split_outputs_dynamic,
                           state_dynamic)

    if not in_graph_mode:
      static = (outputs_static, state_static)
      dynamic = (split_outputs_dynamic, state_dynamic)
    self.assertEqual(len(static[0]), len(dynamic[0]))
    for value_static, value_dynamic in zip(static[0], dynamic[0]):
      self.assertAllClose(value_static, value_dynamic)
    self.assertAllClose(static[1], dynamic[1])
    if in_graph_mode:
      self.assertAllClose(static[2], dynamic[2])
      for i in (3, 4):
        self.assertEqual(len(static[i]), len(dynamic[i]))
        for a, b in zip(static[i], dynamic[i]):
          self.assertAllClose(a, b)

  @test_util.run_in_graph_and_eager_modes
  def testDynamicEquivalentToStaticRNN(self):
    self._testDynamicEquivalentToStaticRNN(use_sequence_length=False)

  @test_util.run_in_graph_and_eager_modes
  def testDynamicEquivalentToStaticRNNWithSequenceLength(self):
    self._testDynamicEquivalentToStaticRNN(use_sequence_length=True)


class BidirectionalRNNTest(SeededTestCase):

  def _createBidirectionalDynamicRNN(self, use_shape, use_state_tuple,
                                     use_time_major, use_sequence_length,
                                     scope=None):
    num_units, input_size, batch_size, max_length = 3, 5, 2, 8
    initializer = _uniform(self._seed)
    sequence_length = (v1.placeholder(tf.int64) if use_sequence_length
                       else None)
    cell_fw = rnn_cell.LSTMCell(num_units, initializer=initializer,
                                state_is_tuple=use_state_tuple)
    cell_bw = rnn_cell.LSTMCell(num_units, initializer=initializer,
                                state_is_tuple=use_state_tuple)
    inputs = max_length * [v1.placeholder(
        tf.float32, shape=(batch_size if use_shape else None, input_size))]
    inputs_c = tf.stack(inputs)
    if not use_time_major:
      inputs_c = tf.transpose(inputs_c, [1, 0, 2])
    outputs, states = bidirectional_dynamic_rnn(
        cell_fw, cell_bw, inputs_c, sequence_length, dtype=tf.float32,
        time_major=use_time_major, scope=scope)
    outputs = tf.concat(outputs, 2)
    state_fw, state_bw = states
    outputs_shape = [None, max_length, 2 * num_units]
    if use_shape:
      outputs_shape[0] = batch_size
    if use_time_major:
      outputs_shape[0], outputs_shape[1] = outputs_shape[1], outputs_shape[0]
    self.assertEqual(outputs.get_shape().as_list(), outputs_shape)
    input_value = np.random.randn(batch_size, input_size)
    return input_value, inputs, outputs, state_fw, state_bw, sequence_length

  def _testBidirectionalDynamicRNN(self, use_shape, use_state_tuple,
                                   use_time_major, use_sequence_length):
    with self.session(graph=tf.Graph()) as sess:
      input_value, inputs, outputs, state_fw, state_bw, sequence_length = (
          self._createBidirectionalDynamicRNN(
              use_shape, use_state_tuple, use_time_major, use_sequence_length))
      v1.global_variables_initializer().run()
      feed_dict = {sequence_length: [2, 3]} if use_sequence_length else {}
      feed_dict.update({inputs[0]: input_value})
      if use_state_tuple:
        out, c_fw, m_fw, c_bw, m_bw = sess.run(
            [outputs, state_fw[0], state_fw[1], state_bw[0], state_bw[1]],
            feed_dict=feed_dict)
        s_fw, s_bw = (c_fw, m_fw), (c_bw, m_bw)
      else:
        out, s_fw, s_bw = sess.run([outputs, state_fw, state_bw],
                                   feed_dict=feed_dict)
      # Both directions have the same weights: the backward outputs are the
      # forward ones reversed in time (depth 0:3 forward, 3:6 backward).
      if not use_time_major:
        out = np.swapaxes(out, 0, 1)
      if use_sequence_length:
        for b, length in ((0, 2), (1, 3)):
          for t in range(length):
            for d in range(3):
              self.assertEqual(out[t][b][d], out[length - 1 - t][b][3 + d])
        self.assertAllClose(s_fw, s_bw)
      else:
        max_length = 8
        for t in range(max_length):
          self.assertAllEqual(out[t, :, 0:3], out[max_length - t - 1, :, 3:6])
        self.assertAllClose(s_fw, s_bw)

  @test_util.run_deprecated_v1
  def testBidirectionalDynamicRNN(self):
    for option in itertools.product([True, False], repeat=4):
      self._testBidirectionalDynamicRNN(
          use_shape=option[0], use_state_tuple=option[1],
          use_time_major=option[2], use_sequence_length=option[3])

  @test_util.run_deprecated_v1
  def testBidirectionalDynamicRNNScope(self):

    def get_factory(use_time_major):

      def factory(scope):
        return self._createBidirectionalDynamicRNN(
            use_shape=True, use_state_tuple=True, use_sequence_length=True,
            use_time_major=use_time_major, scope=scope)

      return factory

    for use_time_major in (True, False):
      factory = get_factory(use_time_major)
      check_scope(self, factory, "bidirectional_rnn", use_outer_scope=True)
      check_scope(self, factory, "bidirectional_rnn", use_outer_scope=False)
      check_scope(self, factory, "bidirectional_rnn", prefix=None,
                  use_outer_scope=False)


def _assert_all_containers_equal(test, sess, feed, feed_dim, outputs, states,
                                 dynamic_as_static, concat_axis):
  """The multi-dimensional and nested cases' checks, exact: static_rnn's
  outputs and final state equal dynamic_rnn's, static_state_saving_rnn's
  and static_bidirectional_rnn's (both directions concatenated)."""
  outputs_static, outputs_dynamic, outputs_bid, outputs_sav = outputs
  outputs_static_v = sess.run(outputs_static, feed_dict=feed)
  test.assertAllEqual(
      outputs_static_v,
      dynamic_as_static(sess.run(outputs_dynamic, feed_dict=feed)))
  test.assertAllEqual(outputs_static_v,
                      sess.run(outputs_sav, feed_dict=feed_dim))
  outputs_static_array = np.array(outputs_static_v)
  test.assertAllEqual(
      np.concatenate((outputs_static_array, outputs_static_array),
                     axis=concat_axis),
      np.array(sess.run(outputs_bid, feed_dict=feed_dim)))
  state_static, state_dynamic, state_fw, state_bw, state_sav = states
  state_static_v = sess.run(state_static, feed_dict=feed)
  for other, other_feed in ((state_dynamic, feed), (state_sav, feed_dim),
                            (state_fw, feed_dim), (state_bw, feed_dim)):
    test.assertAllEqual(np.hstack(state_static_v),
                        np.hstack(sess.run(other, feed_dict=other_feed)))


class MultiDimensionalLSTMTest(SeededTestCase):

  @test_util.run_deprecated_v1
  def testMultiDimensionalLSTMAllRNNContainers(self):
    feature_dims = (3, 4, 5)
    input_size = feature_dims
    batch_size, max_length, sequence_length = 2, 8, [4, 6]
    with self.session(graph=tf.Graph()) as sess:
      inputs = max_length * [
          v1.placeholder(tf.float32, shape=(None,) + input_size)]
      inputs_using_dim = max_length * [
          v1.placeholder(tf.float32, shape=(batch_size,) + input_size)]
      inputs_c = tf.stack(inputs)
      cell = DummyMultiDimensionalLSTM(feature_dims)  # No variables.
      state_saver = TestStateSaver(batch_size, input_size)
      outputs_static, state_static = nn.static_rnn(
          cell, inputs, dtype=tf.float32, sequence_length=sequence_length)
      outputs_dynamic, state_dynamic = dynamic_rnn(
          cell, inputs_c, dtype=tf.float32, time_major=True,
          sequence_length=sequence_length)
      outputs_bid, state_fw, state_bw = nn.static_bidirectional_rnn(
          cell, cell, inputs_using_dim, dtype=tf.float32,
          sequence_length=sequence_length)
      outputs_sav, state_sav = nn.static_state_saving_rnn(
          cell, inputs_using_dim, sequence_length=sequence_length,
          state_saver=state_saver, state_name=("h", "c"))
      self.assertEqual(outputs_dynamic.get_shape().as_list(),
                       inputs_c.get_shape().as_list())
      for out, inp in zip(outputs_static, inputs):
        self.assertEqual(out.get_shape().as_list(), inp.get_shape().as_list())
      for out, inp in zip(outputs_bid, inputs_using_dim):
        input_shape_list = inp.get_shape().as_list()
        input_shape_list[1] *= 2
        self.assertEqual(out.get_shape().as_list(), input_shape_list)

      v1.global_variables_initializer().run()
      input_value = np.random.randn(*((batch_size,) + input_size))
      _assert_all_containers_equal(
          self, sess, {inputs[0]: input_value},
          {inputs_using_dim[0]: input_value},
          (outputs_static, outputs_dynamic, outputs_bid, outputs_sav),
          (state_static, state_dynamic, state_fw, state_bw, state_sav),
          lambda dynamic: dynamic, concat_axis=2)


class NestedLSTMTest(SeededTestCase):

  @test_util.run_deprecated_v1
  def testNestedIOLSTMAllRNNContainers(self):
    input_size, batch_size, state_size, max_length = 5, 2, 6, 8
    sequence_length = [4, 6]
    with self.session(graph=tf.Graph()) as sess:
      state_saver = TestStateSaver(batch_size, state_size)
      single_input = (v1.placeholder(tf.float32, shape=(None, input_size)),
                      v1.placeholder(tf.float32, shape=(None, input_size)))
      inputs = max_length * [single_input]
      inputs_c = (tf.stack([input_[0] for input_ in inputs]),
                  tf.stack([input_[1] for input_ in inputs]))
      single_input_using_dim = (
          v1.placeholder(tf.float32, shape=(batch_size, input_size)),
          v1.placeholder(tf.float32, shape=(batch_size, input_size)))
      inputs_using_dim = max_length * [single_input_using_dim]
      cell = NestedRNNCell()  # No variables.
      outputs_dynamic, state_dynamic = dynamic_rnn(
          cell, inputs_c, dtype=tf.float32, time_major=True,
          sequence_length=sequence_length)
      outputs_static, state_static = nn.static_rnn(
          cell, inputs, dtype=tf.float32, sequence_length=sequence_length)
      outputs_bid, state_fw, state_bw = nn.static_bidirectional_rnn(
          cell, cell, inputs_using_dim, dtype=tf.float32,
          sequence_length=sequence_length)
      outputs_sav, state_sav = nn.static_state_saving_rnn(
          cell, inputs_using_dim, sequence_length=sequence_length,
          state_saver=state_saver, state_name=("h", "c"))

      def _assert_same_shape(input1, input2, double=False):
        for inp1, inp2 in zip(tf.nest.flatten(input1),
                              tf.nest.flatten(input2)):
          input_shape = inp1.get_shape().as_list()
          if double:
            input_shape[1] *= 2
          self.assertEqual(input_shape, inp2.get_shape().as_list())

      _assert_same_shape(inputs_c, outputs_dynamic)
      _assert_same_shape(inputs, outputs_static)
      _assert_same_shape(inputs_using_dim, outputs_sav)
      _assert_same_shape(inputs_using_dim, outputs_bid, double=True)

      v1.global_variables_initializer().run()
      input_value = (np.random.randn(batch_size, input_size),
                     np.random.randn(batch_size, input_size))
      _assert_all_containers_equal(
          self, sess, {single_input: input_value},
          {single_input_using_dim: input_value},
          (outputs_static, outputs_dynamic, outputs_bid, outputs_sav),
          (state_static, state_dynamic, state_fw, state_bw, state_sav),
          lambda dynamic: np.transpose(dynamic, (1, 0, 2, 3)), concat_axis=3)


class GRUTest(SeededTestCase):

  @test_util.run_deprecated_v1
  def testDynamic(self):
    time_steps, num_units, input_size, batch_size = 8, 3, 5, 2
    input_values = np.random.randn(time_steps, batch_size, input_size)
    sequence_length = np.random.randint(0, time_steps, size=batch_size)
    with self.session(graph=tf.Graph()) as sess:
      concat_inputs = v1.placeholder(
          tf.float32, shape=(time_steps, batch_size, input_size))
      cell = rnn_cell.GRUCell(num_units=num_units)
      with v1.variable_scope("dynamic_scope"):
        outputs_dynamic, state_dynamic = dynamic_rnn(
            cell, inputs=concat_inputs, sequence_length=sequence_length,
            time_major=True, dtype=tf.float32)
      feeds = {concat_inputs: input_values}
      v1.global_variables_initializer().run(feed_dict=feeds)
      sess.run([outputs_dynamic, state_dynamic], feed_dict=feeds)

  @test_util.run_deprecated_v1
  def testDynamicScope(self):
    time_steps, num_units, input_size, batch_size = 8, 3, 5, 2
    sequence_length = np.random.randint(0, time_steps, size=batch_size)

    def factory(scope):
      concat_inputs = v1.placeholder(
          tf.float32, shape=(time_steps, batch_size, input_size))
      cell = rnn_cell.GRUCell(num_units=num_units)
      return dynamic_rnn(cell, inputs=concat_inputs,
                         sequence_length=sequence_length, time_major=True,
                         dtype=tf.float32, scope=scope)

    check_scope(self, factory, "rnn", use_outer_scope=True)
    check_scope(self, factory, "rnn", use_outer_scope=False)
    check_scope(self, factory, "rnn", prefix=None, use_outer_scope=False)


def _raw_inputs_loop_fn(cell, inputs_ta, batch_size, input_depth, finished_at,
                        loop_state_fn=None, emit_fn=None):
  """The RawRNNTest cases' loop_fn: zero state at time 0, then the cell's;
  the next input read from `inputs_ta` (zeros once every example is done);
  `finished_at(time)` the [batch] finished flags."""

  def loop_fn(time_, cell_output, cell_state, loop_state):
    emit_output = cell_output if emit_fn is None else emit_fn(cell_output)
    if cell_output is None:
      next_state = cell.zero_state(batch_size, tf.float32)
    else:
      next_state = cell_state
    if loop_state_fn is not None:
      loop_state = loop_state_fn(time_, cell_output, loop_state)
    elements_finished = finished_at(time_)
    finished = tf.reduce_all(elements_finished)
    next_input = tf.cond(
        finished,
        lambda: tf.zeros([batch_size, input_depth], dtype=tf.float32),
        lambda: inputs_ta.read(time_))
    return (elements_finished, next_input, next_state, emit_output,
            loop_state if loop_state_fn is not None else None)

  return loop_fn


class RawRNNTest(SeededTestCase):

  def _testRawRNN(self, max_time):
    with self.session(graph=tf.Graph()) as sess:
      batch_size, input_depth, num_units = 16, 4, 3
      inputs = v1.placeholder(shape=(max_time, batch_size, input_depth),
                              dtype=tf.float32)
      sequence_length = v1.placeholder(shape=(batch_size,), dtype=tf.int32)
      inputs_ta = tf.TensorArray(dtype=tf.float32,
                                 size=tf.shape(inputs)[0]).unstack(inputs)
      cell = rnn_cell.LSTMCell(num_units, state_is_tuple=True)
      loop_fn = _raw_inputs_loop_fn(cell, inputs_ta, batch_size, input_depth,
                                    lambda t: t >= sequence_length)
      reuse_scope = v1.get_variable_scope()
      outputs_ta, final_state, _ = raw_rnn(cell, loop_fn, scope=reuse_scope)
      outputs = outputs_ta.stack()
      reuse_scope.reuse_variables()
      outputs_dynamic_rnn, final_state_dynamic_rnn = dynamic_rnn(
          cell, inputs, time_major=True, dtype=tf.float32,
          sequence_length=sequence_length, scope=reuse_scope)
      variables = v1.trainable_variables()
      gradients = tf.gradients([outputs, final_state], [inputs] + variables)
      gradients_dynamic_rnn = tf.gradients(
          [outputs_dynamic_rnn, final_state_dynamic_rnn], [inputs] + variables)
      v1.global_variables_initializer().run()
      rand_input = np.random.randn(max_time, batch_size, input_depth)
      if max_time == 0:
        rand_seq_len = np.zeros(batch_size)
      else:
        rand_seq_len = np.random.randint(max_time, size=batch_size)
      rand_seq_len[0] = max_time  # The same output lengths for both.
      feed = {inputs: rand_input, sequence_length: rand_seq_len}
      (outputs_val, outputs_dynamic_rnn_val, final_state_val,
       final_state_dynamic_rnn_val) = sess.run(
           [outputs, outputs_dynamic_rnn, final_state,
            final_state_dynamic_rnn], feed_dict=feed)
      self.assertAllClose(outputs_dynamic_rnn_val, outputs_val)
      self.assertAllClose(final_state_dynamic_rnn_val, final_state_val)
      # With 0 steps raw_rnn knows no input shape: no gradients to compare.
      if max_time > 0:
        self.assertEqual(len(gradients), len(gradients_dynamic_rnn))
        gradients_val = sess.run(gradients, feed_dict=feed)
        gradients_dynamic_rnn_val = sess.run(gradients_dynamic_rnn,
                                             feed_dict=feed)
        self.assertEqual(len(gradients_val), len(gradients_dynamic_rnn_val))
        self.assertAllClose(gradients_val[0], gradients_dynamic_rnn_val[0])
        for i in range(1, len(gradients_val)):
          self.assertAllClose(gradients_dynamic_rnn_val[i], gradients_val[i])

  @test_util.run_deprecated_v1
  def testRawRNNZeroLength(self):
    self._testRawRNN(max_time=0)

  @test_util.run_deprecated_v1
  def testRawRNN(self):
    self._testRawRNN(max_time=10)

  def _loop_case(self, max_time, **kwargs):
    batch_size, input_depth, num_units = 16, 4, 3
    inputs = np.random.randn(max_time, batch_size, input_depth)
    inputs_ta = tf.TensorArray(dtype=tf.float32,
                               size=tf.shape(inputs)[0]).unstack(inputs)
    cell = rnn_cell.LSTMCell(num_units, state_is_tuple=True)
    return raw_rnn(cell, _raw_inputs_loop_fn(
        cell, inputs_ta, batch_size, input_depth,
        lambda t: tf.tile([t >= max_time], [batch_size]), **kwargs))

  @test_util.run_deprecated_v1
  def testLoopState(self):
    with self.session(graph=tf.Graph()):

      def loop_state_fn(time_, cell_output, loop_state):
        del time_
        if cell_output is None:
          return tf.constant([0])
        return tf.stack([tf.squeeze(loop_state) + 1])

      r = self._loop_case(10, loop_state_fn=loop_state_fn)
      self.assertEqual([10], self.evaluate(r[-1]))

  @test_util.run_deprecated_v1
  def testLoopStateWithTensorArray(self):
    with self.session(graph=tf.Graph()):

      def loop_state_fn(time_, cell_output, loop_state):
        if cell_output is None:
          loop_state = tf.TensorArray(dynamic_size=True, size=0,
                                      dtype=tf.int32, clear_after_read=False)
          return loop_state.write(0, 1)
        return loop_state.write(time_, loop_state.read(time_ - 1) + time_)

      r = self._loop_case(4, loop_state_fn=loop_state_fn)
      self.assertAllEqual([1, 2, 2 + 2, 4 + 3, 7 + 4], r[-1].stack())

  @test_util.run_deprecated_v1
  def testEmitDifferentStructureThanCellOutput(self):
    with self.session(graph=tf.Graph()) as sess:
      max_time, batch_size = 10, 16
      # Emit shapes may be unknown: a placeholder sets one.
      unknown_dim = v1.placeholder(dtype=tf.int32)

      def emit_fn(cell_output):
        if cell_output is None:
          return (tf.zeros([2, 3], dtype=tf.int32),
                  tf.zeros([unknown_dim], dtype=tf.int64))
        return (tf.ones([batch_size, 2, 3], dtype=tf.int32),
                tf.ones([batch_size, unknown_dim], dtype=tf.int64))

      r = self._loop_case(max_time, emit_fn=emit_fn)
      output_ta = r[0]
      self.assertEqual(2, len(output_ta))
      self.assertEqual([tf.int32, tf.int64], [ta.dtype for ta in output_ta])
      output = [ta.stack() for ta in output_ta]
      output_vals = sess.run(output, feed_dict={unknown_dim: 1})
      self.assertAllEqual(np.ones((max_time, batch_size, 2, 3), np.int32),
                          output_vals[0])
      self.assertAllEqual(np.ones((max_time, batch_size, 1), np.int64),
                          output_vals[1])

  @test_util.run_deprecated_v1
  def testRawRNNScope(self):
    max_time, batch_size, input_depth, num_units = 10, 16, 4, 3

    def factory(scope):
      inputs = v1.placeholder(shape=(max_time, batch_size, input_depth),
                              dtype=tf.float32)
      sequence_length = v1.placeholder(shape=(batch_size,), dtype=tf.int32)
      inputs_ta = tf.TensorArray(dtype=tf.float32,
                                 size=tf.shape(inputs)[0]).unstack(inputs)
      cell = rnn_cell.LSTMCell(num_units, state_is_tuple=True)
      loop_fn = _raw_inputs_loop_fn(cell, inputs_ta, batch_size, input_depth,
                                    lambda t: t >= sequence_length)
      return raw_rnn(cell, loop_fn, scope=scope)

    check_scope(self, factory, "rnn", use_outer_scope=True)
    check_scope(self, factory, "rnn", use_outer_scope=False)
    check_scope(self, factory, "rnn", prefix=None, use_outer_scope=False)


_TRUE_FULL_OUTPUT = np.array(
    [[[0.751109, 0.751109, 0.751109]], [[0.895509, 0.895509, 0.895509]]],
    dtype=np.float32)
_TRUE_FULL_FINAL_C = np.array([[1.949385, 1.949385, 1.949385]],
                              dtype=np.float32)


@test_util.run_all_in_graph_and_eager_modes
@test_util.run_all_without_tensor_float_32("Uses an LSTMCell: matmul")
class DropoutWrapperTest(PeerTestCase):

  def _testDropoutWrapper(self, batch_size=None, time_steps=None,
                          parallel_iterations=None, wrapper_type=None,
                          scope="root", **kwargs):
    if batch_size is None and time_steps is None:
      # 2 time steps, batch size 1, depth 3.
      batch_size, time_steps = 1, 2
      x = tf.constant([[[2., 2., 2.]], [[1., 1., 1.]]], dtype=tf.float32)
      m = rnn_cell.LSTMStateTuple(
          *[tf.constant([[0.1, 0.1, 0.1]], dtype=tf.float32)] * 2)
    else:
      x = tf.constant(
          np.random.randn(time_steps, batch_size, 3).astype(np.float32))
      m = rnn_cell.LSTMStateTuple(*[tf.constant(
          [[0.1, 0.1, 0.1]] * batch_size, dtype=tf.float32)] * 2)
    outputs, final_state = dynamic_rnn(
        cell=wrapper_type(
            rnn_cell.LSTMCell(3, initializer=v1.constant_initializer(0.5)),
            dtype=x.dtype, **kwargs),
        time_major=True, parallel_iterations=parallel_iterations, inputs=x,
        initial_state=m, scope=scope)
    self.evaluate([v1.global_variables_initializer()])
    res = self.evaluate([outputs, final_state])
    self.assertEqual(res[0].shape, (time_steps, batch_size, 3))
    self.assertEqual(res[1].c.shape, (batch_size, 3))
    self.assertEqual(res[1].h.shape, (batch_size, 3))
    return res

  def _assert_full(self, res):
    self.assertAllClose(_TRUE_FULL_OUTPUT, res[0])
    self.assertAllClose(_TRUE_FULL_OUTPUT[1], res[1].h)
    self.assertAllClose(_TRUE_FULL_FINAL_C, res[1].c)

  def testDropoutWrapperKeepAllConstantInput(self):
    keep = tf.ones([])
    self._assert_full(self._testDropoutWrapper(
        input_keep_prob=keep, output_keep_prob=keep, state_keep_prob=keep,
        wrapper_type=DropoutWrapper))

  def testDropoutWrapperKeepAll(self):
    keep = v1.get_variable("all", initializer=1.0)
    self._assert_full(self._testDropoutWrapper(
        input_keep_prob=keep, output_keep_prob=keep, state_keep_prob=keep,
        wrapper_type=DropoutWrapper))

  def testDropoutWrapperWithSeed(self):
    keep_some = 0.5
    results = []
    for scope in ("root_1", "root_2"):
      random_seed.set_random_seed(2)
      results.append(self._testDropoutWrapper(
          input_keep_prob=keep_some, output_keep_prob=keep_some,
          state_keep_prob=keep_some, seed=10, parallel_iterations=1,
          wrapper_type=DropoutWrapper, scope=scope))
    res_standard_1, res_standard_2 = results
    self.assertAllClose(res_standard_1[0], res_standard_2[0])
    self.assertAllClose(res_standard_1[1].c, res_standard_2[1].c)
    self.assertAllClose(res_standard_1[1].h, res_standard_2[1].h)

  def testDropoutWrapperKeepNoOutput(self):
    keep_all = v1.get_variable("all", initializer=1.0)
    keep_none = v1.get_variable("none", initializer=1e-6)
    res = self._testDropoutWrapper(
        input_keep_prob=keep_all, output_keep_prob=keep_none,
        state_keep_prob=keep_all, wrapper_type=DropoutWrapper)
    self.assertAllClose(np.zeros(res[0].shape), res[0])
    self.assertAllClose(_TRUE_FULL_OUTPUT[1], res[1].h)
    self.assertAllClose(_TRUE_FULL_FINAL_C, res[1].c)

  def testDropoutWrapperKeepNoStateExceptLSTMCellMemory(self):
    keep_all = v1.get_variable("all", initializer=1.0)
    keep_none = v1.get_variable("none", initializer=1e-6)
    # DropoutWrapper never drops an LSTMStateTuple's memory ("c").
    res = self._testDropoutWrapper(
        input_keep_prob=keep_all, output_keep_prob=keep_all,
        state_keep_prob=keep_none, wrapper_type=DropoutWrapper)
    true_c_state = np.array([[1.713925, 1.713925, 1.713925]], dtype=np.float32)
    self.assertAllClose(_TRUE_FULL_OUTPUT[0], res[0][0])
    # The second output sees the zeroed state.
    self.assertGreater(np.linalg.norm(_TRUE_FULL_OUTPUT[1] - res[0][1]), 1e-4)
    self.assertAllClose(np.zeros(res[1].h.shape), res[1].h)
    self.assertAllClose(true_c_state, res[1].c)

  def testDropoutWrapperKeepNoInput(self):
    keep_all = v1.get_variable("all", initializer=1.0)
    keep_none = v1.get_variable("none", initializer=1e-6)
    res = self._testDropoutWrapper(
        input_keep_prob=keep_none, output_keep_prob=keep_all,
        state_keep_prob=keep_all, wrapper_type=DropoutWrapper)
    self.assertGreater(np.linalg.norm(res[0] - _TRUE_FULL_OUTPUT), 1e-4)
    self.assertGreater(np.linalg.norm(res[1].h - _TRUE_FULL_OUTPUT[1]), 1e-4)
    self.assertGreater(np.linalg.norm(res[1].c - _TRUE_FULL_FINAL_C), 1e-4)

  def testDropoutWrapperRecurrentOutput(self):
    keep_some = 0.8
    keep_all = v1.get_variable("all", initializer=1.0)
    res = self._testDropoutWrapper(
        input_keep_prob=keep_all, output_keep_prob=keep_some,
        state_keep_prob=keep_all, variational_recurrent=True,
        wrapper_type=DropoutWrapper, input_size=3, batch_size=5,
        time_steps=7)
    # The same dropout pattern at every step.
    output_mask = np.abs(res[0]) > 1e-6
    for m in output_mask[1:]:
      self.assertAllClose(output_mask[0], m)

  def _assert_variational_masks(self, res):
    output_mask = np.abs(res[0]) > 1e-6
    for time_step in output_mask:
      self.assertAllClose(output_mask[0], time_step)
      for batch_entry in time_step:
        self.assertAllClose(batch_entry, time_step[0])
    state_c_mask = np.abs(res[1].c) > 1e-6
    state_h_mask = np.abs(res[1].h) > 1e-6
    for batch_entry in state_c_mask:
      self.assertAllClose(batch_entry, state_c_mask[0])
    for batch_entry in state_h_mask:
      self.assertAllClose(batch_entry, state_h_mask[0])

  def testDropoutWrapperRecurrentStateInputAndOutput(self):
    keep_some = 0.9
    self._assert_variational_masks(self._testDropoutWrapper(
        input_keep_prob=keep_some, output_keep_prob=keep_some,
        state_keep_prob=keep_some, variational_recurrent=True,
        wrapper_type=DropoutWrapper, input_size=3, batch_size=5,
        time_steps=7))

  def testDropoutWrapperRecurrentStateInputAndOutputWithSeed(self):
    keep_some = 0.9
    results = []
    for scope in ("root_0", "root_1"):
      random_seed.set_random_seed(2347)
      np.random.seed(23487)
      results.append(self._testDropoutWrapper(
          input_keep_prob=keep_some, output_keep_prob=keep_some,
          state_keep_prob=keep_some, variational_recurrent=True,
          wrapper_type=DropoutWrapper, input_size=3, batch_size=5,
          time_steps=7, seed=-234987, scope=scope))
    res0, res1 = results
    self._assert_variational_masks(res0)
    self.assertAllClose(res0[0], res1[0])
    self.assertAllClose(res0[1].c, res1[1].c)
    self.assertAllClose(res0[1].h, res1[1].h)


class Keras3VariantsTest(SeededTestCase):
  """The main cases above with Keras 3 cells in place of the legacy ones."""

  @test_util.run_in_graph_and_eager_modes
  def testDynamicEquivalentToStaticRNNWithSequenceLength(self):
    time_steps, num_units, input_size, batch_size = 8, 3, 5, 2
    input_values = np.random.randn(time_steps, batch_size,
                                   input_size).astype(np.float32)
    sequence_length = np.random.randint(0, time_steps, size=batch_size)
    cell = keras.layers.LSTMCell(num_units, activation="relu")  # Generic.
    concat_inputs = tf.constant(input_values)
    outputs, state = dynamic_rnn(cell, concat_inputs, time_major=True,
                                 sequence_length=sequence_length,
                                 dtype=tf.float32)
    self.assertEqual(outputs.shape.as_list(),
                     [time_steps, batch_size, num_units])
    h = c = tf.zeros([batch_size, num_units])
    rows = []
    for t in range(time_steps):
      out, (h_new, c_new) = cell(concat_inputs[t], [h, c])
      running = tf.constant(sequence_length > t)[:, None]
      h, c = tf.where(running, h_new, h), tf.where(running, c_new, c)
      rows.append(tf.where(running, out, tf.zeros_like(out)))
    static = (tf.stack(rows), [h, c])
    variables = cell.trainable_variables
    grads = tf.gradients if not tf.executing_eagerly() else None
    if grads:
      self.evaluate(v1.global_variables_initializer())
    self.assertAllClose(self.evaluate(static), self.evaluate((outputs, state)))
    if grads:
      self.assertAllClose(
          self.evaluate(grads([static[0], static[1]], variables)),
          self.evaluate(grads([outputs, state], variables)))

  @test_util.run_deprecated_v1
  def testBidirectionalDynamicRNN(self):
    num_units, input_size, batch_size, max_length = 3, 5, 2, 8
    for use_shape, use_time_major in itertools.product([True, False],
                                                       repeat=2):
      with self.session(graph=tf.Graph()) as sess:
        init = keras.initializers.RandomUniform(-0.5, 0.5, seed=self._seed)
        cells = [keras.layers.LSTMCell(num_units, kernel_initializer=init,
                                       recurrent_initializer=init,
                                       activation="relu")
                 for _ in range(2)]
        sequence_length = v1.placeholder(tf.int64)
        inputs = max_length * [v1.placeholder(
            tf.float32, shape=(batch_size if use_shape else None, input_size))]
        inputs_c = tf.stack(inputs)
        if not use_time_major:
          inputs_c = tf.transpose(inputs_c, [1, 0, 2])
        outputs, _ = bidirectional_dynamic_rnn(
            cells[0], cells[1], inputs_c, sequence_length, dtype=tf.float32,
            time_major=use_time_major)
        outputs = tf.concat(outputs, 2)
        shape = [batch_size if use_shape else None, max_length, 2 * num_units]
        if use_time_major:
          shape[0], shape[1] = shape[1], shape[0]
        self.assertEqual(outputs.shape.as_list(), shape)
        v1.global_variables_initializer().run()
        out = sess.run(outputs, feed_dict={
            sequence_length: [2, 3],
            inputs[0]: np.random.randn(batch_size, input_size)})
        if not use_time_major:
          out = np.swapaxes(out, 0, 1)
        for b, length in ((0, 2), (1, 3)):
          for t in range(length):
            self.assertAllEqual(out[t][b][:3], out[length - 1 - t][b][3:])

  @test_util.run_deprecated_v1
  def testRawRNN(self):
    max_time, batch_size, input_depth, num_units = 10, 16, 4, 3
    with self.session(graph=tf.Graph()) as sess:
      inputs = v1.placeholder(shape=(max_time, batch_size, input_depth),
                              dtype=tf.float32)
      sequence_length = v1.placeholder(shape=(batch_size,), dtype=tf.int32)
      inputs_ta = tf.TensorArray(dtype=tf.float32,
                                 size=tf.shape(inputs)[0]).unstack(inputs)
      cell = keras.layers.LSTMCell(num_units)

      def loop_fn(time_, cell_output, cell_state, unused_loop_state):
        if cell_output is None:
          next_state = [tf.zeros([batch_size, num_units])] * 2
        else:
          next_state = cell_state
        elements_finished = time_ >= sequence_length
        next_input = tf.cond(
            tf.reduce_all(elements_finished),
            lambda: tf.zeros([batch_size, input_depth], dtype=tf.float32),
            lambda: inputs_ta.read(time_))
        return (elements_finished, next_input, next_state, cell_output, None)

      outputs_ta, final_state, _ = raw_rnn(cell, loop_fn)
      outputs = outputs_ta.stack()
      outputs_dynamic, final_dynamic = dynamic_rnn(
          cell, inputs, time_major=True, dtype=tf.float32,
          sequence_length=sequence_length)
      variables = cell.trainable_variables
      gradients = tf.gradients([outputs, final_state], [inputs] + variables)
      gradients_dynamic = tf.gradients([outputs_dynamic, final_dynamic],
                                       [inputs] + variables)
      v1.global_variables_initializer().run()
      rand_seq_len = np.random.randint(max_time, size=batch_size)
      rand_seq_len[0] = max_time
      feed = {inputs: np.random.randn(max_time, batch_size, input_depth),
              sequence_length: rand_seq_len}
      values = sess.run([outputs, final_state, gradients], feed_dict=feed)
      values_dynamic = sess.run([outputs_dynamic, final_dynamic,
                                 gradients_dynamic], feed_dict=feed)
      self.assertAllClose(values_dynamic, values)
