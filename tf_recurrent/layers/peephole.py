"""The peephole LSTM (Gers & Schmidhuber 2000), a cell Keras 3 no longer ships.

`PeepholeLSTMCell` is Keras's `LSTMCell` with diagonal peephole weights
p_i, p_f, p_o, three `[units]` weights in Keras 2's and TF Addons' layout
(`input_gate_peephole_weights`, `forget_gate_peephole_weights`,
`output_gate_peephole_weights`, after the kernel, recurrent kernel and bias),
so `set_weights(keras2_model.get_weights())` and a Keras 2 `.h5` file load;
`peephole` is them stacked `[3, units]`:

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
import numpy as np

from tf_recurrent.engine import built_in
from tf_recurrent.layers import cell_layers
from tf_recurrent.op import unconverted


@keras.saving.register_keras_serializable(package="tf_recurrent")
class PeepholeLSTMCell(unconverted.EntryPoint, keras.layers.LSTMCell):
  """`keras.layers.LSTMCell` with diagonal peephole connections.

  Takes the arguments of `keras.layers.LSTMCell`, plus
  `peephole_initializer` (default "glorot_uniform"), `peephole_regularizer`
  and `peephole_constraint` for the peephole weights p_i, p_f, p_o (Keras
  2's `input_gate_peephole_weights`, `forget_gate_peephole_weights`,
  `output_gate_peephole_weights`, each `[units]`; `peephole` stacks them),
  which scale c_prev in the input and forget gates and the new c in the
  output gate. `set_weights` and loading also take the earlier layout of
  one `[3, units]` weight.

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
    self.peephole_weights = [
        self.add_weight(shape=(self.units,), name=f"{gate}_peephole_weights",
                        initializer=self.peephole_initializer,
                        regularizer=self.peephole_regularizer,
                        constraint=self.peephole_constraint)
        for gate in ("input_gate", "forget_gate", "output_gate")]
    (self.input_gate_peephole_weights, self.forget_gate_peephole_weights,
     self.output_gate_peephole_weights) = self.peephole_weights

  @property
  def peephole(self):
    """p_i, p_f, p_o stacked: `[3, units]`."""
    return ops.stack([p.value for p in self.peephole_weights])

  def _one_peephole_weight(self, weights):
    """`weights` in Keras 2's layout when they hold the earlier layout's one
    `[3, units]` peephole weight last, else as they are."""
    weights = list(weights)
    if (len(weights) == len(self.weights) - 2 and
        tuple(np.shape(weights[-1])) == (3, self.units)):
      return weights[:-1] + list(np.asarray(weights[-1]))
    return weights

  def set_weights(self, weights):
    super().set_weights(self._one_peephole_weight(weights))

  def load_own_variables(self, store):
    values = [store[str(i)] for i in range(len(store.keys()))]
    values = self._one_peephole_weight(values)
    super().load_own_variables({str(i): v for i, v in enumerate(values)})

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
    p_i, p_f, p_o = self.peephole_weights
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
    # A list of the three variables: the engine reads and stacks them.
    extra_weights=lambda cell: {"peephole": cell.peephole_weights})

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

  def set_weights(self, weights):
    """Keras 2's layout (three `[units]` peephole weights), or the earlier
    one `[3, units]` weight."""
    super().set_weights(self.cell._one_peephole_weight(weights))  # pylint: disable=protected-access
