"""The LSTM with a projection (Sak et al. 2014), which Keras 3 does not ship.

As PyTorch's `nn.LSTM(proj_size=P)` and TF1's `LSTMCell(num_proj=P)`:
the cell's output `m = o * tanh(c)` (`units` wide) is projected,
`h = m @ W_proj` (`proj_size` wide, no bias), and the recurrent kernel
reads the projected h (`[proj_size, 4 * units]`). State `[h, c]`:
`[B, proj_size]` and `[B, units]`.

`ProjectedLSTMCell`'s `call` is Keras's `LSTMCell.call` followed by the
projection, so it runs in `keras.layers.RNN` too; `ProjectedLSTM` runs it,
with the default activations, on `tf_recurrent.chunked.sequence`'s chunked loops
with a hand-written gradient (kind "lstm" given a "projection" weight).
"""

import keras
from keras import initializers
from keras import ops

from tf_recurrent.engine import built_in
from tf_recurrent.layers import cell_layers
from tf_recurrent.op import unconverted


@keras.saving.register_keras_serializable(package="tf_recurrent")
class ProjectedLSTMCell(unconverted.EntryPoint, keras.layers.LSTMCell):
  """`keras.layers.LSTMCell` whose output is projected to `proj_size`.

  Takes the arguments of `keras.layers.LSTMCell`, plus `proj_size` (a
  positive int, h's width), `projection_initializer` (default
  "glorot_uniform"), `projection_regularizer` and `projection_constraint`
  for the `projection` weight `[units, proj_size]`.

  Example:

  >>> import keras
  >>> import tensorflow as tf
  >>> import tf_recurrent
  >>> cell = tf_recurrent.ProjectedLSTMCell(8, proj_size=3)
  >>> outputs, h, c = keras.layers.RNN(cell, return_sequences=True,
  ...                                  return_state=True)(tf.ones([2, 5, 4]))
  >>> outputs.shape, h.shape, c.shape
  (TensorShape([2, 5, 3]), TensorShape([2, 3]), TensorShape([2, 8]))
  >>> tuple(cell.recurrent_kernel.shape)
  (3, 32)
  """

  def __init__(self, units, proj_size, projection_initializer="glorot_uniform",
               projection_regularizer=None, projection_constraint=None,
               **kwargs):
    if not isinstance(proj_size, int) or isinstance(proj_size, bool) or (
        proj_size <= 0):
      raise ValueError(f"ProjectedLSTMCell: proj_size must be a positive "
                       f"int (h's width); got {proj_size!r}.")
    super().__init__(units, **kwargs)
    self.proj_size = proj_size
    self.projection_initializer = initializers.get(projection_initializer)
    self.projection_regularizer = keras.regularizers.get(
        projection_regularizer)
    self.projection_constraint = keras.constraints.get(projection_constraint)
    self.state_size = [proj_size, units]
    self.output_size = proj_size

  def build(self, input_shape):
    # Keras's LSTMCell.build with the recurrent kernel reading the
    # projected h: [proj_size, 4 * units].
    keras.layers.Layer.build(self, input_shape)
    units = self.units
    self.kernel = self.add_weight(
        shape=(input_shape[-1], 4 * units), name="kernel",
        initializer=self.kernel_initializer,
        regularizer=self.kernel_regularizer,
        constraint=self.kernel_constraint)
    self.recurrent_kernel = self.add_weight(
        shape=(self.proj_size, 4 * units), name="recurrent_kernel",
        initializer=self.recurrent_initializer,
        regularizer=self.recurrent_regularizer,
        constraint=self.recurrent_constraint)
    self.bias = None
    if self.use_bias:
      self.bias = self.add_weight(
          shape=(4 * units,), name="bias", initializer=self._bias_initializer,
          regularizer=self.bias_regularizer, constraint=self.bias_constraint)
    self.projection = self.add_weight(
        shape=(units, self.proj_size), name="projection",
        initializer=self.projection_initializer,
        regularizer=self.projection_regularizer,
        constraint=self.projection_constraint)

  def _bias_initializer(self, shape, dtype=None):
    """Keras's LSTM bias: the forget gate's block ones with
    `unit_forget_bias`."""
    del shape
    units = self.units
    if not self.unit_forget_bias:
      return self.bias_initializer((4 * units,), dtype=dtype)
    return ops.concatenate([
        self.bias_initializer((units,), dtype=dtype),
        initializers.get("ones")((units,), dtype=dtype),
        self.bias_initializer((2 * units,), dtype=dtype)])

  def call(self, inputs, states, training=False):
    m, (_, c) = super().call(inputs, states, training=training)
    h = ops.matmul(m, self.projection)
    return h, [h, c]

  def get_config(self):
    return {**super().get_config(), "proj_size": self.proj_size,
            **cell_layers.weight_config(self, "projection")}


built_in.BUILT_IN_CELLS[ProjectedLSTMCell] = built_in.BuiltInCell(
    lambda cell: "lstm", built_in.KERAS_GATES,
    extra_weights=lambda cell: {"projection": cell.projection})


@keras.saving.register_keras_serializable(package="tf_recurrent")
class ProjectedLSTM(cell_layers.CellLayer):
  """An LSTM layer with a projection on tf_recurrent's chunked loops.

  `tf_recurrent.RNN(ProjectedLSTMCell(units, proj_size=..., ...))`, taking
  the cell's arguments (those of `keras.layers.LSTM` but `use_cudnn`, plus
  `proj_size` and the `projection_*` ones) and the layer's
  (`return_sequences`, `return_state`, `go_backwards`, `stateful`,
  `unroll`, `zero_output_for_mask`, `recompute`). Outputs and h are
  `proj_size` wide, c `units` wide. With the default activations it runs
  the chunked loop pair with a hand-written gradient (masks, dropout,
  `recompute`); any other activation runs the cell step by step.

  Example:

  >>> import tensorflow as tf
  >>> import tf_recurrent
  >>> layer = tf_recurrent.ProjectedLSTM(8, proj_size=3,
  ...                                    return_sequences=True)
  >>> layer(tf.ones([2, 5, 4])).shape
  TensorShape([2, 5, 3])
  """

  cell_class = ProjectedLSTMCell
  cell_name = "projected_lstm_cell"
