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
pair of `tf_recurrent.sequence` (kind "peephole_lstm") with a hand-written
gradient, like `tf_recurrent.LSTM`.
"""

import keras
from keras import ops

from tf_recurrent import layers


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
    return {
        **super().get_config(),
        "peephole_initializer": keras.initializers.serialize(
            self.peephole_initializer),
        "peephole_regularizer": keras.regularizers.serialize(
            self.peephole_regularizer),
        "peephole_constraint": keras.constraints.serialize(
            self.peephole_constraint),
    }


layers.BUILT_IN_CELLS[PeepholeLSTMCell] = layers.BuiltInCell(
    lambda cell: "peephole_lstm", layers._KERAS_GATES)  # pylint: disable=protected-access

# The layer's own arguments; every other one is the cell's.
_LAYER_ARGS = ("return_sequences", "return_state", "go_backwards",
               "stateful", "unroll", "zero_output_for_mask", "recompute",
               "activity_regularizer")
# Layer-level keyword arguments shared with the cell.
_SHARED_ARGS = ("dtype", "trainable")


@keras.saving.register_keras_serializable(package="tf_recurrent")
class PeepholeLSTM(layers.RNN):
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

  def __init__(self, units, activation="tanh", recurrent_activation="sigmoid",
               use_bias=True, kernel_initializer="glorot_uniform",
               recurrent_initializer="orthogonal", bias_initializer="zeros",
               peephole_initializer="glorot_uniform", unit_forget_bias=True,
               kernel_regularizer=None, recurrent_regularizer=None,
               bias_regularizer=None, peephole_regularizer=None,
               activity_regularizer=None, kernel_constraint=None,
               recurrent_constraint=None, bias_constraint=None,
               peephole_constraint=None, dropout=0.0, recurrent_dropout=0.0,
               seed=None, return_sequences=False, return_state=False,
               go_backwards=False, stateful=False, unroll=False,
               zero_output_for_mask=False, *, recompute: bool = False,
               **kwargs):
    cell = PeepholeLSTMCell(
        units, activation=activation,
        recurrent_activation=recurrent_activation, use_bias=use_bias,
        kernel_initializer=kernel_initializer,
        recurrent_initializer=recurrent_initializer,
        bias_initializer=bias_initializer,
        peephole_initializer=peephole_initializer,
        unit_forget_bias=unit_forget_bias,
        kernel_regularizer=kernel_regularizer,
        recurrent_regularizer=recurrent_regularizer,
        bias_regularizer=bias_regularizer,
        peephole_regularizer=peephole_regularizer,
        kernel_constraint=kernel_constraint,
        recurrent_constraint=recurrent_constraint,
        bias_constraint=bias_constraint,
        peephole_constraint=peephole_constraint, dropout=dropout,
        recurrent_dropout=recurrent_dropout, seed=seed,
        implementation=kwargs.pop("implementation", 2),
        name="peephole_lstm_cell",
        **{k: kwargs[k] for k in _SHARED_ARGS if k in kwargs})
    super().__init__(
        cell, return_sequences=return_sequences, return_state=return_state,
        go_backwards=go_backwards, stateful=stateful, unroll=unroll,
        zero_output_for_mask=zero_output_for_mask, recompute=recompute,
        activity_regularizer=activity_regularizer, **kwargs)
    self.input_spec = keras.layers.InputSpec(ndim=3)

  @property
  def units(self):
    return self.cell.units

  def get_config(self):
    config = super().get_config()
    del config["cell"]
    cell_config = self.cell.get_config()
    for key in ("name", *_SHARED_ARGS):
      cell_config.pop(key, None)
    return {**config, **cell_config}

  @classmethod
  def from_config(cls, config, custom_objects=None):
    del custom_objects
    return cls(**config)
