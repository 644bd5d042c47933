"""Layers that run one cell class, configured by the cell's own arguments.

Keras's `LSTM` is `RNN(LSTMCell(...))` with a flat constructor and a flat
config; `CellLayer` gives the cells Keras 3 no longer ships (peephole,
layer-norm, projected, zoneout) the same: a subclass names its cell class, takes the cell's
arguments and the layer's, and saves one flat config.
"""

from typing import Any, Dict

import keras

from tf_recurrent.layers import rnn

# The recurrent layer's own arguments; every other one is the cell's, but
# the base Layer's, which both take.
_LAYER_ARGS = ("return_sequences", "return_state", "go_backwards",
               "stateful", "unroll", "zero_output_for_mask", "recompute",
               "xla_steps", "activity_regularizer", "name", "input_shape",
               "batch_size", "input_dim", "autocast")
_SHARED_ARGS = ("dtype", "trainable")


def weight_config(cell, weight: str) -> Dict[str, Any]:
  """The config entries of a cell's extra weight: its `<weight>_initializer`,
  `_regularizer` and `_constraint` attributes, serialized."""
  return {
      f"{weight}_initializer": keras.initializers.serialize(
          getattr(cell, f"{weight}_initializer")),
      f"{weight}_regularizer": keras.regularizers.serialize(
          getattr(cell, f"{weight}_regularizer")),
      f"{weight}_constraint": keras.constraints.serialize(
          getattr(cell, f"{weight}_constraint")),
  }


class CellLayer(rnn.RNN):
  """`tf_recurrent.RNN(cell_class(units, **cell arguments), **layer ones)`.

  Subclasses set `cell_class` and `cell_name` (the cell's layer name, as
  Keras's LSTM names its cell "lstm_cell"). Plain built-in cells run the
  chunked loops (`tf_recurrent.chunked.sequence`); the config is flat, the cell's
  arguments next to the layer's, as Keras's `LSTM` saves it.
  """

  cell_class: type = None
  cell_name: str = None

  def __init__(self, units: int, **kwargs):
    cell_args = {k: v for k, v in kwargs.items() if k not in _LAYER_ARGS}
    layer_args = {k: v for k, v in kwargs.items()
                  if k in _LAYER_ARGS or k in _SHARED_ARGS}
    cell = self.cell_class(units, name=self.cell_name, **cell_args)
    super().__init__(cell, **layer_args)
    self.input_spec = keras.layers.InputSpec(ndim=3)

  @property
  def units(self) -> int:
    return self.cell.units

  def get_config(self) -> Dict[str, Any]:
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
