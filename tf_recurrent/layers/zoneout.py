"""Zoneout (Krueger et al. 2017) for the LSTM and the GRU, as Tacotron 2 trains.

In training each unit of each state leaf keeps its previous value with
probability `zoneout_h` (h) or `zoneout_c` (an LSTM's c), a fresh draw per
step; otherwise it takes the value the cell computed. At inference every
unit takes the expectation, `rate * previous + (1 - rate) * computed`. The
output is the zoned-out h (the state, as the paper defines it).

`ZoneoutLSTMCell` and `ZoneoutGRUCell` are Keras's cells with that around
their `call` (so they run in `keras.layers.RNN` too, drawing per step);
`ZoneoutLSTM` and `ZoneoutGRU` run them, with the default activations, on
`tf_recurrent.chunked.sequence`'s chunked loops with a hand-written gradient,
drawing a call's masks up front (`[T, B, units]` per leaf, from the cell's
seed generator: reproducible from `seed`, other numbers than the per-step
draws of `keras.layers.RNN`).
"""

from typing import Any, Dict

import keras
from keras import ops

from tf_recurrent.engine import built_in
from tf_recurrent.layers import cell_layers
from tf_recurrent.op import unconverted


def _check_rate(name: str, rate: Any) -> float:
  if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (
      0.0 <= rate <= 1.0):
    raise ValueError(f"{name} must be a float in [0, 1]; got {rate!r}.")
  return float(rate)


class _Zoneout(unconverted.EntryPoint):
  """What both cells share: the rates, the keep masks, the zoned state."""

  def _init_zoneout(self, rates: Dict[str, Any]) -> None:
    self.zoneout_rates = {leaf: _check_rate(f"zoneout_{leaf}", rate)
                          for leaf, rate in rates.items()}

  def zoneout_keep(self, leaf: str, shape, dtype, training: bool):
    """Where a unit keeps its previous value: a bool mask of `shape` in
    training (drawn from the cell's seed generator), else the rate (in
    `dtype`)."""
    rate = self.zoneout_rates[leaf]
    if training and rate > 0.0:
      return keras.random.uniform(shape, seed=self.seed_generator) < rate
    return ops.full(shape, rate, dtype)

  def _zoned(self, leaves, previous, computed, training):
    return [ops.cast(self.zoneout_keep(leaf, ops.shape(p), p.dtype, training),
                     p.dtype) * (p - n) + n
            for leaf, p, n in zip(leaves, previous, computed)]

  def run_inputs(self, steps, state0, training) -> Dict[str, Any]:
    """`sequence.run`'s time-major zoneout masks for `steps` steps."""
    return {"zoneout": {
        leaf: self.zoneout_keep(leaf, (steps,) + tuple(ops.shape(s)), s.dtype,
                                bool(training))
        for leaf, s in zip(self.zoneout_rates, state0)}}

  def _zoneout_config(self) -> Dict[str, float]:
    return {f"zoneout_{leaf}": rate
            for leaf, rate in self.zoneout_rates.items()}


@keras.saving.register_keras_serializable(package="tf_recurrent")
class ZoneoutLSTMCell(_Zoneout, keras.layers.LSTMCell):
  """`keras.layers.LSTMCell` with zoneout on h and c.

  Takes the arguments of `keras.layers.LSTMCell`, plus `zoneout_h` and
  `zoneout_c` (floats in [0, 1], default 0: the probability that a unit
  keeps its previous value in a training step; Tacotron 2 uses 0.1 for
  both).

  Example:

  >>> import keras
  >>> import tensorflow as tf
  >>> import tf_recurrent
  >>> cell = tf_recurrent.ZoneoutLSTMCell(4, zoneout_h=0.1, zoneout_c=0.1)
  >>> keras.layers.RNN(cell)(tf.ones([2, 5, 3])).shape
  TensorShape([2, 4])
  """

  def __init__(self, units, zoneout_h=0.0, zoneout_c=0.0, **kwargs):
    super().__init__(units, **kwargs)
    self._init_zoneout({"h": zoneout_h, "c": zoneout_c})

  def call(self, inputs, states, training=False):
    _, computed = super().call(inputs, states, training=training)
    h, c = self._zoned(("h", "c"), states, computed, training)
    return h, [h, c]

  def get_config(self):
    return {**super().get_config(), **self._zoneout_config()}


@keras.saving.register_keras_serializable(package="tf_recurrent")
class ZoneoutGRUCell(_Zoneout, keras.layers.GRUCell):
  """`keras.layers.GRUCell` with zoneout on h.

  Takes the arguments of `keras.layers.GRUCell`, plus `zoneout_h` (a float
  in [0, 1], default 0: the probability that a unit keeps its previous
  value in a training step).

  Example:

  >>> import keras
  >>> import tensorflow as tf
  >>> import tf_recurrent
  >>> cell = tf_recurrent.ZoneoutGRUCell(4, zoneout_h=0.1)
  >>> keras.layers.RNN(cell)(tf.ones([2, 5, 3])).shape
  TensorShape([2, 4])
  """

  def __init__(self, units, zoneout_h=0.0, **kwargs):
    super().__init__(units, **kwargs)
    self._init_zoneout({"h": zoneout_h})

  def call(self, inputs, states, training=False):
    nested = isinstance(states, (list, tuple))
    previous = states[0] if nested else states
    computed, _ = super().call(inputs, states, training=training)
    (h,) = self._zoned(("h",), [previous], [computed], training)
    return h, ([h] if nested else h)

  def get_config(self):
    return {**super().get_config(), **self._zoneout_config()}


built_in.BUILT_IN_CELLS[ZoneoutLSTMCell] = built_in.BuiltInCell(
    lambda cell: "lstm", built_in.KERAS_GATES, run_inputs=_Zoneout.run_inputs)
built_in.BUILT_IN_CELLS[ZoneoutGRUCell] = built_in.BuiltInCell(
    built_in.gru_kind, built_in.KERAS_GATES, run_inputs=_Zoneout.run_inputs)


@keras.saving.register_keras_serializable(package="tf_recurrent")
class ZoneoutLSTM(cell_layers.CellLayer):
  """An LSTM layer with zoneout on tf_recurrent's chunked loops.

  `tf_recurrent.RNN(ZoneoutLSTMCell(units, ...))`, taking the cell's
  arguments (those of `keras.layers.LSTM` but `use_cudnn`, plus
  `zoneout_h`, `zoneout_c`) and the layer's (`return_sequences`,
  `return_state`, `go_backwards`, `stateful`, `unroll`,
  `zero_output_for_mask`, `recompute`).

  Example:

  >>> import tensorflow as tf
  >>> import tf_recurrent
  >>> layer = tf_recurrent.ZoneoutLSTM(8, zoneout_h=0.1, zoneout_c=0.1,
  ...                                  return_sequences=True, seed=1)
  >>> layer(tf.ones([2, 5, 3]), training=True).shape
  TensorShape([2, 5, 8])
  """

  cell_class = ZoneoutLSTMCell
  cell_name = "zoneout_lstm_cell"


@keras.saving.register_keras_serializable(package="tf_recurrent")
class ZoneoutGRU(cell_layers.CellLayer):
  """A GRU layer with zoneout on tf_recurrent's chunked loops.

  `tf_recurrent.RNN(ZoneoutGRUCell(units, ...))`, taking the cell's
  arguments (those of `keras.layers.GRU` but `use_cudnn`, plus
  `zoneout_h`) and the layer's (see `ZoneoutLSTM`).

  Example:

  >>> import tensorflow as tf
  >>> import tf_recurrent
  >>> tf_recurrent.ZoneoutGRU(8, zoneout_h=0.1)(tf.ones([2, 5, 3])).shape
  TensorShape([2, 8])
  """

  cell_class = ZoneoutGRUCell
  cell_name = "zoneout_gru_cell"
