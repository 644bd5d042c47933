"""Shared fixtures and oracles: execution modes, the static-unroll reference,
the Elman test cell, the numerical-gradient check, and the option matrices
(`pairwise`: every pair of values by default, the whole product with
`--full` or `TFR_FULL=1`)."""

import functools
import gc
import itertools
import os
import subprocess
import sys
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if os.environ.get("PYTEST_XDIST_WORKER"):
  # One worker per core: each runs TensorFlow's ops on one thread, so the
  # workers' thread pools do not spin against each other (5-6% of the
  # suite's wall time on 2 cores). The subprocesses tests start inherit it.
  os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")
  os.environ.setdefault("TF_NUM_INTEROP_THREADS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

# Two logical CPUs, so tf.distribute strategies have replicas to split over.
# This must run before TensorFlow initializes its devices.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * 2)

MODES = ("eager", "function", "xla")


def pytest_addoption(parser):
  parser.addoption(
      "--full", action="store_true", default=False,
      help="Run every option matrix as its whole cartesian product (as "
      "TFR_FULL=1 does) instead of all pairs plus the edges.")
  parser.addoption(
      "--benchmarks", action="store_true", default=False,
      help="Also run the tests marked `benchmarks` (as TFR_BENCHMARKS=1 "
      "does): the benchmark scripts end to end at tiny sizes, dozens of "
      "fresh TensorFlow processes. CI runs them.")
  parser.addoption(
      "--programs", action="store_true", default=False,
      help="Also run the tests marked `programs` (as TFR_PROGRAMS=1 does): "
      "tpu_examples' jobs and the serving scripts run end to end in fresh "
      "processes. CI runs them.")


# The tests that run only when asked: marker -> (switch, its variable).
ON_REQUEST = {
    "benchmarks": ("--benchmarks", "TFR_BENCHMARKS"),
    "programs": ("--programs", "TFR_PROGRAMS"),
}


def pytest_configure(config):
  if config.getoption("--full"):
    os.environ["TFR_FULL"] = "1"  # Read by `pairwise` as test modules load.
  for option, variable in ON_REQUEST.values():
    if config.getoption(option):
      os.environ[variable] = "1"


def _enabled(variable):
  return os.environ.get(variable, "") not in ("", "0")


def pytest_collection_modifyitems(config, items):
  del config  # The switches are read from the environment.
  for marker, (option, variable) in ON_REQUEST.items():
    if _enabled(variable):
      continue
    skip = pytest.mark.skip(
        reason=f"marked `{marker}`: {option} or {variable}=1 runs it (CI "
        "does)")
    for item in items:
      if item.get_closest_marker(marker):
        item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
  """Each test starts with the objects the tests before it left collected
  and frozen (`gc.freeze`), so that Python's full collections during the
  test scan only the test's own objects. Unfrozen, every full collection
  walked the whole heap: the TensorFlow graphs, functions and Keras layers
  the earlier tests' caches hold. Four test files run in one process spent
  14.7-19.2 s in full collections; collected and frozen before each test,
  4.0 s, these collections included."""
  del item
  gc.collect()
  gc.freeze()


def full_matrices():
  """True when the option matrices run whole (`--full` or `TFR_FULL=1`)."""
  return _enabled("TFR_FULL")


def pairwise(*axes, edges=(), where=None, full=None):
  """The cases of an option matrix: `axes` are lists of values, one per
  parameter; returns a list of tuples, one value per axis.

  By default every pair of values of any two axes appears in some case (the
  all-pairs cover, built greedily and deterministically: each case picked is
  the allowed one, in product order, covering the most pairs not yet
  covered), and then each of `edges` (whole tuples: the cases our issues
  named) that the cover lacks. With `full` (by default `full_matrices()`)
  it is the whole product. `where(*case)` says which cases are allowed; a
  pair that no allowed case has is not asked for.

  >>> pairwise(["eager", "xla"], [1, 7], [False, True], full=False)
  [('eager', 1, False), ('eager', 7, True), ('xla', 1, True), ('xla', 7, False)]
  >>> len(pairwise(["eager", "xla"], [1, 7], [False, True], full=True))
  8
  """
  allowed = [case for case in itertools.product(*axes)
             if where is None or where(*case)]
  for edge in edges:
    if where is not None and not where(*edge):
      raise ValueError(f"edge case {edge!r} is not allowed by `where`")
  if full_matrices() if full is None else full:
    return allowed + [e for e in edges if tuple(e) not in allowed]

  def pairs_of(case):
    return {(i, case[i], j, case[j])
            for i, j in itertools.combinations(range(len(case)), 2)}

  uncovered = set().union(*map(pairs_of, allowed)) if allowed else set()
  chosen = []
  while uncovered:
    best = max(allowed, key=lambda case: len(pairs_of(case) & uncovered))
    chosen.append(best)
    uncovered -= pairs_of(best)
  chosen += [tuple(e) for e in edges if tuple(e) not in chosen]
  return chosen


def in_mode(mode, fn):
  """Returns `fn` run eagerly, as a tf.function, or compiled by XLA."""
  if mode == "eager":
    return fn
  return tf.function(fn, autograph=False, jit_compile=(mode == "xla"))


def once_per_mode(fn, *args):
  """`results(mode, *extra)`: `fn(mode, *args, *extra)` run in `mode`
  (`in_mode`; `mode` is a Python value, e.g. to pick the mode's cases), as
  NumPy, computed at the first ask and kept. Each mode traces (and
  compiles) `fn` once: `extra` values of the same dtype and shape (NumPy
  scalars, say) reuse it.
  """
  functions, results_of = {}, {}

  def results(mode, *extra):
    key = (mode,) + extra
    if key not in results_of:
      if mode not in functions:
        functions[mode] = in_mode(mode, functools.partial(fn, mode))
      results_of[key] = tf.nest.map_structure(
          np.asarray, functions[mode](*args, *map(tf.constant, extra)))
    return results_of[key]

  return results


@pytest.fixture(params=MODES)
def mode(request):
  return request.param


def static_unroll(theta, state0, inputs, cell_fn, num_steps=None,
                  sequence_length=None, stop_fn=None):
  """The reference: a Python loop over steps, differentiable by autodiff.

  Runs eagerly (stop_fn's result is read as a Python bool). Past its
  sequence_length an example carries its state and writes zero rows; rows
  from num_steps or the stop on are zeros.
  """
  flat_inputs = tf.nest.flatten(inputs)
  total = int(flat_inputs[0].shape[0])
  num_steps = total if num_steps is None else num_steps
  state = state0
  rows = []
  for t in range(num_steps):
    if stop_fn is not None and bool(stop_fn(tf.constant(t), theta, state)):
      break
    x_t = tf.nest.map_structure(lambda x, t=t: x[t], inputs)
    new, _ = cell_fn(theta, state, x_t)
    new = tf.nest.pack_sequence_as(state0, tf.nest.flatten(new))
    if sequence_length is None:
      state, row = new, new
    else:
      running = np.asarray(sequence_length) > t
      def pick(a, b, running=running):
        mask = tf.reshape(tf.constant(running), [-1] + [1] * (a.shape.rank - 1))
        return tf.where(mask, a, b)
      row = tf.nest.map_structure(lambda n: pick(n, tf.zeros_like(n)), new)
      state = tf.nest.map_structure(pick, new, state)
    rows.append(row)

  def stack(s0, *leaves):
    pad = [tf.zeros_like(s0)] * (total - len(leaves))
    if not leaves and not pad:
      return tf.zeros([0] + s0.shape.as_list(), s0.dtype)
    return tf.stack(list(leaves) + pad)

  return tf.nest.map_structure(stack, state0, *rows), state


def linear_unroll(a, b, h0, reverse=False, lengths=None):
  """The linear recurrence's reference: h_t = a_t * h_{t-1} + b_t as a
  Python loop over the time axis of batch-major `[B, T, ...]` tensors,
  differentiable by autodiff. `reverse` runs from the last step (h_t =
  a_t h_{t+1} + b_t); with `lengths` example i runs steps t < lengths[i]
  only and carries h through the others. Returns (every h, the last h)."""
  total = int(a.shape[1])
  h, rows = h0, [None] * total
  for t in (reversed(range(total)) if reverse else range(total)):
    new = a[:, t] * h + b[:, t]
    if lengths is not None:
      running = tf.reshape(tf.constant(np.asarray(lengths) > t),
                           [-1] + [1] * (new.shape.rank - 1))
      new = tf.where(running, new, h)
    h = rows[t] = new
  if not total:
    return tf.zeros_like(a), h
  return tf.stack(rows, axis=1), h


def loss_weights(structure, seed):
  """Fixed random weights to reduce every float leaf to a scalar loss."""
  rng = np.random.default_rng(seed)
  return tf.nest.map_structure(
      lambda x: tf.constant(rng.normal(size=x.shape.as_list()), x.dtype)
      if x.dtype.is_floating else None, structure)


def weighted_sum(values, weights):
  total = 0.0
  for v, w in zip(tf.nest.flatten(values), tf.nest.flatten(weights)):
    if w is not None:
      total += tf.reduce_sum(tf.cast(v, tf.float64) * tf.cast(w, tf.float64))
  return total


def assert_all_close(actual, expected, tol=1e-6):
  tf.nest.assert_same_structure(actual, expected, check_types=False)
  for a, e in zip(tf.nest.flatten(actual), tf.nest.flatten(expected)):
    if a is None and e is None:
      continue
    if a is None or e is None:  # Autodiff's None for an unconnected input.
      a, e = (np.zeros_like(e) if a is None else a,
              np.zeros_like(a) if e is None else e)
    np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=tol, atol=tol)


# The Elman cell (h = tanh(x W + h U + b)) with a hand-written gradient: the
# shared test case of the op's tests.


def elman_cell(theta, state, x):
  h = tf.tanh(tf.matmul(x, theta["w"]) + tf.matmul(state["h"], theta["u"]) +
              theta["b"])
  return {"h": h}, {"h": h}


def elman_grad(theta, state, x, extras, dstate1):
  dpre = dstate1["h"] * (1 - tf.square(extras["h"]))
  dtheta = {
      "w": tf.matmul(x, dpre, transpose_a=True),
      "u": tf.matmul(state["h"], dpre, transpose_a=True),
      "b": tf.reduce_sum(dpre, 0),
  }
  return (dtheta, {"h": tf.matmul(dpre, theta["u"], transpose_b=True)},
          tf.matmul(dpre, theta["w"], transpose_b=True))


def elman_args(seq_len, dtype=tf.float64, batch=3, dim_in=4, dim_h=5, seed=0):
  rng = np.random.default_rng(seed)
  theta = {
      "w": tf.constant(rng.normal(size=[dim_in, dim_h]) * 0.5, dtype),
      "u": tf.constant(rng.normal(size=[dim_h, dim_h]) * 0.5, dtype),
      "b": tf.constant(rng.normal(size=[dim_h]), dtype),
  }
  state0 = {"h": tf.constant(rng.normal(size=[batch, dim_h]), dtype)}
  inputs = tf.constant(rng.normal(size=[seq_len, batch, dim_in]), dtype)
  return theta, state0, inputs


def assert_numerical_gradients(loss, sources, tol=1e-6):
  """`loss(*sources)`'s gradients against finite differences (float64).

  `loss` runs as one `tf.function`, traced once for the dozens of calls
  finite differences make (run eagerly, test_sequence.py's cases took 2.4x
  as long); the eager mode's gradients are checked against the float64
  unroll by the tests that run every mode.
  """
  loss = tf.function(loss, autograph=False)
  theoretical, numerical = tf.test.compute_gradient(loss, sources,
                                                    delta=1e-6)
  for a, n in zip(theoretical, numerical):
    np.testing.assert_allclose(a, n, rtol=tol, atol=tol)


def run_fresh(script, root):
  """Runs `script` in a new Python that must not import tf_recurrent
  (`sys.argv[1]` is `root`); returns its standard output."""
  code = textwrap.dedent(script) + textwrap.dedent("""
      import sys
      assert "tf_recurrent" not in sys.modules, "tf_recurrent was imported"
      print("FRESH_OK")
  """)
  proc = subprocess.run([sys.executable, "-c", code, str(root)],
                        capture_output=True, text=True, timeout=300,
                        cwd="/", check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "FRESH_OK" in proc.stdout
  return proc.stdout


GRAPH_MODES = MODES + ("tf1",)


def values_and_grads(mode, build, feed=None):
  """`build(watch) -> (values, loss, sources)` run in `mode`.

  Returns `(flat values, d loss / d sources)`, unconnected sources getting
  zeros. The TF2 modes record on a GradientTape (`watch` is its watch); "tf1"
  builds a `tf.compat.v1` graph, differentiates it with `tf.gradients` and
  runs it in a Session (`watch` does nothing, `feed` feeds placeholders, and
  `build` may return a dict of them as a fourth value).
  """
  if mode != "tf1":
    def run():
      with tf.GradientTape() as tape:
        values, loss, sources = build(tape.watch)[:3]
      return tf.nest.flatten(values), tape.gradient(
          loss, sources, unconnected_gradients=tf.UnconnectedGradients.ZERO)
    return in_mode(mode, run)()
  with tf.Graph().as_default():
    values, loss, sources, *rest = build(lambda _: None)
    grads = tf.gradients(loss, sources, unconnected_gradients="zero")
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return session.run((tf.nest.flatten(values), grads),
                         rest[0] if rest else feed)


def record_output_gradients(monkeypatch):
  """Patches the chunked loops' backward pass to record, per trace or call,
  whether it was given no outputs' gradient (None: nothing read the outputs);
  returns the list it appends to. The loop functions made so far are
  dropped, so that the next call makes them with the recorder."""
  from tf_recurrent.chunked import sequence  # pylint: disable=g-import-not-at-top
  seen = []
  backward = sequence._backward  # pylint: disable=protected-access

  def recording(spec, recompute, use_xla, x, weights, outputs, kept, entries,
                d_outputs, *rest, **kwargs):
    seen.append(d_outputs is None)
    return backward(spec, recompute, use_xla, x, weights, outputs, kept,
                    entries, d_outputs, *rest, **kwargs)

  monkeypatch.setattr(sequence, "_backward", recording)
  monkeypatch.setattr(sequence, "_loop_function_cache", {})
  return seen


def loop_values_and_grads(mode, make_inputs, fn, loss_of):
  """`values_and_grads` of one recurrent loop: `make_inputs() -> (sources,
  extras)` (built in the TF1 graph when there is one), `fn(*sources,
  *extras) -> (outputs, final state)`, `loss_of(outputs, final)`; the
  gradients are those of the flattened sources."""
  def build(watch):
    sources, extras = make_inputs()
    watch(list(sources))
    outputs, final = fn(*sources, *extras)
    return ([outputs, final], loss_of(outputs, final),
            tf.nest.flatten(list(sources)))
  return values_and_grads(mode, build)


def recomputing_cell_grad(cell_fn, how):
  """A custom `cell_grad` that recomputes its step and differentiates it.

  `how` is "tape" (under a `tf.GradientTape`), "gradients" (`tf.gradients`
  on the arguments it was handed: total derivatives if they were still wired
  to the forward loop) or "gradients_in_function" (`tf.gradients` inside the
  cell_grad's own `tf.function`). Integer leaves get None.
  """
  def differentiate(theta, state0, inputs, dstate1):
    sources = [x for x in tf.nest.flatten((theta, state0, inputs))
               if x.dtype.is_floating]
    if how == "tape":
      with tf.GradientTape() as tape:
        tape.watch(sources)
        state1, _ = cell_fn(theta, state0, inputs)
      return tape.gradient(tf.nest.flatten(state1), sources,
                           output_gradients=tf.nest.flatten(dstate1),
                           unconnected_gradients=tf.UnconnectedGradients.ZERO)
    state1, _ = cell_fn(theta, state0, inputs)
    return tf.gradients(tf.nest.flatten(state1), sources,
                        tf.nest.flatten(dstate1),
                        unconnected_gradients="zero")

  if how == "gradients_in_function":
    differentiate = tf.function(differentiate, autograph=False)

  def cell_grad(theta, state0, inputs, extras, dstate1):
    del extras
    grads = iter(differentiate(theta, state0, inputs, dstate1))
    flat = [next(grads) if x.dtype.is_floating else None
            for x in tf.nest.flatten((theta, state0, inputs))]
    return tf.nest.pack_sequence_as((theta, state0, inputs), flat)

  return cell_grad


@functools.lru_cache(maxsize=None)
def tflite_unavailable_reason():
  """None when TFLiteConverter converts a Keras model here, else why not.

  Checked in a subprocess: the converter of TensorFlow 2.16.1 aborts the
  whole process ("LLVM ERROR: Failed to infer result type(s)") on any Keras
  3.5 model, a single Dense layer included.
  """
  code = ("import keras, tensorflow as tf\n"
          "model = keras.Sequential([keras.Input((2,), batch_size=1),\n"
          "                          keras.layers.Dense(1)])\n"
          "tf.lite.TFLiteConverter.from_keras_model(model).convert()\n")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                        text=True, timeout=600, check=False)
  if proc.returncode == 0:
    return None
  import keras  # pylint: disable=g-import-not-at-top
  last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
  return (f"TFLiteConverter cannot convert a Keras {keras.__version__} model "
          f"with TensorFlow {tf.__version__} (a one-Dense-layer model exits "
          f"with {proc.returncode}: {last[:200]})")


@pytest.fixture(scope="session")
def tflite_converter():
  """Skips a test where TFLite cannot convert Keras models at all."""
  reason = tflite_unavailable_reason()
  if reason:
    pytest.skip(reason)
