"""Keras layers of linear recurrences: `MinGRU`, `MinLSTM`, `RGLRU`.

Each is a `keras.layers.RNN` with a cell of its own (the one-step call,
O(1) state: `layer.step(x_t, states)` or `layer.cell`), whose `inner_loop`
runs the whole sequence through `tf_recurrent.linear.gated_scan`: the gate
projections, activations and the recurrence h_t = a_t h_{t-1} + b_t as
one chunked custom gradient that keeps only h and rebuilds each chunk's
gates from x in the backward pass. A cell supplies its gate function
(`gate_function(x, *gate_weights) -> (a, b)`, module-level, the same for
the step and the sequence). Keras's RNN supplies the rest:
`return_sequences`, `return_state`, `go_backwards`, `stateful`, masks
(a masked step carries h; outputs as Keras's RNN gives them),
`keras.layers.Bidirectional`, `get_config`, saving.

The equations: minGRU and minLSTM, Feng et al. 2024 ("Were RNNs All We
Needed?", arXiv 2410.01201), in linear space with the paper's g; the
RG-LRU, De et al. 2024 (Griffin, arXiv 2402.19427). docs/linear.md has
them all.
"""

from typing import Any, Dict, List, Union

import keras
import tensorflow as tf

from tf_recurrent.linear import chunks
from tf_recurrent.linear import gated

# RG-LRU's fixed scale of the decay's exponent (Griffin, section 2.4).
RGLRU_C = 8.0


def dense(x: tf.Tensor, kernel: tf.Tensor, bias=None) -> tf.Tensor:
  """x @ kernel (+ bias) over the last axis, any leading axes."""
  y = tf.tensordot(x, kernel, 1)
  y.set_shape(x.shape[:-1].concatenate(kernel.shape[-1:]))
  return y if bias is None else y + bias


def min_g(x: tf.Tensor) -> tf.Tensor:
  """The minGRU/minLSTM paper's g: x + 0.5 for x >= 0, sigmoid(x) below."""
  return tf.where(x >= 0, x + 0.5, tf.sigmoid(x))


def _preactivations(x, kernel, bias, parts):
  """The gates' pre-activations, split in `parts`, in the recurrence's
  dtype (float32 for half-precision layers: the GEMM runs in the compute
  dtype, the activations and the recurrence in float32)."""
  z = dense(x, kernel, bias)
  return tf.split(tf.cast(z, chunks.accumulation_dtype(z.dtype)), parts, -1)


def min_gru_gates(x, kernel, bias=None):
  """minGRU: z = sigmoid(k_z), a = 1 - z, b = z * g(k_h)."""
  k_z, k_h = _preactivations(x, kernel, bias, 2)
  z = tf.sigmoid(k_z)
  return tf.sigmoid(-k_z), z * min_g(k_h)


def min_lstm_gates(x, kernel, bias=None):
  """minLSTM: f' = f / (f + i), i' = i / (f + i) (f = sigmoid(k_f), i =
  sigmoid(k_i)), a = f', b = i' g(k_h). f' = sigmoid(log f - log i), with
  log sigmoid(k) = -softplus(-k): no division."""
  k_f, k_i, k_h = _preactivations(x, kernel, bias, 3)
  log_ratio = tf.math.softplus(-k_i) - tf.math.softplus(-k_f)
  return tf.sigmoid(log_ratio), tf.sigmoid(-log_ratio) * min_g(k_h)


def rglru_gates(x, kernel, bias, decay):
  """RG-LRU: r = sigmoid(k_a), i = sigmoid(k_x), a = sigmoid(decay)^(c r),
  b = sqrt(1 - a^2) (i x). log a = -c r softplus(-decay), and
  1 - a^2 = -tanh(log a) (1 + a^2) (as exp(y) - 1 = tanh(y/2) (exp(y) +
  1)): accurate where a is close to 1, where 1 - a * a cancels, and made of
  ops TFLite and ONNX have (expm1 is in neither)."""
  k_a, k_x = _preactivations(x, kernel, bias, 2)
  log_a = -RGLRU_C * tf.sigmoid(k_a) * tf.math.softplus(
      -tf.cast(decay, k_a.dtype))
  a = tf.exp(log_a)
  scale = tf.sqrt(-tf.tanh(log_a) * (1.0 + a * a))
  return a, scale * (tf.sigmoid(k_x) * tf.cast(x, k_a.dtype))


def rglru_gates_no_bias(x, kernel, decay):
  return rglru_gates(x, kernel, None, decay)


@keras.saving.register_keras_serializable(package="tf_recurrent")
class RGLRUDecay(keras.initializers.Initializer):
  """Griffin's initialisation of the RG-LRU's Lambda: a^c uniform in
  [min_value, max_value] (a = sigmoid(Lambda), c = 8).

  Example:

  >>> import numpy as np
  >>> decay = RGLRUDecay(seed=0)(shape=(1000,))
  >>> a_c = tf.sigmoid(decay) ** 8
  >>> 0.9 <= float(tf.reduce_min(a_c)) and float(tf.reduce_max(a_c)) <= 0.999
  True
  """

  def __init__(self, min_value: float = 0.9, max_value: float = 0.999,
               seed=None):
    if not 0.0 < min_value <= max_value < 1.0:
      raise ValueError("RGLRUDecay: need 0 < min_value <= max_value < 1; got "
                       f"{min_value}, {max_value}.")
    self.min_value, self.max_value, self.seed = min_value, max_value, seed

  def __call__(self, shape, dtype=None):
    a_c = keras.random.uniform(shape, self.min_value, self.max_value,
                               dtype="float32", seed=self.seed)
    log_a = tf.math.log(a_c) / RGLRU_C
    # Lambda = logit(a) = log a - log(1 - a).
    decay = log_a - tf.math.log(-tf.math.expm1(log_a))
    return tf.cast(decay, dtype or "float32")

  def get_config(self):
    return {"min_value": self.min_value, "max_value": self.max_value,
            "seed": self.seed}


class LinearCell(keras.layers.Layer):
  """The base of the linear layers' cells: one step h = a * h + b with
  `(a, b) = gate_function(x, *gate_weights())`.

  Subclasses set `gate_function` (module-level), `gate_count` (the gate
  kernel's blocks of `units` columns) and may add weights.
  """

  gate_count = 2

  def __init__(self, units: int, use_bias: bool = True,
               kernel_initializer="glorot_uniform", bias_initializer="zeros",
               kernel_regularizer=None, bias_regularizer=None,
               kernel_constraint=None, bias_constraint=None, **kwargs):
    super().__init__(**kwargs)
    if isinstance(units, bool) or not isinstance(units, int) or units < 1:
      raise ValueError(f"units must be a positive int; got {units!r}.")
    self.units = units
    self.use_bias = bool(use_bias)
    self.kernel_initializer = keras.initializers.get(kernel_initializer)
    self.bias_initializer = keras.initializers.get(bias_initializer)
    self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
    self.bias_regularizer = keras.regularizers.get(bias_regularizer)
    self.kernel_constraint = keras.constraints.get(kernel_constraint)
    self.bias_constraint = keras.constraints.get(bias_constraint)
    self.state_size = units
    self.output_size = units

  def build(self, input_shape):
    self.kernel = self.add_weight(
        shape=(input_shape[-1], self.gate_count * self.units), name="kernel",
        initializer=self.kernel_initializer,
        regularizer=self.kernel_regularizer,
        constraint=self.kernel_constraint)
    self.bias = None
    if self.use_bias:
      self.bias = self.add_weight(
          shape=(self.gate_count * self.units,), name="bias",
          initializer=self.bias_initializer, regularizer=self.bias_regularizer,
          constraint=self.bias_constraint)

  def read(self, variable):
    """A weight read in the compute dtype (None stays None)."""
    return (None if variable is None else
            tf.cast(tf.convert_to_tensor(variable), self.compute_dtype))

  def _weights_in_compute_dtype(self, variables) -> List[tf.Tensor]:
    return [self.read(v) for v in variables if v is not None]

  def gate_weights(self) -> List[tf.Tensor]:
    """The tensors `gate_function` reads after x, in the compute dtype."""
    return self._weights_in_compute_dtype([self.kernel, self.bias])

  def call(self, inputs, states):
    """One step: `(h, [h])` from `inputs` `[B, D]` and `states` `[h]`."""
    h = states[0] if isinstance(states, (list, tuple)) else states
    a, b = type(self).gate_function(inputs, *self.gate_weights())
    h = tf.cast(a * tf.cast(h, a.dtype) + b, self.compute_dtype)
    return h, [h]

  def get_initial_state(self, batch_size=None):
    return [tf.zeros([batch_size, self.units], self.compute_dtype)]

  def get_config(self):
    return {
        **super().get_config(), "units": self.units,
        "use_bias": self.use_bias,
        "kernel_initializer": keras.initializers.serialize(
            self.kernel_initializer),
        "bias_initializer": keras.initializers.serialize(
            self.bias_initializer),
        "kernel_regularizer": keras.regularizers.serialize(
            self.kernel_regularizer),
        "bias_regularizer": keras.regularizers.serialize(
            self.bias_regularizer),
        "kernel_constraint": keras.constraints.serialize(
            self.kernel_constraint),
        "bias_constraint": keras.constraints.serialize(self.bias_constraint),
    }


class _MinCell(LinearCell):
  """minGRU/minLSTM's initial state: g(0) = 0.5, the paper's h_0 = 0 passed
  through g (its code applies g to h_0)."""

  def get_initial_state(self, batch_size=None):
    return [tf.fill([batch_size, self.units],
                    tf.constant(0.5, self.compute_dtype))]


@keras.saving.register_keras_serializable(package="tf_recurrent")
class MinGRUCell(_MinCell):
  """minGRU's step: z = sigmoid(x W_z + b_z), h~ = g(x W_h + b_h),
  h = (1 - z) h + z h~.

  Example:

  >>> cell = MinGRUCell(4)
  >>> h, states = cell(tf.ones([2, 3]), [tf.zeros([2, 4])])
  >>> h.shape
  TensorShape([2, 4])
  """
  gate_count = 2

  @staticmethod
  def gate_function(x, kernel, bias=None):
    return min_gru_gates(x, kernel, bias)


@keras.saving.register_keras_serializable(package="tf_recurrent")
class MinLSTMCell(_MinCell):
  """minLSTM's step: f = sigmoid(x W_f + b_f), i = sigmoid(x W_i + b_i),
  h~ = g(x W_h + b_h), h = f/(f+i) h + i/(f+i) h~.

  Example:

  >>> MinLSTMCell(4)(tf.ones([2, 3]), [tf.zeros([2, 4])])[0].shape
  TensorShape([2, 4])
  """
  gate_count = 3

  @staticmethod
  def gate_function(x, kernel, bias=None):
    return min_lstm_gates(x, kernel, bias)


@keras.saving.register_keras_serializable(package="tf_recurrent")
class RGLRUCell(LinearCell):
  """The RG-LRU's step (Griffin): r = sigmoid(x W_a + b_a), i = sigmoid(x
  W_x + b_x), a = sigmoid(Lambda)^(8 r), h = a h + sqrt(1 - a^2) (i x).
  Its inputs have `units` features (x multiplies i elementwise).

  Example:

  >>> RGLRUCell(3)(tf.ones([2, 3]), [tf.zeros([2, 3])])[0].shape
  TensorShape([2, 3])
  """
  gate_count = 2

  def __init__(self, units: int, decay_initializer=None, **kwargs):
    super().__init__(units, **kwargs)
    self.decay_initializer = keras.initializers.get(
        decay_initializer or RGLRUDecay())

  def build(self, input_shape):
    if input_shape[-1] is not None and input_shape[-1] != self.units:
      raise ValueError(
          f"{self.name}: the RG-LRU multiplies its input by a gate of "
          f"`units`={self.units} features, so the inputs must have "
          f"{self.units} features; got input shape {tuple(input_shape)}.")
    super().build(input_shape)
    self.decay = self.add_weight(shape=(self.units,), name="decay",
                                 initializer=self.decay_initializer)

  def gate_weights(self):
    # Lambda stays in the variable's dtype: a near 1 needs its precision.
    return self._weights_in_compute_dtype([self.kernel, self.bias]) + [
        tf.convert_to_tensor(self.decay)]

  @staticmethod
  def gate_function(x, kernel, *rest):
    return (rglru_gates(x, kernel, *rest) if len(rest) == 2 else
            rglru_gates_no_bias(x, kernel, *rest))

  def get_config(self):
    return {**super().get_config(), "decay_initializer":
            keras.initializers.serialize(self.decay_initializer)}


def keras_outputs(outputs: tf.Tensor, mask, zero_output_for_mask: bool):
  """The outputs Keras's RNN gives at masked steps (in processing order):
  zeros (`zero_output_for_mask`), else the last unmasked step's output
  (zeros before the first one). Rows of unmasked steps are kept."""
  if mask is None:
    return outputs
  keep = mask if zero_output_for_mask else (
      tf.cumsum(tf.cast(mask, tf.int32), axis=1) > 0)
  return tf.where(keep[:, :, None], outputs, tf.zeros_like(outputs))


class LinearRNN(keras.layers.RNN):
  """The base of the linear recurrent layers: Keras's RNN with
  `inner_loop` running `gated_scan` over the whole sequence.

  `chunk_size`: steps per chunk of the loop ("auto": 64); the numbers do
  not depend on it. `unroll=True` is refused (the loop is the point).
  """

  def __init__(self, cell, return_sequences=False, return_state=False,
               go_backwards=False, stateful=False, unroll=False,
               zero_output_for_mask=False, chunk_size: Union[str, int] = "auto",
               **kwargs):
    if unroll:
      raise ValueError(f"{type(self).__name__} runs its own chunked loop; "
                       "unroll=True is not supported.")
    self.chunk_size = chunk_size
    chunks.check_chunk_size(chunk_size)
    super().__init__(cell, return_sequences=return_sequences,
                     return_state=return_state, go_backwards=go_backwards,
                     stateful=stateful, unroll=False,
                     zero_output_for_mask=zero_output_for_mask, **kwargs)
    self.supports_jit = True

  @property
  def units(self):
    return self.cell.units

  def step(self, inputs, states):
    """One step for serving: `(output, states)` from `inputs` `[B, D]` and
    the states (`layer.get_initial_state(B)` to start): O(1) state."""
    return self.cell(inputs, list(states))

  def reset_state(self):
    if self.states is not None:
      batch = tf.nest.flatten(self.states)[0].shape[0]
      for variable, value in zip(tf.nest.flatten(self.states),
                                 self.get_initial_state(batch)):
        variable.assign(tf.cast(value, variable.dtype))

  def inner_loop(self, sequences, initial_state, mask, training=False):
    if tf.nest.is_nested(mask):
      mask = tf.nest.flatten(mask)[0]
    cell = self.cell
    h, last = gated.gated_scan(
        type(cell).gate_function, sequences, cell.gate_weights(),
        initial_state[0], mask=mask, reverse=self.go_backwards,
        chunk_size=self.chunk_size)
    if self.go_backwards:  # Keras's order: the steps as they were run.
      h = tf.reverse(h, [1])
      mask = None if mask is None else tf.reverse(mask, [1])
    outputs = keras_outputs(h, mask, self.zero_output_for_mask)
    last_output = last if mask is None else outputs[:, -1]
    return last_output, outputs, [last]

  def get_config(self):
    config = super().get_config()
    cell_config = self.cell.get_config()
    for key in ("name", "trainable", "dtype"):
      cell_config.pop(key, None)
    del config["cell"]
    return {**config, **cell_config, "chunk_size": self.chunk_size}

  @classmethod
  def from_config(cls, config, custom_objects=None):
    return cls(**config)


_RNN_ARGS = ("return_sequences", "return_state", "go_backwards", "stateful",
             "unroll", "zero_output_for_mask", "chunk_size")


def split_arguments(kwargs: Dict[str, Any]):
  """Keyword arguments for the layer (Keras's RNN's and Layer's) and for
  the cell (the rest)."""
  layer_keys = set(_RNN_ARGS) | {"name", "dtype", "trainable",
                                 "input_shape", "batch_size",
                                 "activity_regularizer"}
  layer = {k: v for k, v in kwargs.items() if k in layer_keys}
  cell = {k: v for k, v in kwargs.items() if k not in layer_keys}
  return layer, cell


def make_cell(cell_class, units, layer_kwargs, cell_kwargs):
  return cell_class(units, dtype=layer_kwargs.get("dtype"),
                    trainable=layer_kwargs.get("trainable", True),
                    **cell_kwargs)


_LAYER_ARGS_DOC = """
  Args:
    units: The state's (and output's) width.
    use_bias, kernel_initializer, bias_initializer, kernel_regularizer,
      bias_regularizer, kernel_constraint, bias_constraint: Of the fused
      gate kernel `[D, {gates} * units]` and its bias, as Keras's.
    return_sequences, return_state, go_backwards, stateful,
      zero_output_for_mask: Keras's RNN's.
    chunk_size: Steps per chunk of the loop ("auto": 64).
    **kwargs: Keras's Layer's (name, dtype, ...).
"""


@keras.saving.register_keras_serializable(package="tf_recurrent")
class MinGRU(LinearRNN):
  __doc__ = """minGRU (Feng et al. 2024), trained by one chunked custom gradient.

  h_t = (1 - z_t) h_{t-1} + z_t g(x_t W_h + b_h), z_t = sigmoid(x_t W_z +
  b_z): no h in the gates, so the recurrence is linear and all the matrix
  work runs over the whole sequence. The initial state is g(0) = 0.5
  (`get_initial_state`), the paper's h_0 = 0 passed through g; a given
  `initial_state` is the state itself.
""" + _LAYER_ARGS_DOC.format(gates=2) + """
  Example:

  >>> import tf_recurrent
  >>> layer = tf_recurrent.MinGRU(8, return_sequences=True)
  >>> layer(tf.ones([2, 5, 3])).shape
  TensorShape([2, 5, 8])
  >>> h, states = layer.step(tf.ones([2, 3]), layer.get_initial_state(2))
  >>> h.shape
  TensorShape([2, 8])
  """

  def __init__(self, units: int, **kwargs):
    layer_kwargs, cell_kwargs = split_arguments(kwargs)
    super().__init__(make_cell(MinGRUCell, units, layer_kwargs, cell_kwargs),
                     **layer_kwargs)


@keras.saving.register_keras_serializable(package="tf_recurrent")
class MinLSTM(LinearRNN):
  __doc__ = """minLSTM (Feng et al. 2024), trained by one chunked custom gradient.

  h_t = f'_t h_{t-1} + i'_t g(x_t W_h + b_h), f' = f / (f + i), i' = i /
  (f + i), f_t = sigmoid(x_t W_f + b_f), i_t = sigmoid(x_t W_i + b_i).
  Initial state g(0) = 0.5 as for `MinGRU`.
""" + _LAYER_ARGS_DOC.format(gates=3) + """
  Example:

  >>> import tf_recurrent
  >>> tf_recurrent.MinLSTM(8)(tf.ones([2, 5, 3])).shape
  TensorShape([2, 8])
  """

  def __init__(self, units: int, **kwargs):
    layer_kwargs, cell_kwargs = split_arguments(kwargs)
    super().__init__(make_cell(MinLSTMCell, units, layer_kwargs, cell_kwargs),
                     **layer_kwargs)


@keras.saving.register_keras_serializable(package="tf_recurrent")
class RGLRU(LinearRNN):
  __doc__ = """Griffin's real-gated linear recurrent unit (De et al. 2024).

  r_t = sigmoid(x_t W_a + b_a), i_t = sigmoid(x_t W_x + b_x),
  a_t = sigmoid(Lambda)^(8 r_t), h_t = a_t h_{t-1} + sqrt(1 - a_t^2)
  (i_t x_t). The inputs have `units` features. Lambda (`decay`) starts with
  sigmoid(Lambda)^8 uniform in [0.9, 0.999] (`RGLRUDecay`), and stays
  float32 under mixed precision. Initial state zeros.
""" + _LAYER_ARGS_DOC.format(gates=2) + """    decay_initializer: Of
      Lambda (default `RGLRUDecay()`).

  Example:

  >>> import tf_recurrent
  >>> tf_recurrent.RGLRU(3, return_sequences=True)(tf.ones([2, 5, 3])).shape
  TensorShape([2, 5, 3])
  """

  def __init__(self, units: int, **kwargs):
    layer_kwargs, cell_kwargs = split_arguments(kwargs)
    super().__init__(make_cell(RGLRUCell, units, layer_kwargs, cell_kwargs),
                     **layer_kwargs)


