"""The Elman RNN's math (Keras's `SimpleRNNCell`, tanh) for the chunked
loops."""

import tensorflow as tf

from tf_recurrent.chunked import cell as cell_lib


class SimpleRnn(cell_lib.Cell):
  """Elman math (Keras SimpleRNN, tanh): `h = tanh(x W + b + h U)`.

  Weights: kernel `[D, H]`, recurrent_kernel `[H, H]`, bias `[H]`. Nothing
  is kept but the outputs: the gradient of tanh reads h itself.
  """

  gates = 1

  def step(self, w, state, projected):
    h1 = tf.tanh(projected + w["recurrent"](state[0]))
    return (h1,), {"h": h1}

  def prepare(self, w, kept, entry, x_block, mask_block):
    del w, x_block, mask_block  # A masked step's dz is zero: its h unused.
    return {"h": kept["h"], "h_prev": cell_lib.shift_in(entry[0], kept["h"])}

  def grad_step(self, w, prep, j, dstate):
    dz = tf.raw_ops.TanhGrad(y=prep["h"][j], dy=dstate[0])
    return (w["recurrent"].input_grad(dz),), dz
