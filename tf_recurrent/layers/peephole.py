"""The peephole LSTM (Gers & Schmidhuber 2000), a cell Keras 3 no longer ships.

`PeepholeLSTMCell` is Keras's `LSTMCell` with diagonal peephole weights
`peephole` `[3, units]` (rows p_i, p_f, p_o), as Keras 2's and TF Addons'
`PeepholeLSTMCell`:

    i = sigmoid(x W_i + h U_i + b_i + p_i * c_prev)
    f = sigmoid(x W_f + h U_f + b_f + p_f * c_prev)
    c = f * c_prev + i * tanh(x W_c + h U_c + b_c)
    o = sigmoid(x W_o + h U_o + b_o + p_o * c)
    h = o * tanh(c)

Its `call` is plain Keras ops, so it runs in `keras.layers.RNN` too.
`PeepholeLSTM` runs it, with the default activations, on the chunked loop
pair of `tf_recurrent.chunked.sequence` (kind "peephole_lstm") with a hand-written
gradient, like `tf_recurrent.LSTM`.
"""

import keras
from keras import ops

from tf_recurrent.engine import built_in
from tf_recurrent.layers import cell_layers


@keras.saving.register_keras_serializable(package="tf_recurrent")
class PeepholeLSTMCell(keras.layers.LSTMCell):
  """`keras.layers.LSTMCell` with diagonal peephole connections.

  Takes the arguments of `keras.layers.LSTMCell`, plus
  `peephole_initializer` (default "glorot_uniform"), `peephole_regularizer`
  and `peephole_constraint` for the `peephole` weight `[3, units]`, whose
  rows p_i, p_f, p_o scale c_prev in the input and forget gates and the new
  c in the output gate.

  Example:

  >>> import keras
  >>> import tensorflow as tf
  >>> import tf_recurrent
  >>> cell = tf_recurrent.PeepholeLSTMCell(4)
  >>> layer = keras.layers.RNN(cell)
  >>> layer(tf.ones([2, 5, 3])).shape
  TensorShape([2, 4])
  >>> tuple(cell.peephole.shape)
  (3, 4)
  """

  def __init__(self, units, peephole_initializer="glorot_uniform",
               peephole_regularizer=None, peephole_constraint=None, **kwargs):
    super().__init__(units, **kwargs)
    self.peephole_initializer = keras.initializers.get(peephole_initializer)
    self.peephole_regularizer = keras.regularizers.get(peephole_regularizer)
    self.peephole_constraint = keras.constraints.get(peephole_constraint)

  def build(self, input_shape):
    super().build(input_shape)
    self.peephole = self.add_weight(
        shape=(3, self.units), name="peephole",
        initializer=self.peephole_initializer,
        regularizer=self.peephole_regularizer,
        constraint=self.peephole_constraint)

  def _compute_carry_and_output(self, x, h_tm1, c_tm1):
    """(c, o) with `implementation=1` (per-gate inputs and h)."""
    x_i, x_f, x_c, x_o = x
    h_i, h_f, h_c, h_o = h_tm1
    u_i, u_f, u_c, u_o = ops.split(self.recurrent_kernel, 4, axis=1)
    return self._carry_and_output(
        (x_i + ops.matmul(h_i, u_i), x_f + ops.matmul(h_f, u_f),
         x_c + ops.matmul(h_c, u_c), x_o + ops.matmul(h_o, u_o)), c_tm1)

  def _compute_carry_and_output_fused(self, z, c_tm1):
    """(c, o) from the four pre-activations `x W + h U + b`."""
    return self._carry_and_output(z, c_tm1)

  def _carry_and_output(self, z, c_tm1):
    z_i, z_f, z_c, z_o = z
    p_i, p_f, p_o = self.peephole[0], self.peephole[1], self.peephole[2]
    i = self.recurrent_activation(z_i + p_i * c_tm1)
    f = self.recurrent_activation(z_f + p_f * c_tm1)
    c = f * c_tm1 + i * self.activation(z_c)
    o = self.recurrent_activation(z_o + p_o * c)
    return c, o

  def get_config(self):
    return {**super().get_config(),
            **cell_layers.weight_config(self, "peephole")}


built_in.BUILT_IN_CELLS[PeepholeLSTMCell] = built_in.BuiltInCell(
    lambda cell: "peephole_lstm", built_in.KERAS_GATES,
    extra_weights=lambda cell: {"peephole": cell.peephole})

@keras.saving.register_keras_serializable(package="tf_recurrent")
class PeepholeLSTM(cell_layers.CellLayer):
  """A peephole LSTM layer on tf_recurrent's chunked loops.

  `tf_recurrent.RNN(PeepholeLSTMCell(units, ...))`, taking the cell's
  arguments (those of `keras.layers.LSTM` but `use_cudnn`, plus the
  `peephole_*` ones) and the layer's (`return_sequences`, `return_state`,
  `go_backwards`, `stateful`, `unroll`, `zero_output_for_mask`,
  `recompute`). With the default activations it runs the chunked loop pair
  with a hand-written gradient (like `tf_recurrent.LSTM`: masks, dropout,
  `recompute`); any other activation runs the cell step by step.

  Example:

  >>> import tensorflow as tf
  >>> import tf_recurrent
  >>> layer = tf_recurrent.PeepholeLSTM(8, return_sequences=True)
  >>> layer(tf.ones([2, 5, 3])).shape
  TensorShape([2, 5, 8])
  >>> tf_recurrent.PeepholeLSTM(8, recompute=True).get_config()["units"]
  8
  """

  cell_class = PeepholeLSTMCell
  cell_name = "peephole_lstm_cell"
