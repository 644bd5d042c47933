"""Griffin's recurrent block (De et al. 2024, arXiv 2402.19427, figure 2):

    y_t = W_out (gelu(x_t W_gate + b_gate) * RG-LRU(conv(x W_in + b_in))_t)
          + b_out

where conv is a causal depthwise temporal convolution of width 4 and the
RG-LRU is `tf_recurrent.RGLRU`'s. Over a sequence the three projections,
the GeLU and the convolution run at once (autodiff), the RG-LRU as
`gated_scan`'s chunked custom gradient. The one-step call's state is the
RG-LRU's h and the convolution's last `conv_width - 1` inputs.
"""

from typing import Union

import keras
import tensorflow as tf

from tf_recurrent.layers import linear
from tf_recurrent.linear import gated


def _gelu(x):
  # RecurrentGemma's (jax.nn.gelu's default): the tanh approximation.
  return tf.nn.gelu(x, approximate=True)


def causal_conv(padded: tf.Tensor, kernel: tf.Tensor, bias, steps):
  """Row t: sum_i kernel[i] * padded[:, t + i] + bias, t < steps: a causal
  depthwise convolution of inputs `padded` `[B, W - 1 + T, H]` whose first
  W - 1 rows are the inputs before the sequence. Summed in the order the
  one-step call sums, so both give the same numbers."""
  width = kernel.shape[0]
  total = None
  for i in range(width):
    term = padded[:, i:i + steps] * kernel[i]
    total = term if total is None else total + term
  return total if bias is None else total + bias


@keras.saving.register_keras_serializable(package="tf_recurrent")
class GriffinBlockCell(linear.RGLRUCell):
  """One step of Griffin's recurrent block; states `[h, conv window]`, the
  window the last `conv_width - 1` projected inputs, oldest first,
  flattened to `(conv_width - 1) * lru_width`.

  Example:

  >>> cell = GriffinBlockCell(4, lru_width=6)
  >>> y, states = cell(tf.ones([2, 3]), cell.get_initial_state(2))
  >>> y.shape, [s.shape for s in states]
  (TensorShape([2, 4]), [TensorShape([2, 6]), TensorShape([2, 18])])
  """

  def __init__(self, units: int, lru_width=None, conv_width: int = 4,
               **kwargs):
    lru_width = units if lru_width is None else lru_width
    if isinstance(conv_width, bool) or not isinstance(conv_width, int) or (
        conv_width < 2):
      raise ValueError(f"conv_width must be an int >= 2; got {conv_width!r}.")
    super().__init__(lru_width, **kwargs)
    self.model_units, self.lru_width, self.conv_width = units, lru_width, conv_width
    self.state_size = [lru_width, (conv_width - 1) * lru_width]
    self.output_size = units

  def build(self, input_shape):
    features = input_shape[-1]
    super().build(input_shape[:-1] + (self.lru_width,))

    def weight(name, shape, kind):
      if kind == "bias" and not self.use_bias:
        return None
      return self.add_weight(
          shape=shape, name=name,
          initializer=getattr(self, f"{kind}_initializer"),
          regularizer=getattr(self, f"{kind}_regularizer"),
          constraint=getattr(self, f"{kind}_constraint"))

    self.gate_kernel = weight("gate_kernel", (features, self.lru_width),
                              "kernel")
    self.gate_bias = weight("gate_bias", (self.lru_width,), "bias")
    self.input_kernel = weight("input_kernel", (features, self.lru_width),
                               "kernel")
    self.input_bias = weight("input_bias", (self.lru_width,), "bias")
    self.conv_kernel = weight("conv_kernel", (self.conv_width,
                                              self.lru_width), "kernel")
    self.conv_bias = weight("conv_bias", (self.lru_width,), "bias")
    self.output_kernel = weight("output_kernel", (self.lru_width,
                                                  self.model_units), "kernel")
    self.output_bias = weight("output_bias", (self.model_units,), "bias")

  def branches(self, x):
    """(the GeLU branch, the convolution's inputs) of x `[..., D]`."""
    gate = _gelu(linear.dense(x, self.read(self.gate_kernel),
                              self.read(self.gate_bias)))
    return gate, linear.dense(x, self.read(self.input_kernel),
                              self.read(self.input_bias))

  def output(self, gate, h):
    return linear.dense(gate * h, self.read(self.output_kernel),
                        self.read(self.output_bias))

  def call(self, inputs, states):
    h, window = states
    gate, u = self.branches(inputs)
    window = tf.reshape(window, [-1, self.conv_width - 1, self.lru_width])
    padded = tf.concat([window, u[:, None]], axis=1)
    conv = causal_conv(padded, self.read(self.conv_kernel),
                       self.read(self.conv_bias), 1)[:, 0]
    h, _ = super().call(conv, [h])
    new_window = tf.reshape(padded[:, 1:],
                            [-1, (self.conv_width - 1) * self.lru_width])
    return self.output(gate, h), [h, new_window]

  def get_initial_state(self, batch_size=None):
    return [tf.zeros([batch_size, size], self.compute_dtype)
            for size in self.state_size]

  def get_config(self):
    config = super().get_config()
    config["units"] = self.model_units
    return {**config, "lru_width": self.lru_width,
            "conv_width": self.conv_width}


@keras.saving.register_keras_serializable(package="tf_recurrent")
class GriffinBlock(linear.LinearRNN):
  """Griffin's recurrent block as a Keras RNN layer (see the module's doc).

  Args:
    units: The output's width (Griffin's model width).
    lru_width: The RG-LRU's width (default `units`).
    conv_width: The causal convolution's width (Griffin: 4).
    use_bias, kernel_initializer, bias_initializer, kernel_regularizer,
      bias_regularizer, kernel_constraint, bias_constraint: Of every
      projection and the convolution.
    decay_initializer: The RG-LRU's Lambda's (default `RGLRUDecay()`).
    return_sequences, return_state, go_backwards, stateful,
      zero_output_for_mask: Keras's RNN's. A masked step carries the whole
      state (h and the convolution's window: the convolution sees the
      unmasked steps only).
    chunk_size: Steps per chunk of the RG-LRU's loop ("auto": 64).

  Example:

  >>> import tf_recurrent
  >>> block = tf_recurrent.GriffinBlock(4, return_sequences=True)
  >>> block(tf.ones([2, 5, 3])).shape
  TensorShape([2, 5, 4])
  >>> y, states = block.step(tf.ones([2, 3]), block.get_initial_state(2))
  >>> y.shape
  TensorShape([2, 4])
  """

  def __init__(self, units: int, chunk_size: Union[str, int] = "auto",
               **kwargs):
    layer_kwargs, cell_kwargs = linear.split_arguments(kwargs)
    super().__init__(linear.make_cell(GriffinBlockCell, units, layer_kwargs,
                                  cell_kwargs), chunk_size=chunk_size,
                     **layer_kwargs)

  @property
  def units(self):
    return self.cell.model_units

  def inner_loop(self, sequences, initial_state, mask, training=False):
    if tf.nest.is_nested(mask):
      mask = tf.nest.flatten(mask)[0]
    cell = self.cell
    x = sequences
    if self.go_backwards:  # Run in Keras's order: the reversed sequence.
      x = tf.reverse(x, [1])
      mask = None if mask is None else tf.reverse(tf.cast(mask, tf.bool), [1])
    h0, window0 = initial_state
    gate, u = cell.branches(x)
    steps = tf.shape(x)[1]
    window0 = tf.reshape(tf.cast(window0, u.dtype),
                         [-1, cell.conv_width - 1, cell.lru_width])
    if mask is not None:
      mask = tf.cast(mask, tf.bool)
      # The unmasked steps first, in order: the convolution sees only them.
      order = tf.argsort(tf.cast(tf.logical_not(mask), tf.int32), axis=1,
                         stable=True)
      seen = tf.cumsum(tf.cast(mask, tf.int32), axis=1)
      u = tf.gather(u, order, batch_dims=1)
    padded = tf.concat([window0, u], axis=1)
    conv = causal_conv(padded, cell.read(cell.conv_kernel),
                       cell.read(cell.conv_bias), steps)
    if mask is None:
      window = padded[:, -(cell.conv_width - 1):]
    else:
      conv = tf.gather(conv, tf.maximum(seen - 1, 0), batch_dims=1)
      window = tf.gather(
          padded, seen[:, -1:] + tf.range(cell.conv_width - 1)[None],
          batch_dims=1)
    h, last = gated.gated_scan(
        type(cell).gate_function, conv, cell.gate_weights(), h0, mask=mask,
        chunk_size=self.chunk_size)
    outputs = cell.output(gate, h)
    if mask is not None and not self.zero_output_for_mask:
      # Keras's carried output: the last unmasked step's (zeros before).
      carried = tf.gather(outputs, tf.gather(order, tf.maximum(seen - 1, 0),
                                             batch_dims=1), batch_dims=1)
      outputs = tf.where((seen > 0)[:, :, None], carried,
                         tf.zeros_like(carried))
    elif mask is not None:
      outputs = linear.keras_outputs(outputs, mask, True)
    window = tf.reshape(window, [-1, (cell.conv_width - 1) * cell.lru_width])
    return outputs[:, -1], outputs, [last, window]
