"""Layer-normalized LSTM and SimpleRNN (Ba et al. 2016), as TF Addons had them.

Keras 3 ships neither; TF Addons' `LayerNormLSTMCell` and
`LayerNormSimpleRNNCell` were built for Keras 2 and ended with Addons.
These are Keras 3 cells computing what Addons' computed (the same
arguments, defaults and dropout: one mask for all gates), and layers that
run them on `tf_recurrent.chunked.sequence`'s chunked loops with a hand-written
gradient (`tf_recurrent.chunked.layer_norm` holds that math):

    LayerNormLSTMCell:      z = LN(x W) + LN(h U) + b
                            c = LN(f * c_prev + i * tanh(z_c))
                            h = o * tanh(c)
    LayerNormSimpleRNNCell: h = tanh(LN(x W + h U) + b)  (LN: scale only)

Each cell's `call` is plain Keras ops, so it also runs in `keras.layers.RNN`.
"""

import keras
from keras import ops

from tf_recurrent.engine import built_in
from tf_recurrent.layers import cell_layers
from tf_recurrent.op import unconverted


@keras.saving.register_keras_serializable(package="tf_recurrent")
class LayerNormLSTMCell(unconverted.EntryPoint, keras.layers.LSTMCell):
  """`keras.layers.LSTMCell` with layer normalization, as TF Addons' cell.

  Takes the arguments of `keras.layers.LSTMCell`, plus
  `norm_gamma_initializer` ("ones"), `norm_beta_initializer` ("zeros") and
  `norm_epsilon` (1e-3) for its three norms: `kernel_norm` of `x W` and
  `recurrent_norm` of `h U` (over all four gates, 4 * units), `state_norm`
  of the new c (units). Dropout as Addons': one mask for all gates, for
  the inputs and for h.

  Example:

  >>> import keras
  >>> import tensorflow as tf
  >>> import tf_recurrent
  >>> cell = tf_recurrent.LayerNormLSTMCell(4)
  >>> keras.layers.RNN(cell)(tf.ones([2, 5, 3])).shape
  TensorShape([2, 4])
  >>> tuple(cell.state_norm.gamma.shape)
  (4,)
  """

  def __init__(self, units, norm_gamma_initializer="ones",
               norm_beta_initializer="zeros", norm_epsilon=1e-3, **kwargs):
    super().__init__(units, **kwargs)
    # One dropout mask for all gates (Keras draws one per gate with
    # implementation=1, which its recurrent dropout implies).
    self.dropout_mask_count = None
    self.norm_gamma_initializer = keras.initializers.get(
        norm_gamma_initializer)
    self.norm_beta_initializer = keras.initializers.get(norm_beta_initializer)
    self.norm_epsilon = norm_epsilon
    self.kernel_norm, self.recurrent_norm, self.state_norm = (
        keras.layers.LayerNormalization(
            epsilon=norm_epsilon, gamma_initializer=self.norm_gamma_initializer,
            beta_initializer=self.norm_beta_initializer, name=name,
            dtype=self.dtype_policy)
        for name in ("kernel_norm", "recurrent_norm", "state_norm"))

  def build(self, input_shape):
    super().build(input_shape)
    self.kernel_norm.build((None, 4 * self.units))
    self.recurrent_norm.build((None, 4 * self.units))
    self.state_norm.build((None, self.units))

  def call(self, inputs, states, training=False):
    h_tm1, c_tm1 = states[0], states[1]
    if training and 0.0 < self.dropout < 1.0:
      inputs = inputs * self.get_dropout_mask(inputs)
    if training and 0.0 < self.recurrent_dropout < 1.0:
      h_tm1 = h_tm1 * self.get_recurrent_dropout_mask(h_tm1)
    z = (self.kernel_norm(ops.matmul(inputs, self.kernel)) +
         self.recurrent_norm(ops.matmul(h_tm1, self.recurrent_kernel)))
    if self.use_bias:
      z = z + self.bias
    z_i, z_f, z_c, z_o = ops.split(z, 4, axis=-1)
    i = self.recurrent_activation(z_i)
    f = self.recurrent_activation(z_f)
    c = self.state_norm(f * c_tm1 + i * self.activation(z_c))
    h = self.recurrent_activation(z_o) * self.activation(c)
    return h, [h, c]

  def get_config(self):
    return {
        **super().get_config(),
        "norm_gamma_initializer": keras.initializers.serialize(
            self.norm_gamma_initializer),
        "norm_beta_initializer": keras.initializers.serialize(
            self.norm_beta_initializer),
        "norm_epsilon": self.norm_epsilon,
    }


@keras.saving.register_keras_serializable(package="tf_recurrent")
class LayerNormSimpleRNNCell(unconverted.EntryPoint,
                             keras.layers.SimpleRNNCell):
  """`keras.layers.SimpleRNNCell` with layer normalization, as TF Addons'.

  `h = activation(LN(x W + h U) + bias)`, the norm scaling only (`gamma`,
  no shift: the bias follows it). Takes the arguments of
  `keras.layers.SimpleRNNCell`, plus `layernorm_epsilon` (1e-5),
  `gamma_initializer` ("ones"), `gamma_regularizer` and
  `gamma_constraint`.

  Example:

  >>> import keras
  >>> import tensorflow as tf
  >>> import tf_recurrent
  >>> cell = tf_recurrent.LayerNormSimpleRNNCell(4)
  >>> keras.layers.RNN(cell)(tf.ones([2, 5, 3])).shape
  TensorShape([2, 4])
  """

  def __init__(self, units, layernorm_epsilon=1e-5, gamma_initializer="ones",
               gamma_regularizer=None, gamma_constraint=None, **kwargs):
    super().__init__(units, **kwargs)
    self.layernorm_epsilon = layernorm_epsilon
    self.layernorm = keras.layers.LayerNormalization(
        epsilon=layernorm_epsilon, center=False, scale=True,
        gamma_initializer=gamma_initializer,
        gamma_regularizer=gamma_regularizer,
        gamma_constraint=gamma_constraint, name="layernorm",
        dtype=self.dtype_policy)

  def build(self, input_shape):
    super().build(input_shape)
    self.layernorm.build((None, self.units))

  def call(self, sequence, states, training=False):
    prev_output = states[0] if isinstance(states, (list, tuple)) else states
    if training and 0.0 < self.dropout < 1.0:
      sequence = sequence * self.get_dropout_mask(sequence)
    if training and 0.0 < self.recurrent_dropout < 1.0:
      prev_output = prev_output * self.get_recurrent_dropout_mask(prev_output)
    output = self.layernorm(ops.matmul(sequence, self.kernel) +
                            ops.matmul(prev_output, self.recurrent_kernel))
    if self.bias is not None:
      output = output + self.bias
    if self.activation is not None:
      output = self.activation(output)
    return output, ([output] if isinstance(states, (list, tuple)) else output)

  def get_config(self):
    norm = self.layernorm
    return {
        **super().get_config(),
        "layernorm_epsilon": self.layernorm_epsilon,
        "gamma_initializer": keras.initializers.serialize(
            norm.gamma_initializer),
        "gamma_regularizer": keras.regularizers.serialize(
            norm.gamma_regularizer),
        "gamma_constraint": keras.constraints.serialize(
            norm.gamma_constraint),
    }


built_in.BUILT_IN_CELLS[LayerNormLSTMCell] = built_in.BuiltInCell(
    lambda cell: "layer_norm_lstm", built_in.KERAS_GATES,
    extra_weights=lambda cell: {
        f"{part}_{weight}": getattr(getattr(cell, f"{part}_norm"), weight)
        for part in ("kernel", "recurrent", "state")
        for weight in ("gamma", "beta")},
    options=lambda cell: {"norm_epsilon": cell.norm_epsilon})
built_in.BUILT_IN_CELLS[LayerNormSimpleRNNCell] = built_in.BuiltInCell(
    lambda cell: "layer_norm_simple_rnn",
    {"activation": keras.activations.tanh},
    extra_weights=lambda cell: {"gamma": cell.layernorm.gamma},
    options=lambda cell: {"norm_epsilon": cell.layernorm_epsilon})


@keras.saving.register_keras_serializable(package="tf_recurrent")
class LayerNormLSTM(cell_layers.CellLayer):
  """A layer-norm LSTM layer on tf_recurrent's chunked loops.

  `tf_recurrent.RNN(LayerNormLSTMCell(units, ...))`, taking the cell's
  arguments (those of `keras.layers.LSTM` but `use_cudnn`, plus the
  `norm_*` ones) and the layer's (`return_sequences`, `return_state`,
  `go_backwards`, `stateful`, `unroll`, `zero_output_for_mask`,
  `recompute`). With the default activations it runs the chunked loop pair
  with a hand-written gradient (masks, dropout, `recompute`), keeping per
  step only h and c (`recompute=True`: only h); any other activation runs
  the cell step by step.

  Example:

  >>> import tensorflow as tf
  >>> import tf_recurrent
  >>> layer = tf_recurrent.LayerNormLSTM(8, return_sequences=True)
  >>> layer(tf.ones([2, 5, 3])).shape
  TensorShape([2, 5, 8])
  >>> layer.get_config()["norm_epsilon"]
  0.001
  """

  cell_class = LayerNormLSTMCell
  cell_name = "layer_norm_lstm_cell"


@keras.saving.register_keras_serializable(package="tf_recurrent")
class LayerNormSimpleRNN(cell_layers.CellLayer):
  """A layer-norm SimpleRNN layer on tf_recurrent's chunked loops.

  `tf_recurrent.RNN(LayerNormSimpleRNNCell(units, ...))`, taking the cell's
  arguments and the layer's (see `LayerNormLSTM`). With tanh it runs the
  chunked loop pair, keeping nothing per step but its outputs.

  Example:

  >>> import tensorflow as tf
  >>> import tf_recurrent
  >>> tf_recurrent.LayerNormSimpleRNN(8)(tf.ones([2, 5, 3])).shape
  TensorShape([2, 8])
  """

  cell_class = LayerNormSimpleRNNCell
  cell_name = "layer_norm_simple_rnn_cell"
