"""A user's own cell for the benchmarks: a layer-norm LSTM written as a plain
`keras.layers.Layer`, as a user would write it (unknown to tf_recurrent, so
it runs on the op's generic path)."""

import keras


@keras.saving.register_keras_serializable(package="benchmarks")
class UserLayerNormLSTMCell(keras.layers.Layer):
  """LSTM whose input and recurrent gate pre-activations, and c, are each
  layer-normalized (`keras.layers.LayerNormalization`): two matmuls and three
  normalizations a step.

  Example:

  >>> import keras, tensorflow as tf
  >>> layer = keras.layers.RNN(UserLayerNormLSTMCell(4))
  >>> layer(tf.ones([2, 5, 3])).shape
  TensorShape([2, 4])
  """

  def __init__(self, units: int, **kwargs):
    super().__init__(**kwargs)
    self.units = units
    self.state_size = [units, units]
    self.output_size = units
    self.norm_x = keras.layers.LayerNormalization()
    self.norm_h = keras.layers.LayerNormalization()
    self.norm_c = keras.layers.LayerNormalization()

  def build(self, input_shape):
    self.kernel = self.add_weight(shape=(input_shape[-1], 4 * self.units),
                                  initializer="glorot_uniform", name="kernel")
    self.recurrent_kernel = self.add_weight(
        shape=(self.units, 4 * self.units), initializer="orthogonal",
        name="recurrent_kernel")
    self.bias = self.add_weight(shape=(4 * self.units,), initializer="zeros",
                                name="bias")
    self.norm_x.build((None, 4 * self.units))
    self.norm_h.build((None, 4 * self.units))
    self.norm_c.build((None, self.units))

  def call(self, inputs, states):
    h, c = states
    z = (self.norm_x(keras.ops.matmul(inputs, self.kernel)) +
         self.norm_h(keras.ops.matmul(h, self.recurrent_kernel)) + self.bias)
    i, f, g, o = keras.ops.split(z, 4, axis=-1)
    c = keras.ops.sigmoid(f) * c + keras.ops.sigmoid(i) * keras.ops.tanh(g)
    h = keras.ops.sigmoid(o) * keras.ops.tanh(self.norm_c(c))
    return h, [h, c]

  def get_config(self):
    return {**super().get_config(), "units": self.units}
