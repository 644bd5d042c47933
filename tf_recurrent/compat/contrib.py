"""`tf.contrib.recurrent`'s names on tf_recurrent: migrating swaps one import.

Contrib code imports the module and calls functions on it:

    from tensorflow.contrib.recurrent.python.ops import recurrent
    acc_state, final_state = recurrent.Recurrent(theta, state0, inputs, cell_fn)

becomes `from tf_recurrent import contrib as recurrent`, the calls unchanged:

* `Recurrent` is `tf_recurrent.recurrent` (contrib's positional arguments
  `theta, state0, inputs, cell_fn, cell_grad, extras, max_input_length,
  use_tpu`; contrib's `aligned_end` is not taken);
* `functional_rnn` and `bidirectional_functional_rnn` take contrib's
  argument orders and run `tf_recurrent.dynamic_rnn` /
  `bidirectional_dynamic_rnn` (the same code, on the same op).
"""

from typing import Any, Optional, Tuple

import tensorflow as tf

from tf_recurrent.compat import dynamic
from tf_recurrent.op import unconverted
from tf_recurrent.op.op import Recurrent  # pylint: disable=unused-import

__all__ = ["Recurrent", "functional_rnn", "bidirectional_functional_rnn"]


@unconverted.entry_point
def functional_rnn(cell: Any,
                   inputs: Any,
                   sequence_length: Any = None,
                   initial_state: Any = None,
                   dtype: Optional[tf.DType] = None,
                   time_major: bool = False,
                   scope: Any = None,
                   use_tpu: bool = False) -> Tuple[Any, Any]:
  """contrib's `functional_rnn`: `tf_recurrent.dynamic_rnn` in its order.

  Args:
    cell: As for `dynamic_rnn`.
    inputs: As for `dynamic_rnn`.
    sequence_length: As for `dynamic_rnn`.
    initial_state: As for `dynamic_rnn`.
    dtype: As for `dynamic_rnn`.
    time_major: As for `dynamic_rnn`.
    scope: As for `dynamic_rnn`.
    use_tpu: Accepted; under `jit_compile=True` (TPU) the loops are built for
      XLA without it.

  Returns:
    `(outputs, final_state)`, as `dynamic_rnn` returns.

  Example:

  >>> import keras
  >>> from tf_recurrent import contrib as recurrent
  >>> outputs, state = recurrent.functional_rnn(
  ...     keras.layers.GRUCell(4), tf.ones([2, 5, 3]), dtype=tf.float32)
  >>> outputs.shape
  TensorShape([2, 5, 4])
  """
  del use_tpu
  return dynamic.dynamic_rnn(cell, inputs, sequence_length=sequence_length,
                             initial_state=initial_state, dtype=dtype,
                             time_major=time_major, scope=scope)


@unconverted.entry_point
def bidirectional_functional_rnn(
    cell_fw: Any,
    cell_bw: Any,
    inputs: Any,
    initial_state_fw: Any = None,
    initial_state_bw: Any = None,
    dtype: Optional[tf.DType] = None,
    sequence_length: Any = None,
    time_major: bool = False,
    use_tpu: bool = False,
    scope: Any = None) -> Tuple[Tuple[Any, Any], Tuple[Any, Any]]:
  """contrib's `bidirectional_functional_rnn`: `bidirectional_dynamic_rnn`.

  Args:
    cell_fw: As for `bidirectional_dynamic_rnn`.
    cell_bw: As for `bidirectional_dynamic_rnn`.
    inputs: As for `bidirectional_dynamic_rnn`.
    initial_state_fw: As for `bidirectional_dynamic_rnn`.
    initial_state_bw: As for `bidirectional_dynamic_rnn`.
    dtype: As for `bidirectional_dynamic_rnn`.
    sequence_length: As for `bidirectional_dynamic_rnn`.
    time_major: As for `bidirectional_dynamic_rnn`.
    use_tpu: Accepted, as for `functional_rnn`.
    scope: As for `bidirectional_dynamic_rnn`.

  Returns:
    `((output_fw, output_bw), (state_fw, state_bw))`.

  Example:

  >>> import keras
  >>> from tf_recurrent import contrib as recurrent
  >>> (fw, bw), _ = recurrent.bidirectional_functional_rnn(
  ...     keras.layers.LSTMCell(2), keras.layers.LSTMCell(3),
  ...     tf.ones([2, 5, 3]), dtype=tf.float32, sequence_length=[5, 1])
  >>> fw.shape, bw.shape
  (TensorShape([2, 5, 2]), TensorShape([2, 5, 3]))
  """
  del use_tpu
  return dynamic.bidirectional_dynamic_rnn(
      cell_fw, cell_bw, inputs, sequence_length=sequence_length,
      initial_state_fw=initial_state_fw, initial_state_bw=initial_state_bw,
      dtype=dtype, time_major=time_major, scope=scope)
