"""Tests of tf_recurrent.step_clusters: the generic loops' steps as XLA
clusters outside XLA, computing what the plain steps compute."""

import collections
import logging
import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent
from tf_recurrent.op import step_clusters
from conftest import (GRAPH_MODES, assert_all_close, assert_numerical_gradients,
                      elman_args, elman_cell, elman_grad, run_fresh,
                      static_unroll, values_and_grads)

# The traced functions of the two step kinds (loops.py's names).
_STEP_FUNCTIONS = ("_step_on_row", "_grad_sums")


def compiled_steps(graph_def):
  """Names of the step functions in `graph_def` compiled as XLA clusters."""
  return sorted(
      f.signature.name for f in graph_def.library.function
      if any(kind in f.signature.name for kind in _STEP_FUNCTIONS) and
      f.attr["_XlaMustCompile"].b)


def training_graph(cell_fn, xla_steps, jit_compile=False, seq_len=4,
                   batch=3, **kwargs):
  """The graph of a tf.function differentiating the op on the Elman case."""
  theta, state0, inputs = elman_args(seq_len, batch=batch)

  @tf.function(autograph=False, jit_compile=jit_compile)
  def step():
    with tf.GradientTape() as tape:
      tape.watch(theta)
      acc, _ = tf_recurrent.recurrent(theta, state0, inputs, cell_fn,
                                      xla_steps=xla_steps, **kwargs)
      loss = tf.reduce_sum(acc["h"])
    return tape.gradient(loss, theta)

  return step.get_concrete_function().graph.as_graph_def()


def loss_of(values):
  """A scalar reading every tensor of `values` (None leaves skipped)."""
  leaves = [v for v in tf.nest.flatten(values) if v is not None]
  return tf.add_n([tf.reduce_sum(tf.sin(v * (1.0 + 0.1 * i)))
                   for i, v in enumerate(leaves)])


def normalized_cell(theta, state, x):
  """Elman with its pre-activation layer-normalized: enough ops a step for
  "auto" to compile both steps (plain Elman's forward is too cheap)."""
  pre = x @ theta["w"] + state["h"] @ theta["u"]
  mean, variance = tf.nn.moments(pre, axes=[-1], keepdims=True)
  h = tf.tanh((pre - mean) * tf.math.rsqrt(variance + 1e-3) + theta["b"])
  return {"h": h}, []


def dropout_cell(theta, state, x):
  """Elman with step_seed() dropout on its input."""
  keep = tf.random.stateless_uniform(
      tf.shape(x), seed=tf_recurrent.step_seed(), dtype=x.dtype) < 0.7
  return elman_cell(theta, state, tf.where(keep, x / 0.7, 0.0))


@pytest.mark.parametrize("cell, xla_steps, want", [
    (normalized_cell, "auto", ["_grad_sums", "_step_on_row"]),
    (elman_cell, "auto", ["_grad_sums"]),  # Its forward: too few ops.
    (elman_cell, True, ["_grad_sums", "_step_on_row"]),
    (normalized_cell, False, [])])
def test_the_forward_and_gradient_steps_are_clusters(cell, xla_steps, want):
  compiled = compiled_steps(training_graph(cell, xla_steps))
  assert [k for k in _STEP_FUNCTIONS if any(k in c for c in compiled)] == (
      sorted(want, reverse=True))


def test_no_clusters_inside_an_xla_program():
  assert not compiled_steps(training_graph(elman_cell, True, jit_compile=True))


def test_auto_leaves_steps_of_few_ops_plain(caplog, monkeypatch):
  monkeypatch.setattr(step_clusters, "_reported", set())
  caplog.set_level(logging.INFO, logger="absl")
  training_graph(elman_cell, "auto")
  said = [r.getMessage() for r in caplog.records if "tf_recurrent" in
          r.getMessage()]
  assert len(said) == 1 and "forward step" in said[0], said
  assert "too few ops to pay for an XLA launch" in said[0]


@pytest.mark.parametrize("cell, reason", [
    (dropout_cell, "draws random numbers"),
    (lambda theta, state, x: elman_cell(theta, state, tf.numpy_function(
        lambda a: a, [x], x.dtype, stateful=False)), "no XLA_CPU_JIT kernel"),
    (lambda theta, state, x: elman_cell(theta, state, tf.cond(
        tf.reduce_all(x > -1e9), lambda: x, lambda: -x)), "control flow"),
    # XLA has Cumsum, but not of complex numbers.
    (lambda theta, state, x: elman_cell(theta, state, tf.math.real(
        tf.cumsum(tf.complex(x, x), axis=1))), "kernel for its dtypes"),
    # A row's count of positive entries, through a value-shaped tensor.
    (lambda theta, state, x: elman_cell(theta, state, x * tf.cast(
        tf.size(tf.boolean_mask(x, x > 0)), x.dtype)), "depends on its values"),
    (normalized_cell, None),
], ids=["random", "numpy_function", "cond", "complex_cumsum", "boolean_mask",
        "compilable"])
def test_auto_runs_plain_where_a_cluster_would_differ(cell, reason, caplog,
                                                      monkeypatch):
  monkeypatch.setattr(step_clusters, "_reported", set())
  caplog.set_level(logging.INFO, logger="absl")
  compiled = compiled_steps(training_graph(cell, "auto"))
  said = [r.getMessage() for r in caplog.records if "tf_recurrent" in
          r.getMessage()]
  if reason is None:
    assert len(compiled) == 2 and not said, said
    return
  assert not compiled
  assert len(said) == 2 and all(reason in s for s in said), said


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_kernel_registry_read_once_per_op_type(monkeypatch, mode):
  # TensorFlow filters its whole kernel registry per question: asked per
  # node of every traced step, that was 7% of tracing the op. (Under XLA
  # the loop is one program: no step is checked, nothing is asked.)
  reads = []
  registry = step_clusters.kernels.get_registered_kernels_for_op

  def counting(op_type):
    reads.append(op_type)
    return registry(op_type)

  monkeypatch.setattr(step_clusters.kernels, "get_registered_kernels_for_op",
                      counting)
  cached = getattr(step_clusters, "_xla_kernel_constraints", None)
  if cached is not None:  # Emptied, so that this test's steps ask again.
    cached.cache_clear()

  def build(watch):
    theta, state0, inputs = elman_args(4)
    watch(theta)
    acc, _ = tf_recurrent.recurrent(theta, state0, inputs, normalized_cell)
    return acc, tf.reduce_sum(acc["h"]), tf.nest.flatten(theta)

  for _ in range(2):  # Two traces (eagerly: the second call reuses one).
    values_and_grads(mode, build)
  if mode == "xla":
    assert not reads
  else:
    assert reads and len(reads) == len(set(reads)), sorted(reads)


def test_strings_run_plain():
  def cell(theta, state, x):
    width = tf.cast(tf.strings.length(tf.strings.as_string(x)), x.dtype)
    return elman_cell(theta, state, x + 0.0 * width)
  assert not compiled_steps(training_graph(cell, "auto"))


def test_a_tensor_array_read_in_the_step_runs_plain():
  seq_len = 4
  theta, state0, inputs = elman_args(seq_len)

  @tf.function(autograph=False)
  def step():
    rows = tf.TensorArray(tf.float64, size=seq_len).unstack(inputs)
    with tf.GradientTape() as tape:
      tape.watch(theta)
      _, final = tf_recurrent.recurrent(
          theta, state0, tf.range(seq_len),
          lambda th, s, t: elman_cell(th, s, rows.read(t)))
    return tape.gradient(final["h"], theta)

  assert not compiled_steps(step.get_concrete_function().graph.as_graph_def())


def _cases():
  """(name, build kwargs) of the op's contracts the clusters must keep."""
  return {
      "default_grad": {},
      "cell_grad": {"cell_grad": elman_grad},
      "sequence_length": {"sequence_length": [5, 0, 3]},
      "max_input_length": {"max_input_length": "tensor"},
      "checkpoint_every": {"checkpoint_every": 2, "accumulate_state": False},
      "stop_fn": {"stop_fn": lambda t, theta, s: tf.reduce_all(
          s["h"] > 0.99)},
      "rows_of_one_leaf": {"accumulate_state": {"h": True}},
  }


def _build(case, xla_steps, seq_len=5):
  kwargs = dict(_cases()[case])

  def build(watch):
    theta, state0, inputs = elman_args(seq_len)
    # A closed-over variable-free tensor that needs a gradient too.
    scale = tf.constant(0.8, tf.float64)
    watch([theta, state0, inputs, scale])
    if kwargs.get("max_input_length") == "tensor":
      kwargs["max_input_length"] = tf.constant(4)

    def cell(theta, state, x):
      return elman_cell(theta, state, x * scale)

    cell_grad = kwargs.pop("cell_grad", None)
    if cell_grad is not None:
      cell = elman_cell
    acc, final = tf_recurrent.recurrent(theta, state0, inputs, cell,
                                        cell_grad, xla_steps=xla_steps,
                                        **kwargs)
    values = [v for v in tf.nest.flatten((acc, final)) if v is not None]
    return values, loss_of(values), tf.nest.flatten(
        [theta, state0, inputs, scale])

  return build


@pytest.mark.parametrize("case", list(_cases()))
@pytest.mark.parametrize("mode", ["function", "tf1"])
def test_clustered_steps_equal_plain_steps(case, mode):
  clustered = values_and_grads(mode, _build(case, True))
  plain = values_and_grads(mode, _build(case, False))
  assert_all_close(clustered, plain, tol=1e-10)


@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_clustered_steps_equal_the_unroll(mode):
  def build(watch):
    theta, state0, inputs = elman_args(6)
    watch([theta, state0, inputs])
    values = tf_recurrent.recurrent(theta, state0, inputs, elman_cell)
    return values, loss_of(values), tf.nest.flatten([theta, state0, inputs])

  def unroll(watch):
    theta, state0, inputs = elman_args(6)
    watch([theta, state0, inputs])
    values = static_unroll(theta, state0, inputs, elman_cell)
    return values, loss_of(values), tf.nest.flatten([theta, state0, inputs])

  assert_all_close(values_and_grads(mode, build),
                   values_and_grads("eager", unroll), tol=1e-10)


def test_forced_clusters_with_random_draws_have_consistent_gradients():
  """xla_steps=True on a step_seed() dropout cell: XLA's own masks, drawn
  alike in the forward step and its recompute."""
  theta, state0, inputs = elman_args(4)

  @tf.function(autograph=False)
  def loss(w, x):
    acc, _ = tf_recurrent.recurrent({**theta, "w": w}, state0, x,
                                    dropout_cell, seed=[3, 4],
                                    xla_steps=True)
    return tf.reduce_sum(tf.sin(acc["h"]))

  assert_numerical_gradients(loss, [theta["w"], inputs])


def test_eager_calls_of_new_lengths_trace_no_new_clusters():
  traced = []

  def cell(theta, state, x):
    traced.append(x.shape)
    # A constant no other test's step holds: the op's eager cache, keyed by
    # what the step computes, must not hold this step's trace already.
    return elman_cell(theta, state, x * 1.2345)

  theta, state0, _ = elman_args(1)
  for seq_len in (3, 4, 6):
    with tf.GradientTape() as tape:
      tape.watch(theta)
      acc, _ = tf_recurrent.recurrent(
          theta, state0, elman_args(seq_len)[2], cell, xla_steps=True)
    tape.gradient(acc["h"], theta)
    if seq_len == 3:
      first = len(traced)
  # The first call: the probe, its repeat in the loops' trace, the forward
  # cluster, the gradient cluster; later ones only the probe that
  # fingerprints the step.
  assert first == 4
  assert len(traced) - first == 2


def test_under_a_distribution_strategy():
  strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  theta, state0, inputs = elman_args(5, batch=4)

  def grads(xla_steps):
    @tf.function(autograph=False)
    def replica(x, h0):
      with tf.GradientTape() as tape:
        tape.watch(theta)
        acc, _ = tf_recurrent.recurrent(theta, {"h": h0}, x, elman_cell,
                                        xla_steps=xla_steps)
        loss = tf.reduce_sum(acc["h"] ** 2)
      return tape.gradient(loss, theta)

    def run():
      def fn(ctx):
        i = ctx.replica_id_in_sync_group
        return replica(inputs[:, 2 * i:2 * i + 2],
                       state0["h"][2 * i:2 * i + 2])
      per_replica = strategy.run(
          lambda: fn(tf.distribute.get_replica_context()))
      return tf.nest.map_structure(
          lambda g: strategy.reduce("SUM", g, axis=None), per_replica)

    return run()

  assert_all_close(grads("auto"), grads(False), tol=1e-10)


def test_saved_model_graphs_hold_no_clusters(tmp_path):
  theta, state0, _ = elman_args(1)

  class Module(tf.Module):

    @tf.function(input_signature=[tf.TensorSpec([None, 3, 4], tf.float64)])
    def __call__(self, x):
      return tf_recurrent.recurrent(theta, state0, x, elman_cell,
                                    xla_steps=True)[1]["h"]

  x = elman_args(5)[2]
  module = Module()
  tf.saved_model.save(module, str(tmp_path / "plain"))
  saved = tf.saved_model.load(str(tmp_path / "plain"))
  np.testing.assert_allclose(saved(x), module(x), rtol=1e-10)
  pb = (tmp_path / "plain" / "saved_model.pb").read_bytes()
  assert b"_XlaMustCompile" not in pb
  # Traced before tf.saved_model.save, a function keeps its clusters, and
  # serves in a fresh process without tf_recurrent.
  traced = Module()
  want = traced(x).numpy()
  assert compiled_steps(
      traced.__call__.get_concrete_function().graph.as_graph_def())
  tf.saved_model.save(traced, str(tmp_path / "clustered"))
  np.save(tmp_path / "x.npy", x.numpy())
  np.save(tmp_path / "want.npy", want)
  run_fresh("""
      import pathlib, sys
      import numpy as np
      import tensorflow as tf
      root = pathlib.Path(sys.argv[1])
      served = tf.saved_model.load(str(root / "clustered"))
      np.testing.assert_allclose(served(np.load(root / "x.npy")),
                                 np.load(root / "want.npy"), rtol=1e-10)
  """, tmp_path)


def test_xla_steps_must_be_auto_or_a_bool():
  theta, state0, inputs = elman_args(2)
  with pytest.raises(ValueError, match="xla_steps must be"):
    tf_recurrent.recurrent(theta, state0, inputs, elman_cell, xla_steps="on")


@pytest.mark.parametrize("mode", ["eager", "function"])
def test_a_variable_read_in_the_step_gets_its_gradient(mode):
  theta, state0, inputs = elman_args(5)
  scale = tf.Variable(tf.fill([4], tf.constant(0.7, tf.float64)))

  def grads(run):
    def fn():
      with tf.GradientTape() as tape:
        values = run(lambda th, s, x: elman_cell(th, s, x * scale))
        loss = loss_of(values)
      return tape.gradient(loss, [scale, theta])
    return fn() if mode == "eager" else tf.function(fn, autograph=False)()

  clustered = grads(lambda cell: tf_recurrent.recurrent(
      theta, state0, inputs, cell, xla_steps=True))
  plain = grads(lambda cell: tf_recurrent.recurrent(
      theta, state0, inputs, cell, xla_steps=False))
  unrolled = grads(lambda cell: static_unroll(theta, state0, inputs, cell))
  assert_all_close(clustered, plain, tol=1e-10)
  assert_all_close(clustered, unrolled, tol=1e-10)


@keras.saving.register_keras_serializable(package="test_step_clusters")
class _HalfDecayCell(keras.layers.Layer):
  """A user's Keras cell: h = tanh(x K + h / 2)."""

  state_size = 4
  output_size = 4

  def build(self, input_shape):
    self.kernel = self.add_weight(shape=(input_shape[-1], 4), name="kernel")

  def call(self, inputs, states):
    h = keras.ops.tanh(keras.ops.matmul(inputs, self.kernel) + 0.5 * states[0])
    return h, [h]


@pytest.mark.parametrize("policy", ["float32", "mixed_float16"])
def test_a_keras_cell_in_the_rnn_layer(policy):
  previous = keras.config.dtype_policy()
  keras.config.set_dtype_policy(policy)
  try:
    layer = tf_recurrent.RNN(_HalfDecayCell(), return_sequences=True)
    x = tf.random.stateless_normal([2, 6, 3], seed=[1, 2])
    layer(x)
    results, graphs = {}, {}
    for xla_steps in (True, False):
      layer.xla_steps = xla_steps

      @tf.function(autograph=False)
      def step():
        with tf.GradientTape() as tape:
          y = layer(x, training=True)
          loss = tf.reduce_sum(tf.cast(y, tf.float32) ** 2)
        return y, tape.gradient(loss, layer.trainable_weights)

      results[xla_steps] = step()
      graphs[xla_steps] = step.get_concrete_function().graph.as_graph_def()
  finally:
    keras.config.set_dtype_policy(previous)
  assert len(compiled_steps(graphs[True])) == 2
  assert not compiled_steps(graphs[False])
  tol = 1e-6 if policy == "float32" else 1e-2
  assert_all_close(tf.nest.map_structure(
      lambda t: tf.cast(t, tf.float32), results[True]),
                   tf.nest.map_structure(
      lambda t: tf.cast(t, tf.float32), results[False]), tol=tol)
  assert tf_recurrent.RNN.from_config(
      tf_recurrent.RNN(_HalfDecayCell(), xla_steps=False).get_config()
  ).xla_steps is False


@pytest.mark.parametrize("mode", ["function", "tf1"])
def test_lingvo_recurrent_gets_the_clusters(mode):
  """Lingvo's entry runs on the op: its steps are clusters too, and its
  results are the unroll's."""
  graphs = []

  def build(watch):
    theta, state0, inputs = elman_args(5)
    watch([theta, state0, inputs])
    acc, final = tf_recurrent.lingvo.Recurrent(theta, state0, inputs,
                                               normalized_cell)
    graphs.append(tf.compat.v1.get_default_graph())
    values = [acc["h"], final["h"]]
    return values, loss_of(values), tf.nest.flatten([theta, state0, inputs])

  def unroll(watch):
    theta, state0, inputs = elman_args(5)
    watch([theta, state0, inputs])
    acc, final = static_unroll(theta, state0, inputs, normalized_cell)
    values = [acc["h"], final["h"]]
    return values, loss_of(values), tf.nest.flatten([theta, state0, inputs])

  assert_all_close(values_and_grads(mode, build),
                   values_and_grads("eager", unroll), tol=1e-10)
  assert len(compiled_steps(graphs[0].as_graph_def())) == 2


def scaled_cell(scale):
  """`normalized_cell` with its new state scaled by `scale`, a variable the
  step closes over (captured, not an argument)."""
  def cell(theta, state, x):
    new, extras = normalized_cell(theta, state, x)
    return {"h": new["h"] * scale}, extras
  return cell


def cluster_names(graph_def):
  return sorted(f.signature.name for f in graph_def.library.function
                if f.attr["_XlaMustCompile"].b)


def test_equal_steps_share_one_cluster_each_with_its_own_captures():
  # Two layers of a stack, or fit and then predict: equal steps, other
  # variables. One function per structure (XLA compiles it once); a step
  # of another shape gets its own.
  scales = [tf.Variable(0.8, dtype=tf.float64), tf.Variable(1.3,
                                                          dtype=tf.float64)]
  names = [cluster_names(training_graph(scaled_cell(s), "auto"))
           for s in scales]
  assert names[0] and names[0] == names[1], names
  # Another length: the same steps. Another batch size: other steps.
  longer = cluster_names(training_graph(scaled_cell(scales[0]), "auto",
                                        seq_len=6))
  wider = cluster_names(training_graph(scaled_cell(scales[0]), "auto",
                                       batch=4))
  assert longer == names[0] and not set(wider) & set(names[0]), (
      longer, wider, names[0])


@pytest.mark.parametrize("mode", ["eager", "function", "tf1"])
def test_shared_clusters_read_each_traces_own_variables(mode):
  # Each trace's variable, not the first trace's: values and gradients
  # (the variable's too, which the op learns from the cluster's call) as
  # the plain steps compute them, for two variables of other values.
  results = {}
  for xla_steps in ("auto", False):
    for value in (0.8, 1.3):
      # A TF1 graph makes its own variables; a tf.function's are made once.
      outer = None if mode == "tf1" else tf.Variable(value, dtype=tf.float64)

      def build(watch, value=value, xla_steps=xla_steps, outer=outer):
        scale = outer if outer is not None else tf.Variable(
            value, dtype=tf.float64)
        theta, state0, inputs = elman_args(5)
        watch(theta)
        acc, final = tf_recurrent.recurrent(theta, state0, inputs,
                                            scaled_cell(scale),
                                            xla_steps=xla_steps)
        return ((acc, final), loss_of((acc, final)),
                tf.nest.flatten(theta) + [scale])

      results[xla_steps, value] = values_and_grads(mode, build)
  for value in (0.8, 1.3):
    assert_all_close(results["auto", value], results[False, value], 1e-9)
  assert not np.allclose(results["auto", 0.8][0][0], results["auto", 1.3][0][0])


def test_traces_in_threads_keep_the_shared_clusters_whole(monkeypatch):
  # Traces may run in threads (a tf.data map, a server's handlers). With one
  # cluster kept, each new structure evicts the one before. An insertion that
  # lingers (this dict's: it sleeps after storing) gives the other thread the
  # time to insert its own and evict it; unlocked, the first thread then
  # moved a key that was gone to the end: a KeyError out of the trace.
  class LingeringDict(collections.OrderedDict):

    def __setitem__(self, key, value):
      super().__setitem__(key, value)
      time.sleep(0.2)

  monkeypatch.setattr(step_clusters, "_SHARED_CLUSTERS_KEPT", 1)
  monkeypatch.setattr(step_clusters, "_shared_clusters", LingeringDict())
  names, errors = {}, []

  def trace(batch):
    try:
      names[batch] = cluster_names(training_graph(normalized_cell, "auto",
                                                  batch=batch))
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=trace, args=(batch,)) for batch in (3, 4)]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  assert not errors, errors
  # Each trace got its own steps compiled (other batch sizes: other steps).
  assert names[3] and names[4] and not set(names[3]) & set(names[4]), names
  assert len(step_clusters._shared_clusters) == 1  # pylint: disable=protected-access
