"""SavedModel export: served in a fresh process without tf_recurrent, by the
CLI, step by step, and fine-tuned after reload (the fresh process and the
export example run as programs: `--programs`)."""

import json
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent
from conftest import run_fresh

D, H = 3, 4
SHAPES = [(1, 1), (2, 5), (3, 9)]  # (batch, time) pairs served.


class ElmanModule(tf.Module):
  """A plain tf.Module whose tf.function calls tf_recurrent.recurrent."""

  def __init__(self):
    super().__init__()
    self.w = tf.Variable(tf.random.normal([D, H], seed=1))
    self.u = tf.Variable(tf.random.normal([H, H], seed=2) * 0.3)

  @tf.function(input_signature=[tf.TensorSpec([None, None, D], tf.float32)])
  def __call__(self, x):
    def cell(theta, state, x_t):
      return {"h": tf.tanh(x_t @ theta["w"] + state["h"] @ theta["u"])}, []
    time_major = tf.transpose(x, [1, 0, 2])
    acc, _ = tf_recurrent.recurrent(
        {"w": self.w, "u": self.u}, {"h": tf.zeros([tf.shape(x)[0], H])},
        time_major, cell)
    return tf.transpose(acc["h"], [1, 0, 2])


def inputs_for(batch, time):
  return np.random.default_rng(batch * 100 + time).normal(
      size=[batch, time, D]).astype(np.float32)


def keras_model():
  return keras.Sequential([
      keras.Input((None, D)),
      tf_recurrent.LSTM(H, return_sequences=True),
      tf_recurrent.GRU(H + 1, return_sequences=True),
      keras.layers.Dense(2),
  ])


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
  """Exports three ways and records the in-memory answers."""
  root = tmp_path_factory.mktemp("exports")
  module = ElmanModule()
  tf.saved_model.save(
      module, str(root / "module"),
      options=tf.saved_model.SaveOptions(experimental_custom_gradients=True))
  model = keras_model()
  model.export(str(root / "keras"))
  tf_recurrent.export_saved_model(model, str(root / "streaming"))
  expected = {}
  for batch, time in SHAPES:
    x = tf.constant(inputs_for(batch, time))
    with tf.GradientTape() as tape:
      y = module(x)
      loss = tf.reduce_sum(y * y)
    grads = tape.gradient(loss, [module.w, module.u])
    expected[f"{batch}x{time}"] = {
        "module": module(x).numpy().tolist(),
        "module_grads": [g.numpy().tolist() for g in grads],
        "keras": model(x).numpy().tolist(),
    }
  (root / "expected.json").write_text(json.dumps(expected))
  return root


# One fresh process (no tf_recurrent) does all the serving work the tests
# below check, each part in its own section so that one failing part fails
# only its test: the SavedModel CLI on the streaming export (`show --all`, a
# good and a wrong input), the CLI command the export example printed, and the
# exports loaded, served, stepped and fine-tuned. The CLI runs as its program
# does (`saved_model_cli.main()` with its arguments in `sys.argv`), so each
# call's exit status is what the command's would be: `sys.exit`'s code, or 1
# for an exception escaping `main` (a crash would kill the process, and every
# test here would fail).
SERVE = """
    import contextlib, io, json, pathlib, sys, traceback
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.tools import saved_model_cli
    root = pathlib.Path(sys.argv[1])
    sections = {}

    def section(name):
      def run(body):
        try:
          sections[name] = {"ok": True, "value": body()}
        except Exception:  # pylint: disable=broad-except
          sections[name] = {"ok": False, "error": traceback.format_exc()}
      return run

    def cli(*args):
      out, err = io.StringIO(), io.StringIO()
      sys.argv = ["saved_model_cli", *args]
      with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
          saved_model_cli.main()
          code = 0
        except SystemExit as e:
          code = 0 if e.code in (None, False) else (
              e.code if isinstance(e.code, int) else 1)
        except Exception:  # pylint: disable=broad-except
          traceback.print_exc()
          code = 1
      return {"returncode": code, "stdout": out.getvalue(),
              "stderr": err.getvalue()}

    streaming_dir = str(root / "streaming")

    @section("cli")
    def _():
      run = ("run", "--dir", streaming_dir, "--tag_set", "serve",
             "--signature_def", "serving_default", "--inputs")
      return {"show": cli("show", "--dir", streaming_dir, "--all"),
              "good": cli(*run, f"inputs={root / 'good.npy'}"),
              "wrong": cli(*run, f"inputs={root / 'wrong.npy'}")}

    @section("adding")
    def _():
      command = json.loads((root / "adding_command.json").read_text())
      return cli(*command)

    @section("serve")
    def _():
      expected = json.loads((root / "expected.json").read_text())
      module = tf.saved_model.load(str(root / "module"))
      keras_export = tf.saved_model.load(str(root / "keras"))
      streaming = tf.saved_model.load(str(root / "streaming"))
      serve = streaming.signatures["serving_default"]
      for key, want in expected.items():
        batch, time = map(int, key.split("x"))
        x = np.random.default_rng(batch * 100 + time).normal(
            size=[batch, time, 3]).astype(np.float32)
        x = tf.constant(x)
        np.testing.assert_allclose(module(x), want["module"], atol=1e-5)
        with tf.GradientTape() as tape:
          y = module(x)
          loss = tf.reduce_sum(y * y)
        grads = tape.gradient(loss, [module.w, module.u])
        for g, w in zip(grads, want["module_grads"]):
          np.testing.assert_allclose(g, w, atol=1e-4)
        np.testing.assert_allclose(keras_export.serve(x), want["keras"],
                                   atol=1e-5)
        np.testing.assert_allclose(serve(inputs=x)["output"], want["keras"],
                                   atol=1e-5)
        # Token by token from the zero state reproduces the whole sequence.
        state = streaming.signatures["initial_state"](
            batch_size=tf.constant(batch))
        for t in range(time):
          out = streaming.signatures["step"](inputs=x[:, t], **state)
          state = {k: v for k, v in out.items() if k.startswith("state_")}
          np.testing.assert_allclose(out["output"], np.asarray(want["keras"])[:, t],
                                     atol=1e-5)
      # A fine-tuning step on the reloaded module moves its weights.
      before = module.w.numpy().copy()
      opt = tf.keras.optimizers.SGD(0.1)
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(module(x) ** 2)
      opt.apply_gradients(zip(tape.gradient(loss, [module.w]), [module.w]))
      assert not np.allclose(before, module.w.numpy())
      # Bad input: the signature's own error, not a crash.
      rejected = []
      for bad in (tf.ones([2, 5, 4]), tf.ones([2, 3]), tf.ones([2, 5, 3], tf.int32)):
        try:
          serve(inputs=bad)
        except (TypeError, ValueError, tf.errors.InvalidArgumentError) as e:
          message = str(e)
          assert any(word in message for word in ("shape", "dtype", "expected")), message
          rejected.append(f"{type(e).__name__} {message.splitlines()[0][:160]}")
        else:
          raise AssertionError(f"accepted {bad.shape} {bad.dtype}")
      return rejected

    print("SECTIONS " + json.dumps(sections))
"""


@pytest.fixture(scope="module")
def adding_export(exported):
  """The export example run once: `(its process, its export directory)`;
  the `saved_model_cli run` command it prints is left for `served`."""
  directory = exported / "adding"
  proc = subprocess.run(
      [sys.executable, "-m", "tpu_examples.export_saved_model",
       f"--export_dir={directory}", "--train_steps=3", "--export_seq_len=8"],
      capture_output=True, text=True, timeout=300, check=False,
      cwd=pathlib.Path(__file__).parents[2])
  command = [line.strip() for line in proc.stdout.splitlines()
             if line.strip().startswith("saved_model_cli run")]
  if len(command) == 1:
    (exported / "adding_command.json").write_text(
        json.dumps(command[0].split()[1:]))
  return proc, command


@pytest.fixture(scope="module")
def served(exported, adding_export):
  """What the one fresh process (`SERVE`) found, by section: `{"ok": True,
  "value": ...}` or `{"ok": False, "error": traceback}`."""
  del adding_export  # Its command is read from adding_command.json.
  np.save(exported / "good.npy", inputs_for(2, 5))
  np.save(exported / "wrong.npy", np.ones([2, 5, 7], np.float32))
  out = run_fresh(SERVE, exported)
  (line,) = [l for l in out.splitlines() if l.startswith("SECTIONS ")]
  return json.loads(line[len("SECTIONS "):])


def section(served, name):
  assert served[name]["ok"], served[name]["error"]
  return served[name]["value"]


@pytest.mark.programs  # One fresh process serves all three.
def test_fresh_process_serves_and_fine_tunes(served):
  rejected = section(served, "serve")
  assert len(rejected) == 3, rejected


@pytest.mark.programs  # One fresh process serves all three.
def test_saved_model_cli_show_and_run(served):
  calls = section(served, "cli")
  show, run, bad = calls["show"], calls["good"], calls["wrong"]
  assert show["returncode"] == 0, show["stderr"][-2000:]
  for name in ("serving_default", "initial_state", "step"):
    assert f"signature_def['{name}']" in show["stdout"]
  assert run["returncode"] == 0, run["stderr"][-2000:]
  assert "Result for output key output" in run["stdout"], run["stdout"][-2000:]
  assert bad["returncode"] > 0  # an error exit, not a crash
  assert "Cannot feed value of shape (2, 5, 7)" in bad["stderr"], (
      bad["stderr"][-2000:])


@pytest.mark.programs  # One fresh process serves all three.
def test_export_example_prints_a_working_cli_command(adding_export, served):
  proc, command = adding_export
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert len(command) == 1, proc.stdout
  run = section(served, "adding")
  assert run["returncode"] == 0, run["stderr"][-2000:]
  assert "Result for output key output" in run["stdout"]


def outputs_and_gradients(module, x):
  with tf.GradientTape() as tape:
    y = module(x)
    loss = tf.reduce_sum(y * y)
  return [y] + tape.gradient(loss, [module.w, module.u])


def test_module_on_the_op_restores_and_reloads_in_process(tmp_path):
  # The op in a tf.Module (the round-trip matrix's op row): a checkpoint
  # into a fresh module (its variables exist at construction, so a restore
  # is immediate) computes exactly the original's outputs and gradients;
  # its SavedModel reloaded here the same outputs, and gradients to float
  # rounding (the saved custom gradient is a graph that the loader
  # optimizes anew: 7e-7 relative seen).
  module, x = ElmanModule(), tf.constant(inputs_for(2, 5))
  want = outputs_and_gradients(module, x)
  path = tf.train.Checkpoint(module=module).save(str(tmp_path / "ckpt"))
  fresh = ElmanModule()
  for variable in (fresh.w, fresh.u):
    variable.assign(tf.zeros_like(variable))
  tf.train.Checkpoint(module=fresh).restore(path).assert_consumed()
  tf.saved_model.save(
      module, str(tmp_path / "saved"),
      options=tf.saved_model.SaveOptions(experimental_custom_gradients=True))
  reloaded = tf.saved_model.load(str(tmp_path / "saved"))
  for got, expected in zip(outputs_and_gradients(fresh, x), want):
    np.testing.assert_array_equal(got, expected)
  got = outputs_and_gradients(reloaded, x)
  np.testing.assert_array_equal(got[0], want[0])
  for g, expected in zip(got[1:], want[1:]):
    np.testing.assert_allclose(g, expected, rtol=1e-5, atol=1e-6)
