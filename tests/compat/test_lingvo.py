"""tf_recurrent.lingvo.Recurrent as Lingvo's own recurrent_test.py uses it.

The cases and numbers follow Lingvo's tests (polynomial, stop_fn, captures,
symbol values, stateful ops, padding, Elman with and without a cell_grad),
written here for tf_recurrent, in every mode: eager, tf.function, XLA and a
TF1 graph with tf.gradients and a Session, where Lingvo models run.
"""

import contextlib
import sys
import types

import numpy as np
import pytest
import tensorflow as tf

from tf_recurrent import lingvo
from conftest import GRAPH_MODES, assert_all_close, values_and_grads


class NestedMap(dict):
  """Lingvo's NestedMap: a dict with attribute access."""

  def __getattr__(self, name):
    try:
      return self[name]
    except KeyError as e:
      raise AttributeError(name) from e

  def __setattr__(self, name, value):
    self[name] = value


def assert_values(got, want, tol=1e-6):
  """Each fetched value against its expected numbers."""
  assert len(got) == len(want)
  for g, w in zip(got, want):
    np.testing.assert_allclose(g, w, rtol=tol, atol=tol)


def poly(theta, state, inputs):
  return NestedMap(value=state.value + inputs.coeff * state.x_power,
                   x_power=state.x_power * theta.x), NestedMap()


def poly_args(coeff, padding=None):
  theta = NestedMap(x=tf.constant(2.0))
  state = NestedMap(value=tf.constant(0.0), x_power=tf.constant(1.0))
  inputs = NestedMap(coeff=tf.constant(coeff))
  if padding is not None:
    inputs.padding = tf.constant(padding)
  return theta, state, inputs


def run_poly(mode, coeff, of_acc, **kwargs):
  """Lingvo's testBasic: d(final.value or sum(acc.value)) / d[x, coeff]."""

  def build(watch):
    theta, state, inputs = poly_args(coeff)
    watch([theta.x, inputs.coeff])
    acc, final = lingvo.Recurrent(theta, state, inputs, poly, **kwargs)
    loss = tf.reduce_sum(acc.value) if of_acc else final.value
    return (acc.value, acc.x_power, final.value, final.x_power), loss, [
        theta.x, inputs.coeff]

  return values_and_grads(mode, build)


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_polynomial(mode):
  values, (dx, dcoeff) = run_poly(mode, [1., 2., 3.], of_acc=False)
  assert_values(values, [[1., 5., 17.], [2., 4., 8.], 17., 8.])
  assert_values([dx, dcoeff], [14., [1., 2., 4.]])
  _, (dx, dcoeff) = run_poly(mode, [1., 2., 3.], of_acc=True)
  assert_values([dx, dcoeff], [16., [3., 4., 4.]])


def stop_after_three_steps(t, theta, state):
  del theta, state
  return t >= 3


def stop_at_fifteen(t, theta, state):
  del t, theta
  return state.value >= 15.


@pytest.mark.parametrize("mode", GRAPH_MODES)
@pytest.mark.parametrize("stop_fn", [stop_after_three_steps, stop_at_fifteen])
def test_stop_fn(mode, stop_fn):
  values, (dx, dcoeff) = run_poly(mode, [1., 2., 3., 4.], of_acc=False,
                                  stop_fn=stop_fn)
  assert_values(values, [[1., 5., 17., 0.], [2., 4., 8., 0.], 17., 8.])
  assert_values([dx, dcoeff], [14., [1., 2., 4., 0.]])
  _, (dx, dcoeff) = run_poly(mode, [1., 2., 3., 4.], of_acc=True,
                             stop_fn=stop_fn)
  assert_values([dx, dcoeff], [16., [3., 4., 4., 0.]])


def test_stop_fn_not_triggered_before_the_end():
  values, (dx, dcoeff) = run_poly("tf1", [1., 2., 3., 4.], of_acc=False,
                                  stop_fn=lambda t, *_: t >= 5)
  assert_values(values, [[1., 5., 17., 49.], [2., 4., 8., 16.], 49., 16.])
  assert_values([dx, dcoeff], [62., [1., 2., 4., 8.]])


def test_per_example_stop_fn_stops_when_all_are_done():
  theta = NestedMap(x=tf.constant(1.0))
  state = NestedMap(value=tf.constant([0.0, 0.0]), x_power=tf.ones([2]))
  inputs = NestedMap(coeff=tf.constant([[1., 3.]] * 4))
  acc, final = lingvo.Recurrent(theta, state, inputs, poly,
                                stop_fn=lambda t, th, s: s.value >= 2.)
  # Example 1 is done after one step, example 0 after two.
  np.testing.assert_allclose(acc.value, [[1, 3], [2, 6], [0, 0], [0, 0]])
  np.testing.assert_allclose(final.value, [2, 6])


def capture_case(captured):
  theta = NestedMap(x=tf.constant(2.0))
  state0 = NestedMap(value=tf.constant(0.0))
  inputs = NestedMap(coeff=tf.constant([1., 2., 3.]))

  def cell_fn(theta, state, inputs):
    return NestedMap(
        value=state.value + inputs.coeff * captured * theta.x), NestedMap()

  return theta, state0, inputs, cell_fn


@pytest.mark.parametrize("mode", GRAPH_MODES)
@pytest.mark.parametrize("how", ["allow_implicit_capture",
                                 "allowed_tensor_captures"])
def test_capture_allowed(mode, how):
  """Lingvo's testCapture: values and d[x, captured] of the final state."""

  def build(watch):
    captured = tf.constant(1.2, name="captured_const")
    theta, state0, inputs, cell_fn = capture_case(captured)
    watch([theta.x, captured])
    options = ({"allow_implicit_capture": True} if how ==
               "allow_implicit_capture" else
               {"allowed_tensor_captures": [captured]})
    acc, final = lingvo.Recurrent(theta, state0, inputs, cell_fn, **options)
    return (acc.value, final.value), final.value, [theta.x, captured]

  (acc, final), grads = values_and_grads(mode, build)
  assert_values([acc, final], [[2.4, 7.2, 14.4], 14.4], tol=1e-5)
  assert_values(grads, [7.2, 12.0], tol=1e-5)


@pytest.mark.parametrize("graph", ["eager", "tf1"])
def test_capture_disallowed(graph):
  with tf.Graph().as_default() if graph == "tf1" else contextlib.nullcontext():
    captured = tf.constant(1.2, name="captured_const")
    theta, state0, inputs, cell_fn = capture_case(captured)
    with pytest.raises(ValueError, match="implicit capture is disabled"):
      lingvo.Recurrent(theta, state0, inputs, cell_fn)
    other = tf.constant(0.5, name="other")
    with pytest.raises(ValueError, match="not in allowed_tensor_captures"):
      lingvo.Recurrent(theta, state0, inputs, cell_fn,
                       allowed_tensor_captures=[other])
    # A custom cell_grad turns implicit captures off, as in Lingvo.
    with pytest.raises(ValueError, match="implicit capture is disabled"):
      lingvo.Recurrent(theta, state0, inputs, cell_fn,
                       cell_grad=lambda *a: (a[0], a[1], a[2], None),
                       allow_implicit_capture=True)


def test_captured_variable_is_named():
  w = tf.Variable(2.0, name="closure_w")
  theta, state0, inputs, _ = capture_case(None)
  with pytest.raises(ValueError, match="closure_w"):
    lingvo.Recurrent(theta, state0, inputs, lambda th, s, x: (
        NestedMap(value=s.value + x.coeff * w), NestedMap()))


@tf.function
def rand_with_coeff(coeff):
  return coeff * tf.random.uniform([], dtype=coeff.dtype)


@tf.function
def double(coeff):
  return coeff * 2


@pytest.mark.parametrize("graph", ["eager", "tf1"])
def test_stateful_ops_checked(graph):
  """Lingvo's testStatefulCellFn and testNestedCellFn."""
  with tf.Graph().as_default() if graph == "tf1" else contextlib.nullcontext():
    theta, state, inputs = NestedMap(), NestedMap(value=tf.constant(0.0)), \
        NestedMap(coeff=tf.constant([1., 2., 3.]))

    def cell(step):
      return lambda th, s, x: (NestedMap(value=s.value + step(x.coeff)),
                               NestedMap())

    with pytest.raises(ValueError, match="stateful.*random_uniform"):
      lingvo.Recurrent(theta, state, inputs, cell(
          lambda c: c * tf.random.uniform([])), check_stateful_ops=True)
    with pytest.raises(ValueError, match="stateful.*rand_with_coeff"):
      lingvo.Recurrent(theta, state, inputs, cell(rand_with_coeff),
                       check_stateful_ops=True)
    lingvo.Recurrent(theta, state, inputs, cell(double),
                     check_stateful_ops=True)


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_trailing_padding_is_not_run(mode):
  """The issue's stacked case: s = s * x + c over c=[1, 2, 1, 0] with the
  last step padded gives [1, 4, 9, 0] and d sum / dx = 7, not 18 and 28."""

  def build(watch):
    x = tf.constant(2.0)
    watch(x)
    acc, _ = lingvo.Recurrent(
        NestedMap(x=x), NestedMap(s=tf.constant(0.0)),
        NestedMap(c=tf.constant([1., 2., 1., 0.]),
                  padding=tf.constant([0., 0., 0., 1.])),
        lambda th, st, inp: (NestedMap(s=st.s * th.x + inp.c), NestedMap()))
    return acc.s, tf.reduce_sum(acc.s), [x]

  (acc,), (dx,) = values_and_grads(mode, build)
  assert_values([acc, dx], [[1., 4., 9., 0.], 7.])


# Lingvo's testSeqLenActual: padding per step -> (padded steps at the start,
# padded steps at the end). Rows outside are zeros, the rest count steps.
PADDINGS = [([[1.0], [1.0], [1.0]], [0, 3]), ([[1.0], [1.0], [0.0]], [2, 0]),
            ([[1.0], [0.0], [1.0]], [1, 1]), ([[1.0], [0.0], [0.0]], [1, 0]),
            ([[0.0], [1.0], [1.0]], [0, 2]), ([[0.0], [1.0], [0.0]], [0, 0]),
            ([[0.0], [0.0], [1.0]], [0, 1]), ([[0.0], [0.0], [0.0]], [0, 0])]


@pytest.mark.parametrize("padding,lengths", PADDINGS)
def test_padded_steps_at_either_end_are_skipped(padding, lengths):
  begin, end = lengths
  acc, final = lingvo.Recurrent(
      NestedMap(), NestedMap(n=tf.constant(10.0)),
      NestedMap(padding=tf.constant(padding), x=tf.ones([3, 1])),
      lambda th, s, x: (NestedMap(n=s.n + 1.0), NestedMap()))
  ran = 3 - begin - end if end < 3 else 0
  want = [0.0] * 3
  for i in range(ran):
    want[begin + i] = 11.0 + i
  np.testing.assert_allclose(acc.n, want)
  assert float(final.n) == 10.0 + ran


def rand(rng, shape):
  return rng.uniform(-0.2, 0.2, size=shape)


def constants(*arrays):
  """float64 tensors made in the current graph (eager or a TF1 graph)."""
  return [tf.constant(a) for a in arrays]


def elman(theta, state0, inputs):
  xw = tf.matmul(tf.concat([inputs.x, state0.h], axis=1), theta.w)
  h1 = tf.sigmoid(xw + theta.b)
  return NestedMap(h=h1), NestedMap(h=h1)


def elman_grad(theta, state0, inputs, extras, dstate1):
  """Lingvo's ElmanGrad: four results, dcaptured None."""
  dxwb = dstate1.h * (1 - extras.h) * extras.h
  dw = tf.matmul(tf.concat([inputs.x, state0.h], axis=1), dxwb,
                 transpose_a=True)
  dxh = tf.matmul(dxwb, theta.w, transpose_b=True)
  dims = inputs.x.shape[-1]
  return (NestedMap(w=dw, b=tf.reduce_sum(dxwb, 0)),
          NestedMap(h=dxh[:, dims:]), NestedMap(x=dxh[:, :dims]), None)


@pytest.mark.parametrize("mode", GRAPH_MODES)
@pytest.mark.parametrize("seqlen,use_grad,stop", [
    (1, False, False), (1, True, False), (7, False, False), (7, True, False),
    (7, False, True), (7, True, True)])
def test_elman_matches_static_unroll(mode, seqlen, use_grad, stop):
  """Lingvo's testElman: float64 values and gradients vs a static unroll."""
  rng = np.random.default_rng(342462)
  batch, dims = 3, 4
  arrays = (rand(rng, [2 * dims, dims]), rand(rng, [dims]),
            rand(rng, [batch, dims]), rand(rng, [seqlen, batch, dims]))
  stop_fn = (lambda t, *_: t >= 4) if stop else None

  def build(watch):
    w, b, h0, x = constants(*arrays)
    theta, state0, inputs = NestedMap(w=w, b=b), NestedMap(h=h0), NestedMap(
        x=x)
    watch([w, b, h0, x])
    acc, final = lingvo.Recurrent(theta, state0, inputs, elman,
                                  elman_grad if use_grad else None,
                                  stop_fn=stop_fn)
    assert isinstance(acc, NestedMap) and isinstance(final, NestedMap)
    loss = tf.reduce_sum(acc.h) + tf.reduce_sum(final.h)
    return (acc.h, final.h), loss, [w, b, h0, x]

  got = values_and_grads(mode, build)
  w, b, h0, x = constants(*arrays)
  with tf.GradientTape() as tape:
    tape.watch([w, b, h0, x])
    s, out = NestedMap(h=h0), []
    for i in range(seqlen):
      s, _ = elman(NestedMap(w=w, b=b), s, NestedMap(x=x[i]))
      out.append(s.h)
      if stop_fn and stop_fn(i + 1):
        out += [tf.zeros_like(s.h)] * (seqlen - i - 1)
        break
    acc, final = tf.stack(out), s.h
    loss = tf.reduce_sum(acc) + tf.reduce_sum(final)
  want = ([acc, final], tape.gradient(loss, [w, b, h0, x]))
  assert_all_close(got, want, tol=1e-10)


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_leading_padding_with_a_cell_grad(mode):
  """Skipped leading steps carry the state and pass its gradient through."""
  rng = np.random.default_rng(5)
  arrays = (rand(rng, [8, 4]), rand(rng, [4]), rand(rng, [3, 4]),
            rand(rng, [6, 3, 4]))
  padding = [1., 1., 0., 0., 0., 1.]

  def build(watch):
    w, b, h0, x = constants(*arrays)
    watch([w, b, h0, x])
    acc, final = lingvo.Recurrent(
        NestedMap(w=w, b=b), NestedMap(h=h0),
        NestedMap(x=x, padding=tf.constant(padding, tf.float64)), elman,
        _grad_with_padding)
    loss = tf.reduce_sum(tf.sin(acc.h)) + tf.reduce_sum(final.h)
    return (acc.h, final.h), loss, [w, b, h0, x]

  got = values_and_grads(mode, build)
  w, b, h0, x = constants(*arrays)
  with tf.GradientTape() as tape:
    tape.watch([w, b, h0, x])
    s, rows = NestedMap(h=h0), [tf.zeros_like(h0)] * 2
    for i in (2, 3, 4):
      s, _ = elman(NestedMap(w=w, b=b), s, NestedMap(x=x[i]))
      rows.append(s.h)
    acc = tf.stack(rows + [tf.zeros_like(h0)])
    loss = tf.reduce_sum(tf.sin(acc)) + tf.reduce_sum(s.h)
  want = ([acc, s.h], tape.gradient(loss, [w, b, h0, x]))
  assert_all_close(got, want, tol=1e-10)


def _grad_with_padding(theta, state0, inputs, extras, dstate1):
  """elman_grad for inputs that also hold `padding` (its gradient None)."""
  dtheta, dstate0, dinputs, dcaptured = elman_grad(
      theta, state0, NestedMap(x=inputs.x), extras, dstate1)
  return dtheta, dstate0, NestedMap(x=dinputs.x, padding=None), dcaptured


@pytest.mark.parametrize("mode", GRAPH_MODES)
@pytest.mark.parametrize("use_grad", [False, True])
def test_return_acc_extras(mode, use_grad):
  rng = np.random.default_rng(6)
  arrays = (rand(rng, [8, 4]), rand(rng, [4]), rand(rng, [3, 4]),
            rand(rng, [5, 3, 4]))

  def build(watch):
    w, b, h0, x = constants(*arrays)
    watch([w, b])
    acc, final, acc_extras = lingvo.Recurrent(
        NestedMap(w=w, b=b), NestedMap(h=h0), NestedMap(x=x), elman,
        elman_grad if use_grad else None, return_acc_extras=True)
    assert isinstance(acc_extras, NestedMap)
    loss = tf.reduce_sum(acc.h) + tf.reduce_sum(acc_extras.h)
    return (acc.h, final.h, acc_extras.h), loss, [w, b]

  (acc, final, extras), grads = values_and_grads(mode, build)
  np.testing.assert_array_equal(extras, acc)  # Elman's extras are h.
  np.testing.assert_array_equal(final, acc[-1])
  # The extras carry no gradient (as in Lingvo): only acc.h contributes.
  # Without a cell_grad the step that computes them is differentiated, so
  # only their cut from the graph keeps them from contributing.

  def build_acc_only(watch):
    w, b, h0, x = constants(*arrays)
    watch([w, b])
    acc, _ = lingvo.Recurrent(NestedMap(w=w, b=b), NestedMap(h=h0),
                              NestedMap(x=x), elman,
                              elman_grad if use_grad else None)
    return acc.h, tf.reduce_sum(acc.h), [w, b]

  assert_all_close(grads, values_and_grads(mode, build_acc_only)[1],
                   tol=1e-12)


@pytest.mark.parametrize("graph", ["eager", "tf1"])
def test_backward_cleanup_runs_after_the_backward_pass(graph):
  rng = np.random.default_rng(7)
  arrays = (rand(rng, [8, 4]), rand(rng, [4]), rand(rng, [3, 4]),
            rand(rng, [5, 3, 4]))

  def build(watch):
    w, b, h0, x = constants(*arrays)
    counter = tf.Variable(0, name="cleanups")
    watch([w, x])
    acc, _ = lingvo.Recurrent(
        NestedMap(w=w, b=b), NestedMap(h=h0), NestedMap(x=x), elman,
        backward_cleanup=lambda: [counter.assign_add(1)])
    return counter, tf.reduce_sum(acc.h), [w, x]

  if graph == "eager":
    (count,), _ = values_and_grads("eager", build)
    assert int(count) == 1
    return
  with tf.Graph().as_default():
    counter, loss, sources = build(lambda _: None)
    grads = tf.gradients(loss, sources)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      assert session.run(counter) == 0
      session.run(grads)
      assert session.run(counter) == 1


def test_accumulator_layer_names_the_alternative():
  theta, state, inputs = poly_args([1., 2.])
  with pytest.raises(NotImplementedError, match="carry the accumulated"):
    lingvo.Recurrent(theta, state, inputs, poly, accumulator_layer=object())


def test_cell_grad_must_return_four_values_and_no_dcaptured():
  rng = np.random.default_rng(8)
  w, b, h0, x = constants(rand(rng, [8, 4]), rand(rng, [4]),
                          rand(rng, [3, 4]), rand(rng, [5, 3, 4]))
  args = (NestedMap(w=w, b=b), NestedMap(h=h0), NestedMap(x=x), elman)
  with pytest.raises(ValueError, match=r"\(dtheta, dstate0, dinputs, "
                     "dcaptured\\) as in Lingvo"):
    lingvo.Recurrent(*args, cell_grad=lambda *a: elman_grad(*a)[:3])
  with pytest.raises(ValueError, match="returned a dcaptured"):
    lingvo.Recurrent(*args, cell_grad=lambda *a: elman_grad(*a)[:3] + (
        [tf.zeros([])],))


class Symbol:
  """A stand-in for lingvo.core.symbolic.Symbol (a sympy.Dummy there)."""

  def __init__(self, name):
    self.name = name


def stand_in_symbolic():
  """A module shaped like lingvo.core.symbolic (sympy is not installed)."""
  symbolic = types.ModuleType("lingvo.core.symbolic")
  symbolic.STATIC_VALUES, symbolic.TENSOR_VALUES = "static", "tensor"
  stacks = {"static": [{}], "tensor": [{}]}

  class SymbolToValueMap:
    """Lingvo's: nested maps, the inner ones taking precedence."""

    def __init__(self, value_type, symbol_to_value_map):
      self.value_type = value_type
      self.merged = dict(stacks[value_type][-1])
      self.merged.update(symbol_to_value_map)

    def __enter__(self):
      stacks[self.value_type].append(self.merged)

    def __exit__(self, *unused):
      assert stacks[self.value_type].pop() is self.merged

    @staticmethod
    def Get(value_type):  # pylint: disable=invalid-name
      return stacks[value_type][-1]

  def eval_expr(value_type, x):
    return SymbolToValueMap.Get(value_type).get(x, x) if isinstance(
        x, Symbol) else x

  symbolic.SymbolToValueMap, symbolic.EvalExpr = SymbolToValueMap, eval_expr
  return symbolic


@pytest.fixture
def symbolic(monkeypatch):
  """lingvo.core.symbolic importable for one test, removed after."""
  module = stand_in_symbolic()
  lingvo_pkg, core = (types.ModuleType("lingvo"),
                      types.ModuleType("lingvo.core"))
  lingvo_pkg.core, core.symbolic = core, module
  for name, mod in [("lingvo", lingvo_pkg), ("lingvo.core", core),
                    ("lingvo.core.symbolic", module)]:
    monkeypatch.setitem(sys.modules, name, mod)
  return module


@pytest.mark.parametrize("mode", ["eager", "function", "tf1"])
@pytest.mark.parametrize("manual_grad", [False, True])
def test_symbol_to_tensor_map(symbolic, mode, manual_grad):
  """Lingvo's testSymbolToTensorMap, both halves: the cell reads x from the
  symbol map around the call, and x gets its gradient (with a cell_grad
  returning none for it, from autodiff of the step)."""
  x, y = Symbol("x"), Symbol("y")

  def plus_wxt(theta, state, inputs):
    """state.value += theta.w * x * inputs.t."""
    x_tensor = symbolic.EvalExpr(symbolic.TENSOR_VALUES, x)
    return NestedMap(value=state.value + theta.w * x_tensor * inputs.t), \
        NestedMap()

  def plus_wxt_grad(theta, state0, inputs, extras, dstate1):
    del state0, extras
    x_tensor = symbolic.EvalExpr(symbolic.TENSOR_VALUES, x)
    return (NestedMap(w=dstate1.value * x_tensor * inputs.t),
            NestedMap(value=dstate1.value),
            NestedMap(t=dstate1.value * theta.w * x_tensor), None)

  x_value = 5. if manual_grad else 7.

  def build(watch):
    theta = NestedMap(w=tf.constant(1., name="w"))
    state0 = NestedMap(value=tf.constant(0., name="value"))
    inputs = NestedMap(t=tf.constant([1., 2., 3.], name="t"))
    with symbolic.SymbolToValueMap(symbolic.TENSOR_VALUES,
                                   {x: tf.constant(x_value), y: 8}):
      x_tensor = symbolic.EvalExpr(symbolic.TENSOR_VALUES, x)
      watch([theta.w, x_tensor])
      _, state1 = lingvo.Recurrent(
          theta, state0, inputs, plus_wxt,
          cell_grad=plus_wxt_grad if manual_grad else None)
    assert list(theta) == ["w"]  # The caller's theta is left as it was.
    return state1.value, state1.value, [theta.w, x_tensor]

  (final,), (dw, dx) = values_and_grads(mode, build)
  assert final == x_value * (1. + 2. + 3.)
  assert dw == x_value * (1. + 2. + 3.)
  assert dx == 1. + 2. + 3.


def scaled_elman(symbolic, scale):
  """Elman with h0 scaled by a symbol's value, and its gradient (none for
  the symbol's value)."""

  def cell_fn(theta, state0, inputs):
    s = symbolic.EvalExpr(symbolic.TENSOR_VALUES, scale)
    return elman(theta, NestedMap(h=state0.h * s), inputs)

  def cell_grad(theta, state0, inputs, extras, dstate1):
    s = symbolic.EvalExpr(symbolic.TENSOR_VALUES, scale)
    dtheta, dstate0, dinputs, _ = elman_grad(
        theta, NestedMap(h=state0.h * s), inputs, extras, dstate1)
    return dtheta, NestedMap(h=dstate0.h * s), dinputs, None

  return cell_fn, cell_grad


@pytest.mark.parametrize("mode", GRAPH_MODES)
@pytest.mark.parametrize("use_grad", [False, True])
def test_symbol_values_gradients_match_static_unroll(symbolic, mode,
                                                     use_grad):
  """float64: the step's partial derivative for the symbol's value, summed
  over the steps, as a static unroll differentiated by a GradientTape."""
  rng = np.random.default_rng(11)
  arrays = (rand(rng, [8, 4]), rand(rng, [4]), rand(rng, [3, 4]),
            rand(rng, [5, 3, 4]), rng.uniform(0.5, 1.5, [3, 4]))
  scale = Symbol("scale")
  cell_fn, cell_grad = scaled_elman(symbolic, scale)

  def build(watch):
    w, b, h0, x, s = constants(*arrays)
    watch([w, b, h0, x, s])
    with symbolic.SymbolToValueMap(symbolic.TENSOR_VALUES, {scale: s}):
      acc, final = lingvo.Recurrent(NestedMap(w=w, b=b), NestedMap(h=h0),
                                    NestedMap(x=x), cell_fn,
                                    cell_grad if use_grad else None)
    loss = tf.reduce_sum(tf.sin(acc.h)) + tf.reduce_sum(final.h)
    return (acc.h, final.h), loss, [w, b, h0, x, s]

  got = values_and_grads(mode, build)
  w, b, h0, x, s = constants(*arrays)
  with tf.GradientTape() as tape:
    tape.watch([w, b, h0, x, s])
    state, rows = NestedMap(h=h0), []
    for i in range(5):
      state, _ = elman(NestedMap(w=w, b=b), NestedMap(h=state.h * s),
                       NestedMap(x=x[i]))
      rows.append(state.h)
    acc = tf.stack(rows)
    loss = tf.reduce_sum(tf.sin(acc)) + tf.reduce_sum(state.h)
  want = ([acc, state.h], tape.gradient(loss, [w, b, h0, x, s]))
  assert_all_close(got, want, tol=1e-10)


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_step_is_skipped_only_when_every_example_is_padding(mode):
  """padding [T, B] with examples padded at different steps: only the
  all-padding steps at either end (0 and 4) are skipped; 1 and 3, padded
  for one example only, and the all-padding step 2 between them are run."""
  padding = [[1., 1.], [1., 0.], [1., 1.], [0., 1.], [1., 1.]]
  c = [[1., 2.], [3., 4.], [5., 6.], [7., 8.], [9., 10.]]

  def cell_fn(theta, state, inputs):
    return NestedMap(s=state.s * theta.a + inputs.c), NestedMap()

  def build(watch):
    a, cs = tf.constant(0.5), tf.constant(c)
    watch([a, cs])
    acc, final = lingvo.Recurrent(
        NestedMap(a=a), NestedMap(s=tf.constant([1., -1.])),
        NestedMap(c=cs, padding=tf.constant(padding)), cell_fn)
    loss = tf.reduce_sum(tf.sin(acc.s)) + tf.reduce_sum(final.s)
    return (acc.s, final.s), loss, [a, cs]

  got = values_and_grads(mode, build)
  a, cs = tf.constant(0.5), tf.constant(c)
  with tf.GradientTape() as tape:
    tape.watch([a, cs])
    state, rows = NestedMap(s=tf.constant([1., -1.])), []
    for t in (1, 2, 3):
      state, _ = cell_fn(NestedMap(a=a), state, NestedMap(c=cs[t]))
      rows.append(state.s)
    acc = tf.stack([tf.zeros([2])] + rows + [tf.zeros([2])])
    loss = tf.reduce_sum(tf.sin(acc)) + tf.reduce_sum(state.s)
  want = ([acc, state.s], tape.gradient(loss, [a, cs]))
  assert_all_close(got, want, tol=1e-6)


def test_symbol_values_need_a_mapping_theta(symbolic):
  with symbolic.SymbolToValueMap(symbolic.TENSOR_VALUES,
                                 {Symbol("x"): tf.constant(1.)}):
    with pytest.raises(TypeError, match="theta must be a NestedMap or dict"):
      lingvo.Recurrent([tf.constant(1.)], NestedMap(v=tf.constant(0.)),
                       NestedMap(t=tf.ones([2])),
                       lambda th, s, x: (NestedMap(v=s.v + x.t), NestedMap()))
