"""Built-in LSTM, GRU and SimpleRNN steps with hand-written gradients.

The input projection `x @ W + b` does not depend on the state, so it is
computed for all T at once outside the loop (one large matmul) and the step
functions receive the projected inputs. Each step saves its gate activations
as extras; the gradient then needs no recompute, only the two matmuls of the
recurrent kernel.

`recomputing` turns either pair into a lean one for long sequences: the
projection moves into the step and the gradient recomputes the gates, so
the op keeps nothing per step but the state.

Gate order follows Keras: LSTM `[i, f, c, o]`, GRU `[z, r, h]` with
`reset_after=True`; SimpleRNN is `tanh(x @ kernel + bias + h @ U)`.

Mixed precision: theta may stay float32 while states and inputs are bfloat16
or float16. The steps cast theta to the state's dtype and the gradients
return dtheta in theta's dtype, so the op accumulates dtheta over the steps
in theta's own float32.
"""

from typing import Any, Dict, Tuple

import tensorflow as tf

from tf_recurrent.op import masks

Tensor = tf.Tensor


def _compute(weight: Tensor, like: Tensor) -> Tensor:
  """`weight` in the compute dtype of `like` (no-op when they agree)."""
  return tf.cast(weight, like.dtype)


def _like(grad: Tensor, weight: Tensor) -> Tensor:
  """A weight's gradient in the weight's own dtype (float32 theta of a
  bfloat16 step): the op sums it over the steps in that dtype."""
  return tf.cast(grad, weight.dtype)


def project_inputs(inputs: Tensor, kernel: Tensor, bias: Tensor) -> Tensor:
  """`inputs @ kernel + bias` for time-major `[T, B, D]` inputs, at once.

  Example:

  >>> x = tf.ones([5, 2, 3])
  >>> project_inputs(x, tf.ones([3, 8]), tf.zeros([8])).shape
  TensorShape([5, 2, 8])
  """
  # One 2-D matmul over all T*B rows: XLA on CPU runs the einsum's batched
  # form and its gradient about 1.4x slower (benchmarks/PROFILE.md).
  shape = tf.shape(inputs)
  flat = tf.reshape(inputs, [-1, shape[-1]])
  projected = tf.matmul(flat, kernel) + bias
  out = tf.reshape(projected, tf.concat([shape[:-1], tf.shape(kernel)[-1:]], 0))
  out.set_shape(inputs.shape[:-1].concatenate(kernel.shape[-1:]))
  return out


# The equations, one home for them: the op's steps below and the layers'
# chunked loops (`tf_recurrent.chunked.sequence`) both read these.


def lstm_state(i: Tensor, f: Tensor, g: Tensor, o: Tensor,
               c: Tensor) -> Tuple[Tensor, Tensor]:
  """`(c1, h1)` of an LSTM step from its gate activations and c."""
  c1 = f * c + i * g
  return c1, o * tf.tanh(c1)


def lstm_gate_grads(i, f, g, o, c_prev, tanh_c1, dh1, dc1):
  """An LSTM step's pre-activation gradients `(dzi, dzf, dzg, dzo)` and the
  gradient of c1 (the carried one plus the one through h1)."""
  dc = dc1 + tf.raw_ops.TanhGrad(y=tanh_c1, dy=dh1 * o)
  return (tf.raw_ops.SigmoidGrad(y=i, dy=dc * g),
          tf.raw_ops.SigmoidGrad(y=f, dy=dc * c_prev),
          tf.raw_ops.TanhGrad(y=g, dy=dc * i),
          tf.raw_ops.SigmoidGrad(y=o, dy=dh1 * tanh_c1)), dc


def gru_gate_grads(z, r, hh, rh, h_prev, dh):
  """A reset-after GRU step's pre-activation gradients `(dz, dr, dhh)`
  (`rh`: the recurrent h-block `h U_h + b_h` the reset gate scales)."""
  dhh = tf.raw_ops.TanhGrad(y=hh, dy=dh * (1.0 - z))
  return (tf.raw_ops.SigmoidGrad(y=z, dy=dh * (h_prev - hh)),
          tf.raw_ops.SigmoidGrad(y=r, dy=dhh * rh), dhh)


def lstm_step(theta: Dict[str, Tensor], state: Dict[str, Tensor],
              projected: Tensor) -> Tuple[Dict[str, Tensor], Dict[str, Tensor]]:
  """One LSTM step on projected inputs: a `cell_fn` for `recurrent`.

  Args:
    theta: `{"recurrent_kernel": [H, 4H]}`.
    state: `{"h": [B, H], "c": [B, H]}`.
    projected: `[B, 4H]`, this step's `x @ kernel + bias`.

  Returns:
    `(state1, extras)`, extras holding the gate activations for `lstm_grad`.

  Example:

  >>> import tf_recurrent
  >>> from tf_recurrent import cells
  >>> theta = {"recurrent_kernel": tf.zeros([4, 16])}
  >>> state0 = {"h": tf.zeros([2, 4]), "c": tf.zeros([2, 4])}
  >>> xw = cells.project_inputs(tf.ones([3, 2, 5]), tf.ones([5, 16]),
  ...                           tf.zeros([16]))
  >>> acc, final = tf_recurrent.recurrent(theta, state0, xw, cells.lstm_step,
  ...                                     cells.lstm_grad)
  >>> acc["h"].shape
  TensorShape([3, 2, 4])
  """
  kernel = _compute(theta["recurrent_kernel"], state["h"])
  z = projected + tf.matmul(state["h"], kernel)
  zi, zf, zg, zo = tf.split(z, 4, axis=-1)
  i, f, o = tf.sigmoid(zi), tf.sigmoid(zf), tf.sigmoid(zo)
  g = tf.tanh(zg)
  c, h = lstm_state(i, f, g, o, state["c"])
  return {"h": h, "c": c}, {"gates": tf.concat([i, f, g, o], axis=-1)}


def lstm_grad(theta: Dict[str, Tensor], state0: Dict[str, Tensor],
              projected: Tensor, extras: Dict[str, Tensor],
              dstate1: Dict[str, Tensor]) -> Tuple[Any, Any, Any]:
  """The hand-written gradient of `lstm_step`: a `cell_grad` for `recurrent`.

  Example:

  >>> theta = {"recurrent_kernel": tf.ones([2, 8])}
  >>> s0 = {"h": tf.ones([1, 2]), "c": tf.ones([1, 2])}
  >>> s1, extras = lstm_step(theta, s0, tf.zeros([1, 8]))
  >>> dtheta, ds0, dx = lstm_grad(theta, s0, tf.zeros([1, 8]), extras,
  ...                             {"h": tf.ones([1, 2]), "c": tf.zeros([1, 2])})
  >>> dx.shape
  TensorShape([1, 8])
  """
  i, f, g, o = tf.split(extras["gates"], 4, axis=-1)
  c1, _ = lstm_state(i, f, g, o, state0["c"])
  tanh_c1 = tf.tanh(c1)
  (dzi, dzf, dzg, dzo), dc = lstm_gate_grads(
      i, f, g, o, state0["c"], tanh_c1, dstate1["h"], dstate1["c"])
  dz = tf.concat([dzi, dzf, dzg, dzo], axis=-1)
  kernel = _compute(theta["recurrent_kernel"], dz)
  dtheta = {"recurrent_kernel": _like(
      tf.matmul(state0["h"], dz, transpose_a=True), theta["recurrent_kernel"])}
  dstate0 = {"h": tf.matmul(dz, kernel, transpose_b=True), "c": dc * f}
  return dtheta, dstate0, dz


def gru_step(theta: Dict[str, Tensor], state: Dict[str, Tensor],
             projected: Tensor) -> Tuple[Dict[str, Tensor], Dict[str, Tensor]]:
  """One GRU step (Keras `reset_after=True`) on projected inputs.

  Args:
    theta: `{"recurrent_kernel": [H, 3H], "recurrent_bias": [3H]}`.
    state: `{"h": [B, H]}`.
    projected: `[B, 3H]`, this step's `x @ kernel + input_bias`.

  Returns:
    `(state1, extras)`, extras holding what `gru_grad` needs.

  Example:

  >>> import tf_recurrent
  >>> theta = {"recurrent_kernel": tf.zeros([4, 12]),
  ...          "recurrent_bias": tf.zeros([12])}
  >>> acc, _ = tf_recurrent.recurrent(theta, {"h": tf.zeros([2, 4])},
  ...                                 tf.ones([3, 2, 12]), gru_step, gru_grad)
  >>> acc["h"].shape
  TensorShape([3, 2, 4])
  """
  recurrent = (tf.matmul(state["h"], _compute(theta["recurrent_kernel"],
                                               state["h"])) +
               _compute(theta["recurrent_bias"], state["h"]))
  xz, xr, xh = tf.split(projected, 3, axis=-1)
  rz, rr, rh = tf.split(recurrent, 3, axis=-1)
  z = tf.sigmoid(xz + rz)
  r = tf.sigmoid(xr + rr)
  hh = tf.tanh(xh + r * rh)
  h = z * state["h"] + (1.0 - z) * hh
  return {"h": h}, {"gates": tf.concat([z, r, hh, rh], axis=-1)}


def gru_grad(theta: Dict[str, Tensor], state0: Dict[str, Tensor],
             projected: Tensor, extras: Dict[str, Tensor],
             dstate1: Dict[str, Tensor]) -> Tuple[Any, Any, Any]:
  """The hand-written gradient of `gru_step`: a `cell_grad` for `recurrent`.

  Example:

  >>> theta = {"recurrent_kernel": tf.ones([2, 6]),
  ...          "recurrent_bias": tf.zeros([6])}
  >>> s0 = {"h": tf.ones([1, 2])}
  >>> _, extras = gru_step(theta, s0, tf.zeros([1, 6]))
  >>> _, ds0, dx = gru_grad(theta, s0, tf.zeros([1, 6]), extras,
  ...                       {"h": tf.ones([1, 2])})
  >>> ds0["h"].shape
  TensorShape([1, 2])
  """
  z, r, hh, rh = tf.split(extras["gates"], 4, axis=-1)
  h0 = state0["h"]
  dh = dstate1["h"]
  dz_pre, dr_pre, dhh_pre = gru_gate_grads(z, r, hh, rh, h0, dh)
  dprojected = tf.concat([dz_pre, dr_pre, dhh_pre], axis=-1)
  drecurrent = tf.concat([dz_pre, dr_pre, dhh_pre * r], axis=-1)
  kernel = _compute(theta["recurrent_kernel"], dh)
  dtheta = {
      "recurrent_kernel": _like(tf.matmul(h0, drecurrent, transpose_a=True),
                                theta["recurrent_kernel"]),
      "recurrent_bias": _like(tf.reduce_sum(drecurrent, axis=0),
                              theta["recurrent_bias"]),
  }
  dh0 = dh * z + tf.matmul(drecurrent, kernel, transpose_b=True)
  return dtheta, {"h": dh0}, dprojected


def simple_rnn_step(theta: Dict[str, Tensor], state: Dict[str, Tensor],
                    projected: Tensor
                    ) -> Tuple[Dict[str, Tensor], Dict[str, Tensor]]:
  """One Elman (Keras SimpleRNN, tanh) step on projected inputs.

  Args:
    theta: `{"recurrent_kernel": [H, H]}`.
    state: `{"h": [B, H]}`.
    projected: `[B, H]`, this step's `x @ kernel + bias`.

  Returns:
    `(state1, extras)`, extras holding h1 for `simple_rnn_grad`.

  Example:

  >>> import tf_recurrent
  >>> theta = {"recurrent_kernel": tf.zeros([4, 4])}
  >>> acc, _ = tf_recurrent.recurrent(theta, {"h": tf.zeros([2, 4])},
  ...                                 tf.ones([3, 2, 4]), simple_rnn_step,
  ...                                 simple_rnn_grad)
  >>> acc["h"].shape
  TensorShape([3, 2, 4])
  """
  kernel = _compute(theta["recurrent_kernel"], state["h"])
  h = tf.tanh(projected + tf.matmul(state["h"], kernel))
  return {"h": h}, {"h": h}


def simple_rnn_grad(theta: Dict[str, Tensor], state0: Dict[str, Tensor],
                    projected: Tensor, extras: Dict[str, Tensor],
                    dstate1: Dict[str, Tensor]) -> Tuple[Any, Any, Any]:
  """The hand-written gradient of `simple_rnn_step`.

  Example:

  >>> theta = {"recurrent_kernel": tf.ones([2, 2])}
  >>> s0 = {"h": tf.ones([1, 2])}
  >>> _, extras = simple_rnn_step(theta, s0, tf.zeros([1, 2]))
  >>> _, ds0, dx = simple_rnn_grad(theta, s0, tf.zeros([1, 2]), extras,
  ...                              {"h": tf.ones([1, 2])})
  >>> dx.shape
  TensorShape([1, 2])
  """
  dpre = tf.raw_ops.TanhGrad(y=extras["h"], dy=dstate1["h"])
  kernel = _compute(theta["recurrent_kernel"], dpre)
  dtheta = {"recurrent_kernel": _like(
      tf.matmul(state0["h"], dpre, transpose_a=True),
      theta["recurrent_kernel"])}
  return dtheta, {"h": tf.matmul(dpre, kernel, transpose_b=True)}, dpre


def recomputing(step, grad):
  """Wraps a (step, grad) pair on projected inputs into a lean pair on raw ones.

  The wrapped step projects its own input row (`x_t @ kernel + bias`) and
  keeps no extras; the wrapped gradient recomputes the step (projection,
  gates) from the state entering it and then applies `grad`. Per time step
  the op then keeps only the state, instead of the state plus the gates and
  the projected inputs and their gradient (about 4x less memory for an
  LSTM), at the cost of one more step forward in the backward pass.

  Args:
    step: A `cell_fn` taking projected inputs, such as `lstm_step`.
    grad: Its `cell_grad`, such as `lstm_grad`.

  Returns:
    `(lean_step, lean_grad)` over theta `{"cell": <step's theta>,
    "kernel": [D, P], "bias": [P]}` and raw `[B, D]` input rows.

  Example:

  >>> import tf_recurrent
  >>> step, grad = recomputing(lstm_step, lstm_grad)
  >>> theta = {"cell": {"recurrent_kernel": tf.zeros([4, 16])},
  ...          "kernel": tf.ones([5, 16]), "bias": tf.zeros([16])}
  >>> state0 = {"h": tf.zeros([2, 4]), "c": tf.zeros([2, 4])}
  >>> acc, _ = tf_recurrent.recurrent(theta, state0, tf.ones([3, 2, 5]), step,
  ...                                 grad)
  >>> acc["c"].shape
  TensorShape([3, 2, 4])
  """

  def project(theta, x_t):
    return (tf.matmul(x_t, _compute(theta["kernel"], x_t)) +
            _compute(theta["bias"], x_t))

  def lean_step(theta, state, x_t):
    state1, _ = step(theta["cell"], state, project(theta, x_t))
    return state1, {}

  def lean_grad(theta, state0, x_t, extras, dstate1):
    del extras  # Nothing is kept: the step runs again.
    projected = project(theta, x_t)
    _, step_extras = step(theta["cell"], state0, projected)
    dcell, dstate0, dprojected = grad(theta["cell"], state0, projected,
                                      step_extras, dstate1)
    dtheta = {"cell": dcell,
              "kernel": _like(tf.matmul(x_t, dprojected, transpose_a=True),
                              theta["kernel"]),
              "bias": _like(tf.reduce_sum(dprojected, axis=0),
                            theta["bias"])}
    kernel = _compute(theta["kernel"], dprojected)
    return dtheta, dstate0, tf.matmul(dprojected, kernel, transpose_b=True)

  return lean_step, lean_grad


def masked(step, grad):
  """Wraps a (step, grad) pair so that masked steps carry the state through.

  The wrapped functions take inputs `{"x": x_t, "mask": mask_t}` with a
  boolean `[B]` mask: where it is False the state leaving the step is the
  state entering it (Keras's mask semantics), and no gradient reaches the
  step's theta or inputs.

  Args:
    step: A `cell_fn` over per-example `[B, ...]` states.
    grad: Its `cell_grad`.

  Returns:
    `(masked_step, masked_grad)`.

  Example:

  >>> import tf_recurrent
  >>> step, grad = masked(lstm_step, lstm_grad)
  >>> theta = {"recurrent_kernel": tf.ones([2, 8])}
  >>> s0 = {"h": tf.zeros([1, 2]), "c": tf.zeros([1, 2])}
  >>> inputs = {"x": tf.ones([3, 1, 8]), "mask": tf.constant([[True], [False],
  ...                                                         [True]])}
  >>> acc, _ = tf_recurrent.recurrent(theta, s0, inputs, step, grad)
  >>> bool(tf.reduce_all(acc["h"][1] == acc["h"][0]))
  True
  """

  def masked_step(theta, state, inputs):
    new, extras = step(theta, state, inputs["x"])
    keep = inputs["mask"]
    return masks.select_structure(keep, new, state), extras

  def masked_grad(theta, state0, inputs, extras, dstate1):
    keep = inputs["mask"]
    d_new = tf.nest.map_structure(lambda d: masks.zero_where_off(keep, d),
                                  dstate1)
    dtheta, dstate0, dx = grad(theta, state0, inputs["x"], extras, d_new)
    # A masked step passes its state, and so its gradient, straight through.
    dstate0 = tf.nest.map_structure(
        lambda g, d: masks.select(keep, g, g + d), dstate0, dstate1)
    return dtheta, dstate0, {"x": dx, "mask": None}

  return masked_step, masked_grad
