"""The tpu_examples jobs: the TPU step under XLA, replicas agree with one
device; run as programs (`--programs`): two workers end equal, a killed job
resumes, the char LM runs and its TFLite models compute what its
SavedModel does, the NMT tutorial trains and translates."""

import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from conftest import tflite_unavailable_reason
from tf_recurrent import seq2seq
from tf_recurrent import tflite
from tpu_examples import strategy as strategy_lib
from tpu_examples import train_adding
from tpu_examples import train_char_lm
from tpu_examples import train_nmt

# The tests that run a job as a program, in processes of its own: tens of
# seconds each; `--programs` runs them (CI does).
PROGRAM = pytest.mark.programs
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = dict(hidden=8, seed=3, learning_rate=1e-2, global_batch=8)
SEQ_LEN = 12


def batches(strategy, first_step=0):
  return strategy_lib.distribute_steps(
      strategy, lambda i: train_adding.adding_batch(0, i, 8, SEQ_LEN), 8,
      first_step)


def test_tpu_step_compiles_under_xla_with_use_tpu():
  """The replica step TPUStrategy would compile, compiled by XLA on CPU."""
  strategy = tf.distribute.get_strategy()
  model, _, _, trainer = train_adding.build(strategy, **SMALL, use_tpu=True)
  step = tf.function(trainer.replica_step, jit_compile=True)
  before = [v.numpy() for v in model.trainable_variables]
  x, y = train_adding.adding_batch(0, 0, 8, SEQ_LEN)
  loss = step((x, y))
  hlo = step.experimental_get_compiler_ir((x, y))(stage="hlo")
  assert np.isfinite(float(loss))
  assert all(np.any(b != v.numpy())
             for b, v in zip(before, model.trainable_variables))
  # The op's forward and reverse loops are inside the one compiled program.
  assert hlo.count(" while(") >= 2


def test_mirrored_matches_one_device():
  # XLA cannot run MirroredStrategy over CPU devices (xla_supported), so
  # both sides run without it: the difference is the replication alone.
  one = train_adding.build(tf.distribute.get_strategy(), **SMALL,
                           steps_per_call=3, jit_compile=False)
  mirrored_strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  two = train_adding.build(mirrored_strategy, **SMALL, steps_per_call=3,
                           jit_compile=False)
  assert two[3].strategy.num_replicas_in_sync == 2
  loss_1, grads_1 = one[3].gradients(batches(tf.distribute.get_strategy()))
  loss_2, grads_2 = two[3].gradients(batches(mirrored_strategy))
  np.testing.assert_allclose(float(loss_1), float(loss_2), rtol=1e-5)
  for a, b in zip(grads_1, grads_2):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)
  losses = [float(t.train(batches(t.strategy))) for t in (one[3], two[3])]
  np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
  for a, b in zip(one[0].trainable_variables, two[0].trainable_variables):
    np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-4, atol=1e-6)


def test_distribute_steps_rejects_an_uneven_split():
  with pytest.raises(ValueError, match="global batch 7 does not split evenly "
                     "over 2 replicas"):
    strategy_lib.distribute_steps(
        tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]),
        lambda i: tf.zeros([7]), 7)


def run_job(module, *args, env=None, **popen):
  command = [sys.executable, "-m", module, *args]
  return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1",
                               **(env or {})}, **popen)


ADDING = ["--hidden=8", f"--seq_len={SEQ_LEN}", "--batch=8",
          "--steps_per_call=2", "--log_every=2", "--checkpoint_every=4"]


def free_ports(count):
  sockets = [socket.socket() for _ in range(count)]
  for s in sockets:
    s.bind(("localhost", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


def checkpoint_values(directory):
  reader = tf.train.load_checkpoint(directory)
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()
          if name.startswith("model/")}


@PROGRAM
def test_two_workers_end_with_identical_weights(tmp_path):
  ports = free_ports(2)
  cluster = {"worker": [f"localhost:{p}" for p in ports]}
  jobs = [run_job("tpu_examples.train_adding", "--strategy=multi_worker",
                  "--steps=5", "--steps_per_call=1", "--hidden=8",
                  f"--seq_len={SEQ_LEN}", "--batch=8", "--checkpoint_every=5",
                  f"--model_dir={tmp_path}",
                  env={"TF_CONFIG": json.dumps(
                      {"cluster": cluster,
                       "task": {"type": "worker", "index": i}})})
          for i in range(2)]
  outputs = [job.communicate(timeout=600)[0] for job in jobs]
  for job, out in zip(jobs, outputs):
    assert job.returncode == 0, out[-3000:]
    assert "global batch 8 over 2 replica(s)" in out
  chief = checkpoint_values(str(tmp_path))
  other = checkpoint_values(str(tmp_path / "worker_1"))
  assert chief.keys() == other.keys() and len(chief) == 5
  for name in chief:
    np.testing.assert_array_equal(chief[name], other[name])
  step = tf.train.load_checkpoint(str(tmp_path)).get_tensor(
      "step/.ATTRIBUTES/VARIABLE_VALUE")
  assert step == 5


@PROGRAM
def test_tpu_without_a_tpu_fails_in_one_line():
  job = run_job("tpu_examples.train_adding", "--strategy=tpu")
  out = job.communicate(timeout=300)[0]
  assert job.returncode != 0
  assert "error: --strategy=tpu: no TPU found" in out
  assert "Traceback" not in out


@PROGRAM
def test_killed_job_resumes_without_losing_steps(tmp_path):
  # The uninterrupted job and the one to kill are independent: side by side.
  whole = run_job("tpu_examples.train_adding", *ADDING, "--steps=12",
                  f"--model_dir={tmp_path / 'whole'}")
  try:
    killed = run_job("tpu_examples.train_adding", *ADDING, "--steps=12",
                     f"--model_dir={tmp_path / 'killed'}")
    for line in killed.stdout:
      if line.startswith("saved checkpoint at step 4"):
        killed.send_signal(signal.SIGKILL)
        break
    killed.wait(timeout=600)
    assert killed.returncode == -signal.SIGKILL
    saved = tf.train.latest_checkpoint(str(tmp_path / "killed"))
    resumed_from = int(saved.rsplit("-", 1)[1])
    assert 4 <= resumed_from < 12
    again = run_job("tpu_examples.train_adding", *ADDING, "--steps=12",
                    f"--model_dir={tmp_path / 'killed'}")
    out = again.communicate(timeout=600)[0]
    assert again.returncode == 0, out[-3000:]
    whole_out = whole.communicate(timeout=600)[0]
    assert whole.returncode == 0, whole_out[-3000:]
  finally:
    if whole.poll() is None:
      whole.kill()
      whole.wait()
  assert f"resumed from step {resumed_from}" in out
  assert f"after 12 steps ({12 - resumed_from} in this run" in out
  want = checkpoint_values(str(tmp_path / "whole"))
  got = checkpoint_values(str(tmp_path / "killed"))
  for name in want:
    np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=1e-7)


def small_char_lm(path, *flags):
  """A small char-LM job in `path`, exported (with TFLite models where the
  converter works), with `flags` too: `(its output, path)`."""
  corpus = path / "corpus.txt"
  corpus.write_text("the quick brown fox jumps over the lazy dog. " * 400)
  job = run_job("tpu_examples.train_char_lm", f"--corpus={corpus}",
                "--steps=4", "--steps_per_call=2", "--log_every=2",
                f"--seq_len={SEQ_LEN}", "--hidden=16", "--embedding=8",
                "--batch=4", "--eval_windows=4", "--sample_chars=20",
                "--prompt=the ", f"--export_dir={path / 'export'}",
                f"--tflite={tflite_unavailable_reason() is None}", *flags)
  out = job.communicate(timeout=600)[0]
  assert job.returncode == 0, out[-3000:]
  return out, path


@pytest.fixture(scope="module")
def char_lm(tmp_path_factory):
  """The LSTM's job, with checkpoints and logs."""
  path = tmp_path_factory.mktemp("char_lm")
  return small_char_lm(path, f"--model_dir={path / 'run'}")


@PROGRAM
def test_char_lm_trains_logs_exports_and_samples(char_lm):
  out, path = char_lm
  bpc = float(out.split("held-out bits per character ")[1].split()[0])
  assert 0 < bpc < 8.5
  sample = out.split("sample:\n")[1]
  assert sample.startswith("the ") and len(sample.encode()) >= 24
  loaded = tf.saved_model.load(str(path / "export"))
  state = loaded.signatures["initial_state"](batch_size=tf.constant(2))
  step = loaded.signatures["step"](inputs=tf.constant([1, 2]), **state)
  assert step["output"].shape == [2, 256]
  tags = set()
  for log in tf.io.gfile.glob(str(path / "run" / "logs" / "*")):
    for event in tf.compat.v1.train.summary_iterator(log):
      tags.update(v.tag for v in event.summary.value)
  assert {"train_bpc", "held_out_bpc", "steps_per_sec"} <= tags


def cell_clips(flatbuffer):
  """The `cell_clip` of each fused LSTM op of a TFLite model."""
  from tensorflow.lite.python import schema_py_generated as schema  # pylint: disable=g-import-not-at-top
  model = schema.ModelT.InitFromPackedBuf(bytearray(flatbuffer), 0)
  return [op.builtinOptions.cellClip for subgraph in model.subgraphs
          for op in subgraph.operators or []
          if isinstance(op.builtinOptions,
                        schema.UnidirectionalSequenceLSTMOptionsT)]


@PROGRAM
def test_char_lm_tflite_models_match_the_saved_model(tflite_converter,
                                                     char_lm):
  """sequence.tflite's logits are the SavedModel's; step.tflite fed one token
  at a time reproduces them; builtin ops only, the LSTM fused."""
  del tflite_converter  # Skips where TFLite converts no Keras model.
  out, path = char_lm
  flatbuffers = {name: (path / "export" / f"{name}.tflite").read_bytes()
                 for name in ("step", "sequence")}
  ops = {name: tflite.op_names(f) for name, f in flatbuffers.items()}
  for names in ops.values():
    assert not [n for n in names if n.startswith("Flex")], names
    assert "WHILE" not in names, names
  assert ops["sequence"].count("UNIDIRECTIONAL_SEQUENCE_LSTM") == 1
  # Four training steps keep |c| far below 10: see the clip is off instead.
  assert cell_clips(flatbuffers["sequence"]) == [0.0]
  runners = {name: train_char_lm.tflite_runner(f)
             for name, f in flatbuffers.items()}
  assert runners["sequence"].get_input_details()["inputs"]["shape"].tolist(
      ) == [1, SEQ_LEN]
  text = (path / "corpus.txt").read_bytes()[7:7 + SEQ_LEN]
  tokens = np.frombuffer(text, np.uint8).astype(np.int32)
  saved = tf.saved_model.load(str(path / "export"))
  expected = saved.signatures["serving_default"](
      inputs=tf.constant(tokens[None]))["output"][0].numpy()
  whole = runners["sequence"](inputs=tokens[None])["output"][0]
  np.testing.assert_allclose(whole, expected, rtol=0, atol=1e-5)
  stepped = train_char_lm.step_through(runners["step"], tokens)
  np.testing.assert_allclose(stepped, whole, rtol=0, atol=1e-5)
  table = out.split("| model | bytes | us per token | max logit error |")[1]
  for row in ("step.tflite", f"sequence.tflite (T={SEQ_LEN})",
              "step.tflite, dynamic range", "SavedModel step (TensorFlow)"):
    assert f"| {row} |" in table, table


@pytest.mark.parametrize("cell", ["mingru", "minlstm", "rglru"])
def test_char_lm_cells_match_the_lstm_parameters(cell):
  """matched_hidden: each cell's model within 1% of the LSTM model's
  parameters (the quality comparison's premise); the RG-LRU's embedding
  has its width."""
  target = train_char_lm.parameter_count("lstm", 48, 16)
  hidden = train_char_lm.matched_hidden(cell, target, 16)
  model = train_char_lm.make_model(cell, hidden, 16)
  assert abs(model.count_params() - target) <= 0.01 * target
  width = model.layers[0].output_dim
  assert width == (hidden if cell == "rglru" else 16)
  assert isinstance(model.layers[1], train_char_lm.CELLS[cell])
  assert model.layers[1].units == hidden


@pytest.fixture(scope="module")
def min_gru_char_lm(tmp_path_factory):
  """The job with --cell=mingru (initial state g(0) = 0.5, not zeros)."""
  return small_char_lm(tmp_path_factory.mktemp("min_gru_char_lm"),
                       "--cell=mingru", "--latency_calls=4")


@PROGRAM
def test_min_gru_char_lm_steps_its_tflite_model_like_keras(min_gru_char_lm):
  """--cell=mingru trains, samples, and writes step.tflite (builtin ops)
  whose logits, stepped from the SavedModel's initial state, are its
  serving signature's; no sequence.tflite (the chunked loop has no builtin
  form)."""
  out, path = min_gru_char_lm
  assert "mingru hidden 16 (6688 parameters)" in out
  assert 0 < float(out.split("held-out bits per character ")[1].split()[0])
  assert out.split("sample:\n")[1].startswith("the ")
  if tflite_unavailable_reason():
    pytest.skip(tflite_unavailable_reason())
  assert not (path / "export" / "sequence.tflite").exists()
  flatbuffer = (path / "export" / "step.tflite").read_bytes()
  assert not [n for n in tflite.op_names(flatbuffer) if n.startswith("Flex")]
  text = (path / "corpus.txt").read_bytes()[7:7 + SEQ_LEN]
  tokens = np.frombuffer(text, np.uint8).astype(np.int32)
  saved = tf.saved_model.load(str(path / "export"))
  expected = saved.signatures["serving_default"](
      inputs=tf.constant(tokens[None]))["output"][0].numpy()
  state = train_char_lm.initial_state(str(path / "export"))
  assert all(np.all(v == 0.5) for v in state.values())
  stepped = train_char_lm.step_through(
      train_char_lm.tflite_runner(flatbuffer), tokens, state)
  np.testing.assert_allclose(stepped, expected, rtol=0, atol=1e-5)
  table = out.split("| model | bytes | us per token | max logit error |")[1]
  assert "| step.tflite | " in table and " vs Keras |" in table
  assert "sequence.tflite" not in table


@PROGRAM
def test_char_lm_quality_compares_the_cells(tmp_path):
  """benchmarks/char_lm_quality at tiny sizes: every cell trains, at the
  LSTM's parameter count, to the steps and the seconds asked; LINEAR.md
  gets its section."""
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("the quick brown fox jumps over the lazy dog. " * 400)
  job = run_job("benchmarks.char_lm_quality", "--steps=4", "--seconds=0.5",
                f"--seq_len={SEQ_LEN}", "--hidden=16", "--embedding=8",
                "--batch=4", "--eval_windows=4", "--steps_per_call=2",
                f"--corpus={corpus}", f"--out_dir={tmp_path}")
  out = job.communicate(timeout=600)[0]
  assert job.returncode == 0, out[-3000:]
  results = json.loads((tmp_path / "char_lm.json").read_text())
  cells = {c["cell"]: c for c in results["cells"]}
  assert list(cells) == ["lstm", "mingru", "minlstm", "rglru"]
  target = results["parameters_target"]
  assert cells["lstm"]["parameters"] == target
  for cell in cells.values():
    # Tiny models: the nearest unit count is within 5% (at the full run's
    # sizes, 0.3%).
    assert abs(cell["parameters"] - target) <= 0.05 * target, cell
    assert 0 < cell["bpc_at_steps"] < 9 and 0 < cell["bpc_at_seconds"] < 9
    assert cell["steps_in_seconds"] >= 2 and cell["seconds_at_seconds"] >= 0.5
    assert cell["seconds_at_steps"] > 0 and cell["ms_per_step"] > 0
  report = (tmp_path / "LINEAR.md").read_text()
  assert "## Char LM: bits per character at equal parameters" in report
  assert "| mingru | " in report and "Target (bits per character" in report


# The NMT tutorial (tpu_examples/train_nmt.py): tiny sizes, a few epochs.
# Epochs after the first (its traces) take a fraction of a second.
NMT = ["--num_examples=600", "--batch_size=32", "--units=32",
       "--embedding_dim=16", "--epochs=8"]


def nmt_epoch_losses(out):
  """The tutorial's 'Epoch N Loss X' lines, in order."""
  return [float(line.split()[-1]) for line in out.splitlines()
          if line.startswith("Epoch ") and line.split()[2] == "Loss"]


@PROGRAM
def test_nmt_trains_and_translates_greedily():
  job = run_job("tpu_examples.train_nmt", *NMT, "--beam_width=0")
  out = job.communicate(timeout=600)[0]
  assert job.returncode == 0, out[-3000:]
  losses = nmt_epoch_losses(out)
  assert len(losses) == 8, out[-3000:]
  assert all(b < a for a, b in zip(losses, losses[1:])), losses
  assert losses[-1] < 0.8 * losses[0], losses
  translations = [line for line in out.splitlines()
                  if line.startswith("Predicted translation: ['")]
  assert len(translations) == len(train_nmt.SENTENCES), out[-3000:]
  for sentence in train_nmt.SENTENCES:
    assert f"Input: {sentence}" in out
  # Greedy decoding ends at '<end>' or at maximum_iterations, its ids read
  # as words of the English (target) vocabulary (ids 0 and 1 as <OOV>).
  english = {word for pair in train_nmt.synthetic_pairs(600)
             for word in pair[0].lower().replace(".", " .").replace(
                 "?", " ?").split()} | {"<end>", "<start>", "<OOV>"}
  words = [line.split("['")[1].rstrip("']").split() for line in translations]
  for line, translation in zip(translations, words):
    assert translation and set(translation) <= english, line
  assert any(len(translation) > 1 for translation in words), translations
  assert "beam" not in out


@PROGRAM
def test_nmt_translates_with_beam_search():
  # The default --beam_width (3): the tutorial's beam_translate.
  job = run_job("tpu_examples.train_nmt", *NMT)
  out = job.communicate(timeout=600)[0]
  assert job.returncode == 0, out[-3000:]
  for sentence in train_nmt.SENTENCES[:2]:
    assert out.count(f"Input: {sentence}") == 2  # Greedy, then the beams.
  for rank in (1, 2, 3):
    assert out.count(f"{rank} Predicted translation: ") == 2, out[-3000:]
  assert "(1, 3, " in out  # The beams' ids: [batch, beam_width, time].


def test_nmt_tokenizer_numbers_words_as_keras_2():
  # Keras 3 has no keras.preprocessing.text.Tokenizer; the script's stands
  # in for it: the same ids and texts as tf_keras's (Keras 2's).
  import tf_keras  # pylint: disable=g-import-not-at-top
  dataset = train_nmt.NMTDataset()
  texts = [dataset.preprocess_sentence(spanish)
           for _, spanish in train_nmt.synthetic_pairs(300, seed=5)]
  ours = train_nmt.Tokenizer(filters="", oov_token="<OOV>")
  keras_2 = tf_keras.preprocessing.text.Tokenizer(filters="",
                                                  oov_token="<OOV>")
  for tokenizer in (ours, keras_2):
    tokenizer.fit_on_texts(texts)
  assert ours.word_index == keras_2.word_index
  probe = texts[:20] + ["<start> el gato desconocido . <end>"]
  sequences = ours.texts_to_sequences(probe)
  assert sequences == keras_2.texts_to_sequences(probe)
  padded = [s + [0] for s in sequences]  # Padding ids read as <OOV>.
  assert ours.sequences_to_texts(padded) == keras_2.sequences_to_texts(padded)
