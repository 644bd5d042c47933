"""The chunked kinds by name: which `Cell` computes each.

The registry the loop pair reads (`sequence.run(kind, ...)`), kept apart
from the cells' modules so that the loop pair imports the cells and no
cell imports the loop pair.
"""

from typing import Any, Dict, Iterable, Tuple

from tf_recurrent.chunked import cell as cell_lib
from tf_recurrent.chunked import convolutional
from tf_recurrent.chunked import gru
from tf_recurrent.chunked import layer_norm
from tf_recurrent.chunked import lstm
from tf_recurrent.chunked import simple_rnn

CELLS: Dict[str, type] = {
    "lstm": lstm.Lstm,
    "peephole_lstm": lstm.PeepholeLstm,
    "gru": gru.Gru,
    "gru_reset_before": gru.GruResetBefore,
    "simple_rnn": simple_rnn.SimpleRnn,
    "layer_norm_lstm": layer_norm.LayerNormLstm,
    "layer_norm_simple_rnn": layer_norm.LayerNormSimpleRnn,
    "conv_lstm": convolutional.ConvLstm,
}


def make(spec: Tuple[str, float, Any], recompute: bool, use_xla: bool,
         weights: Iterable[str]) -> cell_lib.Cell:
  """The math of `spec`, `(kind, epsilon, geometry)`, given the weights'
  names."""
  kind, epsilon, geometry = spec
  return CELLS[kind](recompute, use_xla, epsilon, weights, geometry)
