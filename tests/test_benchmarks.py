"""The benchmark scripts run end to end at tiny sizes (no timing asserted).

Each starts fresh TensorFlow processes (a memory figure is one process's
peak), five minutes of the suite's CPU on 2 cores: they run with
`--benchmarks` (or `TFR_BENCHMARKS=1`), as CI does.
"""

import importlib.util
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).parent.parent

pytestmark = pytest.mark.benchmarks


def test_benchmark_smoke(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.bench_lstm", "--lengths=6,12",
       "--batch=2", "--input=3", "--hidden=4", "--memory_hidden=4",
       "--memory_lengths=6,12", "--repeats=1",
       # One pair (the suite's time budget): the mixed_bfloat16 rows run
       # the same code with another policy.
       "--only=tf_recurrent.GRU,keras.layers.GRU",
       # Memory (a fresh process per length) for ours in both modes, the
       # TF one again with malloc pinned, and for Keras's under XLA (the
       # targets compare the two): Keras's TF row is the same child code.
       "--memory_only=tf_recurrent.GRU,keras.layers.GRU|xla",
       f"--out_dir={tmp_path}"],
      capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads((tmp_path / "results.json").read_text())
  names = {(r["name"], r["xla"]) for r in results["rows"]}
  ours = "tf_recurrent.GRU"
  assert names == {(n, x) for n in (ours, "keras.layers.GRU")
                   for x in (False, True)}
  for row in results["rows"]:
    assert all(v > 0 for v in row["us_per_step"].values())
    if (row["name"], row["xla"]) == ("keras.layers.GRU", False):
      assert "memory_bytes_per_step" not in row, row  # Not asked for.
      assert "memory_vs_state_pinned_malloc" not in row, row
      continue
    assert row["memory_bytes_per_step"] is not None
    # The TF executor's rows are measured again with malloc pinned.
    assert (row.get("memory_vs_state_pinned_malloc") is None) == row["xla"]
  report = (tmp_path / "RESULTS.md").read_text()
  assert f"| {ours} |" in report and "## Targets" in report
  # The memory table: the rows measured, and only those.
  assert f"| {ours} | TF | " in report and f"| {ours} | XLA | " in report
  assert "| keras.layers.GRU | XLA | " in report
  assert "| keras.layers.GRU | TF | " not in report
  assert f"- XLA, memory: {ours}" in report
  assert "- TF, T=12: tf_recurrent.GRU " in report
  assert (tmp_path / "results.png").stat().st_size > 10_000


def test_checkpoint_benchmark_smoke(tmp_path):
  sqrt_case = "recurrent, final only, checkpoint_every=\"sqrt\""
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.bench_checkpoint", "--batch=2",
       "--input=3", "--hidden=4", "--memory_lengths=10,40",
       "--time_length=10", "--repeats=1", f"--only={sqrt_case}",
       # The plain op (always run) is timed; its memory child is the same
       # code as the "sqrt" case's.
       f"--memory_only={sqrt_case}",
       f"--out_dir={tmp_path}"],
      capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads((tmp_path / "checkpoint.json").read_text())
  assert [r["name"] for r in results["rows"]] == [
      "recurrent, every state returned (plain op)", sqrt_case]
  plain, sqrt = results["rows"]
  for row in results["rows"]:
    assert row["us_per_step"] > 0
  assert len(sqrt["peaks"]) == 2 and None not in sqrt["peaks"]
  assert sqrt["bytes_per_step"] is not None
  assert "peaks" not in plain and "bytes_per_step" not in plain
  report = (tmp_path / "CHECKPOINT.md").read_text()
  assert sqrt_case in report
  assert "| recurrent, every state returned (plain op) | - | " in report
  # The targets: the "sqrt" memory slope and its time against the plain op.
  assert '- "sqrt" memory slope ' in report and '- "sqrt" time ' in report


def test_profile_smoke(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.profile_lstm", "--length=6",
       "--batch=2", "--input=3", "--hidden=4", "--repeats=1",
       f"--out_dir={tmp_path}"],
      capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = (tmp_path / "PROFILE.md").read_text()
  assert report.count("\n| ") == 8  # Header, six pieces, the lean step.
  assert "| tf_recurrent.LSTM, whole training step | " in report
  assert "| tf_recurrent.LSTM(recompute=True), whole training step" in report


def test_op_profile_smoke():
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.profile_ops", "--batch=2",
       "--steps=5", "--input=3", "--hidden=4", "--top=3"],
      capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  # One table per layer, each with its three busiest op types.
  assert proc.stdout.count("| op type |") == 2, proc.stdout
  assert "### ours: tf_recurrent.LSTM" in proc.stdout
  assert "### keras: keras.layers.LSTM" in proc.stdout
  rows = [l for l in proc.stdout.splitlines() if l.startswith("| ")
          and not l.startswith("| op type")]
  assert len(rows) == 6, proc.stdout


def test_rows_profile_smoke():
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.profile_rows", "--batch=2",
       "--hidden=3", "--steps=4", "--chunks=2", "--repeats=1"],
      capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [l for l in proc.stdout.splitlines() if l.startswith("| ")
          and not l.startswith("| kept")]
  assert [r.split(" | ")[0] for r in rows] == [
      "| nothing", "| one buffer", "| a buffer per chunk (2)",
      "| TensorList", "| TensorList, stacked"], proc.stdout
  # The reason the kept rows are dense: a TensorList capture cannot be
  # saved, a dense one can.
  assert "- as a TensorList: KeyError" in proc.stdout, proc.stdout
  assert "- as a dense tensor: saved" in proc.stdout, proc.stdout


def test_xla_profile_smoke():
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.profile_xla", "--batch=2",
       "--steps=5", "--input=3", "--hidden=4", "--top=3", "--repeats=1"],
      capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "### ours: tf_recurrent.LSTM" in proc.stdout, proc.stdout
  assert "### keras: keras.layers.LSTM" in proc.stdout, proc.stdout
  rows = [l.split(" | ") for l in proc.stdout.splitlines()
          if l.startswith("| ") and not l.startswith("| HLO")]
  # Each layer's three costliest HLOs, each launched at least once a call
  # and timed (in us: tiny shapes round to 0.00 ms).
  assert len(rows) == 6, proc.stdout
  assert all(float(r[3]) > 0 and float(r[4].rstrip(" |")) > 0
             for r in rows), proc.stdout
  assert len(re.findall(r"HLO time [0-9.]+ ms per call", proc.stdout)) == 2


def test_convlstm_benchmark_smoke(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.bench_convlstm", "--ranks=3",
       "--lengths=3", "--memory_lengths=3,6", "--scale=8", "--repeats=1",
       # Ours and Keras's layers are timed in both modes; the memory
       # children (the same code for each) run the one layer only they
       # build, recompute=True, in both modes.
       "--memory_impls=ours_recompute",
       f"--out_dir={tmp_path}"],
      capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads((tmp_path / "convlstm.json").read_text())
  assert {(r["rank"], r["mode"]) for r in results["time"]} == {
      (3, mode) for mode in ("tf", "xla")}
  for row in results["time"]:
    assert row["keras"] > 0 and row["ours"] > 0
  assert [(r["rank"], r["mode"]) for r in results["memory"]] == [
      (3, "tf"), (3, "xla")]
  for row in results["memory"]:
    assert "keras" not in row and "ours" not in row
    assert len(row["ours_recompute"]["peaks"]) == 2
    assert None not in row["ours_recompute"]["peaks"]
    assert row["ours_recompute"]["vs_state"] is not None
  report = (tmp_path / "CONVLSTM.md").read_text()
  assert "| ConvLSTM3D | 2, 3x3x3x4 -> 8 | XLA | 3 |" in report
  assert "| ConvLSTM3D | no XLA |" in report
  for mode in ("no XLA", "XLA"):  # Memory: Keras's and ours as built "-".
    assert f"| ConvLSTM3D | {mode} | 3 / 6 | 1 | - | - | - | " in report


@pytest.mark.parametrize("proj_size", [0, 3])
def test_tflite_benchmark_smoke(tmp_path, tflite_converter, proj_size):
  del tflite_converter  # Skips where TFLite converts no Keras model.
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.bench_tflite", "--length=5",
       "--input=4", "--hidden=4", "--rounds=2", "--invokes=2",
       f"--proj_size={proj_size}", f"--json={tmp_path / 'tflite.json'}"],
      capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads((tmp_path / "tflite.json").read_text())
  fused, loop = results["rows"]
  assert fused["ops"] == ["UNIDIRECTIONAL_SEQUENCE_LSTM"]
  assert "WHILE" in loop["ops"]
  for row in results["rows"]:
    assert row["us_per_call"] > 0 and row["max_error"] < 1e-5
  assert set(results["sizes"]) == (
      set() if proj_size else {"float", "dynamic range", "int8"})


def test_dynamic_rnn_benchmark_smoke(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.bench_dynamic_rnn", "--lengths=4",
       "--memory_lengths=4,8", "--batch=2", "--input=3", "--hidden=4",
       "--rounds=1", "--only=tf_recurrent.dynamic_rnn(LSTMCell)",
       "--modes=xla", f"--out_dir={tmp_path}"],
      capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads((tmp_path / "dynamic_rnn.json").read_text())
  ours = "tf_recurrent.dynamic_rnn(LSTMCell)"
  assert [(r["name"], r["xla"]) for r in results["rows"]] == [(ours, True)]
  for row in results["rows"]:
    assert row["us_per_step"]["4"] > 0 and None not in row["memory"]["peaks"]
  assert f"| {ours} | XLA | " in (tmp_path / "DYNAMIC_RNN.md").read_text()


def test_seq2seq_benchmark_smoke(tmp_path):
  """Both decoders in both modes, the beam-search row, and a memory slope."""
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.bench_seq2seq", "--lengths=4",
       "--memory_sources=5", "--memory_lengths=3,6", "--batch=2",
       "--input=3", "--hidden=4", "--rounds=1", "--beam_width=2",
       f"--out_dir={tmp_path}"],
      capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads((tmp_path / "seq2seq.json").read_text())
  ours, keras_rnn = ("tf_recurrent.RNN(AttentionWrapper)",
                     "keras.layers.RNN(AttentionWrapper)")
  assert [(r["name"], r["xla"]) for r in results["rows"]] == [
      (ours, False), (keras_rnn, False), (ours, True), (keras_rnn, True)]
  for row in results["rows"]:
    assert row["ms_per_step"]["4"] > 0 and row["peak_rss"]["4"] > 0
    assert None not in row["memory"]["5"]["peaks"]
  assert set(results["beam_search"]) == {"TF", "XLA"}
  assert all(v["4"] > 0 for v in results["beam_search"].values())
  assert f"| {ours} | XLA | " in (tmp_path / "SEQ2SEQ.md").read_text()


def test_configs_benchmark_smoke(tmp_path):
  """A masked layer and the user's cell (with its JAX peers) under XLA, the
  op under XLA and as a TF1 graph, all in one run. Memory, a fresh process
  per length running the same code for every row and layer, is measured
  once in each mode the original cases ran: ours, the masked GRU under XLA
  and the op as a TF1 graph."""
  configs = ["GRU masked", "user LayerNorm LSTM cell", "op LSTM cell_fn"]
  measured = {("GRU masked", "xla"), ("op LSTM cell_fn", "tf1")}
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.bench_configs", "--lengths=6",
       "--batch=2", "--input=3", "--hidden=4", "--memory_hidden=4",
       "--memory_lengths=6,12", "--repeats=1", f"--only={','.join(configs)}",
       "--modes=xla,tf1", "--memory_impls=ours",
       f"--memory_only={','.join('|'.join(m) for m in sorted(measured))}",
       f"--out_dir={tmp_path}"],
      capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads((tmp_path / "configs.json").read_text())
  # TF1 graphs are the op's alone.
  assert [(r["config"], r["mode"]) for r in results["rows"]] == [
      ("GRU masked", "xla"), ("user LayerNorm LSTM cell", "xla"),
      ("op LSTM cell_fn", "xla"), ("op LSTM cell_fn", "tf1")]
  # The user's cell has JAX peers where JAX is installed (a bench extra).
  has_jax = importlib.util.find_spec("jax") is not None
  report = (tmp_path / "CONFIGS.md").read_text()
  for row in results["rows"]:
    config, mode = row["config"], row["mode"]
    times = row["us_per_step"]["6"]
    assert all(v > 0 for v in times.values())
    want = {"ours", "keras"} | ({"jax", "jax checkpoint"} if has_jax and
                                config.startswith("user") else set())
    assert set(times) == want, config
    # The report's memory column, "ours / Keras" ("-": not measured).
    line = f"| {config} | {'XLA' if mode == 'xla' else 'TF1 graph'} | "
    if (config, mode) in measured:
      assert list(row["memory_vs_state"]) == ["ours"]
      assert None not in row["memory_vs_state"].values()
      memory = r"-?[0-9.]+ / -"
    else:
      assert "memory_vs_state" not in row, row
      memory = "- / -"
    assert re.search(re.escape(line) + r".* \| " + memory + r" \|\n",
                     report), (config, mode, report)
  assert ("JAX with `jax.checkpoint`" in report) == has_jax


def test_configs_benchmark_runs_tf1_graphs_for_the_op_only(tmp_path):
  """A layer has no TF1-graph row: --modes=tf1 leaves it out."""
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.bench_configs", "--lengths=4",
       "--batch=2", "--input=3", "--hidden=4", "--repeats=1", "--nomemory",
       "--only=SimpleRNN plain,op LSTM cell_fn xla_steps=False",
       "--modes=tf1", f"--out_dir={tmp_path}"],
      capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads((tmp_path / "configs.json").read_text())
  assert [(r["config"], r["mode"]) for r in results["rows"]] == [
      ("op LSTM cell_fn xla_steps=False", "tf1")]


def test_shapes_benchmark_smoke(tmp_path):
  # A 2x2 grid of its own; ONLY must pick exactly one row out of the four.
  out = tmp_path / "shapes.json"
  env = {**os.environ, "SHAPES": "2,5,3;3,4,2", "UNITS": "4,5",
         "ONLY": "gru:3:5", "MODES": "default", "REPS": "1", "TORCH": "0",
         "OUT": str(out)}
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.bench_shapes"], env=env,
      capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  header, *rows = [json.loads(l) for l in out.read_text().splitlines()]
  assert header["environment"]["cpu"] in proc.stdout
  assert [r["row"] for r in rows] == ["gru:3:5"]
  row = rows[0]
  assert (row["B"], row["T"], row["D"], row["H"]) == (3, 4, 2, 5)
  assert "xla" not in row and row["torch_ms"] is None
  mode = row["default"]
  assert mode["keras_ms"] > 0 and mode["ours_ms"] > 0
  assert mode["jit_resolved"] is False  # Keras 3: no XLA on a CPU by default.
  assert abs(mode["ratio"] - mode["keras_ms"] / mode["ours_ms"]) < 1e-9
  assert len(row["gemm_ms"]) == 6 and row["floor_ms"] >= 0
  met = (mode["ratio"] >= 1.2 or mode["ours_ms"] <= 1.1 * row["floor_ms"])
  assert mode["target"] == ("met" if met else "not met")
  assert "| GRU | 3, 4, 2 | 5 | " in proc.stdout


def test_calls_benchmark_smoke(tmp_path):
  out = tmp_path / "calls.json"
  # JOBS=2: the two processes side by side, for the test's time only.
  env = {**os.environ, "ONLY": "eager", "PROCS": "1", "CALLS": "2",
         "JOBS": "2", "OUT": str(out)}
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.bench_calls"], env=env,
      capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  header, *rows = [json.loads(l) for l in out.read_text().splitlines()]
  assert header["environment"]["cpu"] in proc.stdout
  assert [r["row"] for r in rows] == ["eager"]
  row = rows[0]
  for impl in ("keras", "ours"):
    (run,) = row["runs"][impl]  # PROCS=1: one fresh process per layer.
    assert run["lengths"] == [10, 11] and len(run["per_call_s"]) == 2
    assert run["seconds"] >= sum(run["per_call_s"]) > 0
    assert row[f"{impl}_s"] == run["seconds"]
  assert row["target"] == ("met" if row["ours_s"] <= row["keras_s"]
                           else "not met")
  assert "| eager | (a) eager LSTM(32) B=8 D=16, 2 lengths T=10..11" in (
      proc.stdout)


LINEAR_ROWS = ["tf_recurrent.MinGRU", "MinGRU floor (gates only)",
               "tf_recurrent.LSTM", "jax minGRU lax.scan"]


def test_linear_benchmark_smoke(tmp_path):
  """bench_linear at tiny sizes, then its chunk sweep into the same
  directory: LINEAR.md holds both sections. A layer, its floor (skipped past
  --floor_max_length, the reason recorded), the LSTM the ratios divide by,
  and a JAX row (where JAX is installed: XLA only), in both modes; memory
  (a fresh process per length) for the layer alone."""
  has_jax = importlib.util.find_spec("jax") is not None
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.bench_linear", "--lengths=8,16",
       "--batch=2", "--hidden=4", "--rounds=1", "--memory_lengths=8,16",
       "--floor_max_length=8", f"--only={','.join(LINEAR_ROWS)}",
       "--memory_rows=tf_recurrent.MinGRU,harness (outputs = w x)",
       f"--out_dir={tmp_path}"],
      capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads((tmp_path / "linear.json").read_text())
  assert results["environment"]["cpu"] in proc.stdout  # lscpu's model.
  harness = "harness (outputs = w x)"  # Memory only, first.
  want = [(n, False) for n in [harness] + LINEAR_ROWS[:3]] + [
      (n, True) for n in [harness] + (LINEAR_ROWS if has_jax else
                                      LINEAR_ROWS[:3])]
  assert [(r["name"], r["xla"]) for r in results["rows"]] == want
  for row in results["rows"]:
    floor = row["name"].endswith("floor (gates only)")
    timed = [] if row["name"] == harness else ["8"] if floor else ["8", "16"]
    assert list(row["us_per_step"]) == timed
    assert all(v > 0 for v in row["us_per_step"].values())
    assert list(row["skipped"]) == (["16"] if floor else [])
    if row["name"] in ("tf_recurrent.MinGRU", harness):
      assert row["memory"]["lengths"] == [8, 16]
      assert None not in row["memory"]["peaks"]
      assert row["memory"]["vs_state"] is not None
    else:
      assert row["memory"] is None
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.bench_linear", "--sweep_chunk",
       "--sweep_lengths=10", "--chunk_sizes=3,16", "--modes=xla",
       "--batch=2", "--hidden=4", "--rounds=1", f"--out_dir={tmp_path}"],
      capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  sweep = json.loads((tmp_path / "linear_chunks.json").read_text())
  assert [(r["name"], r["xla"], r["length"]) for r in sweep["rows"]] == [
      ("tf_recurrent.MinGRU", True, 10), ("tf_recurrent.linear_scan", True,
                                          10)]
  assert all(set(r["us_per_step"]) == {"3", "16"} for r in sweep["rows"])
  report = (tmp_path / "LINEAR.md").read_text()
  assert "| tf_recurrent.MinGRU | XLA | " in report
  assert f"| {harness} | TF | 8, 16 | " in report  # Memory only.
  assert f"| {harness} | TF | 8" not in report.split("### Ratios")[0]
  assert re.search(r"\| tf_recurrent\.MinGRU \| XLA \| 8, 16 \| [-0-9]+ \| "
                   r"[-0-9.]+ \| [-0-9.]+ \| [0-9.]+ \|", report), report
  assert "| MinGRU floor (gates only) | TF | " in report
  assert ("- MinGRU floor (gates only), TF, T=16: floors are timed up to "
          "T=8") in report
  assert "- tf_recurrent.MinGRU, XLA: speed-up >= 2.5x" in report
  assert "| tf_recurrent.linear_scan | XLA | 10 | " in report
  assert "## Chunk size" in report and "## Training step" in report


def test_linear_benchmark_predicts_a_step_from_its_growth():
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  assert common.predicted_seconds({}, 64) is None
  assert common.predicted_seconds({16: 2.0}, 64) == 8.0
  # Per-step time that falls with T predicts linear growth, not a fall.
  assert common.predicted_seconds({16: 2.0, 32: 2.0}, 64) == 4.0
  # Time per step doubling with each doubling of T: quadratic.
  np.testing.assert_allclose(
      common.predicted_seconds({16: 1.0, 32: 4.0}, 128), 64.0)


def test_jax_min_gru_is_the_layers_min_gru():
  """The JAX rows time the minGRU of tf_recurrent.MinGRU: the same loss
  and weight gradients, with lax.scan and lax.associative_scan."""
  jax = pytest.importorskip("jax")
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  import tf_recurrent  # pylint: disable=g-import-not-at-top
  from benchmarks import linear_steps  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  x = rng.normal(size=(3, 9, 4)).astype(np.float32)
  kernel = rng.normal(size=(4, 10)).astype(np.float32)
  bias = rng.normal(size=(10,)).astype(np.float32)
  layer = tf_recurrent.MinGRU(5, return_sequences=True, chunk_size=4)
  layer.build(x.shape)
  layer.set_weights([kernel, bias])
  with tf.GradientTape() as tape:
    loss = tf.reduce_mean(tf.square(layer(x)))
  want = [loss.numpy()] + [g.numpy() for g in tape.gradient(
      loss, layer.trainable_weights)]
  for associative in (False, True):
    value_and_grad = jax.value_and_grad(
        lambda k, b, a=associative: linear_steps.jax_min_gru_loss(
            k, b, x, a), argnums=(0, 1))
    got_loss, got_grads = value_and_grad(kernel, bias)
    for got, expected in zip([got_loss, *got_grads], want):
      np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5,
                                 atol=1e-6)


def test_linear_report_judges_the_targets():
  """LINEAR.md's verdicts from made-up figures: a speed-up of 3.0x and 2.0x
  misses 2.5x at both lengths; 1.2x and 1.4x the floor is within 1.4x;
  per-step times 100 to 125 are not flat within 20%; a slope of 3.25 states
  is 0.5 beyond the harness's 2.75."""
  from benchmarks import linear_report  # pylint: disable=g-import-not-at-top

  def row(name, times, memory=None):
    return {"name": name, "xla": False, "skipped": {}, "memory": memory,
            "us_per_step": {str(t): v for t, v in times.items()}}

  results = {"lengths": [1024, 4096], "rows": [
      row("harness (outputs = w x)", {}, {"vs_state": 2.75}),
      row("tf_recurrent.MinGRU", {1024: 100.0, 4096: 125.0},
          {"vs_state": 3.25}),
      row("MinGRU floor (gates only)", {1024: 100 / 1.2, 4096: 125 / 1.4}),
      row("tf_recurrent.LSTM", {1024: 300.0, 4096: 250.0})]}
  (line,) = [l for l in linear_report.target_lines(results)
             if l.startswith("- ")]
  assert line == (
      "- tf_recurrent.MinGRU, TF: speed-up >= 2.5x tf_recurrent.LSTM at "
      "T=1024, T=4096: missed (3.00x, 2.00x); within 1.4x the floor at "
      "T=1024, T=4096: met (1.20x, 1.40x); per-step time flat within 20% "
      "over T=1024,4096: missed (1.25); memory <= 1 state beyond the "
      "harness: met (0.50).")
