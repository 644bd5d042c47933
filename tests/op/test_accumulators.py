"""Row accumulators: zero-filled rows, static shapes, the primitive per mode."""

import numpy as np
import pytest
import tensorflow as tf

from tf_recurrent.op import accumulators


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16, tf.float16])
@pytest.mark.parametrize("use_xla", [False, True])
def test_written_rows_and_zero_rows(use_xla, dtype):
  @tf.function(jit_compile=use_xla)
  def fill(rows):
    acc = accumulators.RowAccumulator.like_rows_of(rows, use_xla)
    handle = acc.empty()
    for t in (0, 2):
      handle = acc.write(handle, tf.constant(t), rows[t])
    return acc.stack(handle)

  rows = tf.cast(tf.reshape(tf.range(12.0) - 2.5, [4, 3]), dtype)
  got = fill(rows)
  assert got.dtype == dtype and got.shape == [4, 3]
  np.testing.assert_array_equal(tf.cast(got, tf.float32),
                                [[-2.5, -1.5, -0.5], [0, 0, 0],
                                 [3.5, 4.5, 5.5], [0, 0, 0]])


@pytest.mark.parametrize("dtype", [tf.bfloat16, tf.float16])
def test_16_bit_rows_are_scattered_as_bits_under_xla(dtype):
  """XLA on CPU would convert a 16-bit float buffer to float32 and back on
  every scatter (quadratic in T); the buffer holds the bits as uint16."""
  @tf.function
  def write(rows):
    acc = accumulators.RowAccumulator.like_rows_of(rows, use_xla=True)
    return acc.stack(acc.write(acc.empty(), 1, rows[0]))

  graph = write.get_concrete_function(tf.zeros([3, 2], dtype)).graph
  scatters = [op for op in graph.get_operations()
              if op.type == "TensorScatterUpdate"]
  assert [op.outputs[0].dtype for op in scatters] == [tf.uint16]


def test_in_xla_context_detects_jit_compile():
  seen = []

  def probe():
    seen.append(accumulators.in_xla_context())
    return tf.constant(0)

  tf.function(probe, jit_compile=True)()
  tf.function(probe)()
  assert seen == [True, False]


@pytest.mark.parametrize("use_xla,op_type", [(False, "TensorListSetItem"),
                                             (True, "TensorScatterUpdate")])
def test_primitive_per_mode(use_xla, op_type):
  @tf.function
  def write(rows):
    acc = accumulators.RowAccumulator.like_rows_of(rows, use_xla)
    return acc.stack(acc.write(acc.empty(), 1, rows[0]))

  graph = write.get_concrete_function(tf.zeros([3, 2])).graph
  assert op_type in {op.type for op in graph.get_operations()}


def test_eager_write_does_not_alias_the_callers_tensor():
  template = tf.ones([2])
  acc = accumulators.RowAccumulator(template, num_rows=3, use_xla=True)
  buffer = acc.empty()
  before = buffer.numpy().copy()
  acc.write(buffer, 0, template)
  np.testing.assert_array_equal(buffer.numpy(), before)
