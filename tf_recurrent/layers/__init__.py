"""The Keras layers and the cells Keras 3 lacks.

`rnn.py`: `RNN`, `LSTM`, `GRU`, `SimpleRNN`, `ConvLSTM1D/2D/3D`, Keras's
layers with `inner_loop` running `tf_recurrent.engine`; `cell_layers.py`
the base of the layers of the cells below; `peephole.py`, `projection.py`,
`zoneout.py`, `layer_norm.py` those cells and layers; `linear.py`
(`MinGRU`, `MinLSTM`, `RGLRU`) and `griffin.py` (`GriffinBlock`), the
linear recurrences on `linear/`'s `gated_scan`. Imports `engine/`,
`linear/` and `op/`, never `compat/` or `export/`.
"""
