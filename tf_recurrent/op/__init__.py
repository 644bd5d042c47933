"""The recurrent op: `recurrent`, its loops and what they are built from.

The floor every other folder stands on; it imports nothing of theirs.
`op.py` is the op's public face; `loops.py` its forward and backward
loops; `recompute`, `probe`, `seeds`, `lengths`, `accumulators`,
`step_clusters`, `tracing`, `structs` and `masks` their parts;
`bidirectional.py` two runs of the op; `cells.py` hand-written LSTM/GRU/
SimpleRNN steps for it, whose equations the chunked cells share.
"""
