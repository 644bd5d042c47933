"""Linear recurrences h_t = a_t * h_{t-1} + b_t, with hand-written gradients.

The lowest floor beside `op/` (it imports only `op/`'s accumulators and
structure checks): `chunks.py` the chunk grid and the sequential step
loops; `scan.py` `linear_scan`, a and b given; `gated.py` `gated_scan`,
a and b built from an input sequence by a gate function, trained chunk by
chunk and rebuilt from the inputs in the backward pass (the layers of
`layers/linear.py` run on it).
"""
