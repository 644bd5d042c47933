"""The built-in cells' chunked loop pair and each cell's math.

`sequence.py` is the loop pair (`run`), which knows a cell only through
`cell.Cell`; `kinds.py` maps kind names to the cells: `lstm.py` (with
peepholes and a projection), `gru.py` (both `reset_after`),
`simple_rnn.py`, `layer_norm.py`, `convolutional.py`. `fused_lstm.py` runs
a small LSTM on TensorFlow's whole-sequence kernels. Imports only `op/`.
"""
