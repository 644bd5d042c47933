"""The linear recurrent layers (tf_recurrent/layers/linear.py, griffin.py):
MinGRU, MinLSTM, RGLRU and GriffinBlock against float64 references written
from the papers' equations (random weights, a Python loop over steps,
differentiated by autodiff): outputs, states and the gradients of the
inputs and of every weight, in eager, tf.function and XLA, options
pairwise; masks (Keras's semantics), go_backwards, initial states,
stateful, Bidirectional, mixed precision, the one-step call."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent
from conftest import MODES, assert_all_close, in_mode, pairwise, weighted_sum

B, D, H, T, CHUNK = 2, 3, 4, 5, 2  # T=5 with chunks of 2: 2 + 2 + 1.
KINDS = ("min_gru", "min_lstm", "rglru", "griffin")
# Holes (one across a chunk boundary) and a row masked at its start.
MASK = [[True, False, True, True, False], [False, False, True, True, True]]


def sigmoid(x):
  return 1.0 / (1.0 + tf.exp(-x))


def paper_g(x):  # minGRU/minLSTM's g (Feng et al. 2024, section 3.2.2).
  return tf.where(x >= 0, x + 0.5, sigmoid(x))


def gelu_tanh(x):
  # 0.044715 as float32 has it: TensorFlow's float64 gelu casts its float32
  # constant (a 5e-8 relative change of the coefficient).
  return 0.5 * x * (1.0 + tf.tanh(math.sqrt(2.0 / math.pi) *
                                  (x + float(np.float32(0.044715)) * x ** 3)))


def min_gru_step(w, h, x):
  k = x @ w["kernel"] + w["bias"]
  z = sigmoid(k[:, :H])
  return (1.0 - z) * h + z * paper_g(k[:, H:])


def min_lstm_step(w, h, x):
  k = x @ w["kernel"] + w["bias"]
  f, i = sigmoid(k[:, :H]), sigmoid(k[:, H:2 * H])
  return f / (f + i) * h + i / (f + i) * paper_g(k[:, 2 * H:])


def rglru_step(w, h, x):
  """Griffin (De et al. 2024), equations (1)-(4), c = 8."""
  k = x @ w["kernel"] + w["bias"]
  r, i = sigmoid(k[:, :H]), sigmoid(k[:, H:])
  a = sigmoid(w["decay"]) ** (8.0 * r)
  return a * h + tf.sqrt(1.0 - a ** 2) * (i * x)


def griffin_step(w, state, x):
  """Griffin's recurrent block (figure 2): conv of width 4 over x W_in."""
  h, window = state
  gate = gelu_tanh(x @ w["gate_kernel"] + w["gate_bias"])
  u = x @ w["input_kernel"] + w["input_bias"]
  inputs = window + [u]  # The last 4 inputs, oldest first.
  conv = sum(inputs[i] * w["conv_kernel"][i] for i in range(4)) + w["conv_bias"]
  h = rglru_step(w, h, conv)
  return (gate * h) @ w["output_kernel"] + w["output_bias"], (h, inputs[1:])


def reference(kind, w, x, state, mask=None, go_backwards=False):
  """(outputs in Keras's order, final states) of the layer `kind` by a
  Python loop; a masked step carries the state, its output the last
  unmasked step's (zeros before it)."""
  steps = range(x.shape[1])[::-1] if go_backwards else range(x.shape[1])
  out = tf.zeros([x.shape[0], H], x.dtype)
  outputs = []
  for t in steps:
    if kind == "griffin":
      new_out, new_state = griffin_step(w, state, x[:, t])
    else:
      step = {"min_gru": min_gru_step, "min_lstm": min_lstm_step,
              "rglru": rglru_step}[kind]
      new_state = step(w, state, x[:, t])
      new_out = new_state
    if mask is not None:
      keep = tf.constant(mask)[:, t][:, None]
      new_state = tf.nest.map_structure(lambda n, s: tf.where(keep, n, s),
                                        new_state, state)
      new_out = tf.where(keep, new_out, out)
    state, out = new_state, new_out
    outputs.append(out)
  return tf.stack(outputs, 1), state


def layer_of(kind, **kwargs):
  cls = {"min_gru": tf_recurrent.MinGRU, "min_lstm": tf_recurrent.MinLSTM,
         "rglru": tf_recurrent.RGLRU, "griffin": tf_recurrent.GriffinBlock}
  return cls[kind](H, **{"chunk_size": CHUNK, **kwargs})


def features(kind):
  return H if kind == "rglru" else D


def random_layer(kind, dtype="float64", seed=0, **kwargs):
  layer = layer_of(kind, **{"dtype": dtype, "return_sequences": True,
                            "return_state": True, **kwargs})
  layer.build((B, T, features(kind)))
  rng = np.random.default_rng(seed)
  layer.set_weights([rng.normal(size=v.shape) * 0.7 +
                     (2.0 if "decay" in v.path else 0.0)
                     for v in layer.weights])
  return layer


def weights_of(layer, dtype=tf.float64):
  return {v.path.split("/")[-1]: tf.cast(tf.constant(v.numpy()), dtype)
          for v in layer.weights}


def initial_states(kind, given, rng):
  if not given:
    return None
  if kind == "griffin":
    return [tf.constant(rng.normal(size=(B, H))),
            tf.constant(rng.normal(size=(B, 3 * H)))]
  return [tf.constant(rng.normal(size=(B, H)))]


def reference_state(kind, states):
  """The reference's state from the layer's (flat) states, or its default."""
  if kind == "griffin":
    h, window = states if states else (tf.zeros([B, H], tf.float64),
                                       tf.zeros([B, 3 * H], tf.float64))
    return h, [window[:, i * H:(i + 1) * H] for i in range(3)]
  if states:
    return states[0]
  return tf.fill([B, H], tf.constant(0.0 if kind == "rglru" else 0.5,
                                     tf.float64))


def flat_state(kind, state):
  if kind == "griffin":
    return [state[0], tf.concat(state[1], 1)]
  return [state]


CASES = pairwise(KINDS, MODES, [False, True], [False, True], [False, True],
                 edges=[("griffin", "xla", True, True, True),
                        ("min_lstm", "xla", True, True, False)])


@pytest.mark.parametrize("kind,mode,masked,go_backwards,given", CASES)
def test_values_and_gradients_match_the_papers_equations(
    kind, mode, masked, go_backwards, given):
  layer = random_layer(kind, go_backwards=go_backwards)
  rng = np.random.default_rng(1)
  x = tf.constant(rng.normal(size=(B, T, features(kind))))
  states = initial_states(kind, given, rng)
  mask = tf.constant(MASK) if masked else None
  loss_w = [rng.normal(size=(B, T, H))] + [
      rng.normal(size=(B, s)) for s in ([H, 3 * H] if kind == "griffin"
                                        else [H])]
  sources = [x] + (states or [])

  def run(*sources):
    with tf.GradientTape() as tape:
      tape.watch(sources)
      result = layer(sources[0], initial_state=list(sources[1:]) or None,
                     mask=mask)
      loss = weighted_sum(result, loss_w)
    return result, tape.gradient(loss, list(sources) +
                                 layer.trainable_variables)

  got, grads = in_mode(mode, run)(*sources)

  w = weights_of(layer)
  with tf.GradientTape() as tape:
    tape.watch(sources + list(w.values()))
    outputs, state = reference(kind, w, x, reference_state(kind, states),
                               MASK if masked else None, go_backwards)
    expected = [outputs] + flat_state(kind, state)
    loss = weighted_sum(expected, loss_w)
  want = tape.gradient(loss, sources + [
      w[v.path.split("/")[-1]] for v in layer.trainable_variables])
  assert_all_close(got, expected, tol=1e-9)
  assert_all_close(grads, want, tol=1e-9)


@pytest.mark.parametrize("kind", KINDS)
def test_step_by_step_decoding_equals_the_sequence(kind):
  layer = random_layer(kind, dtype="float32", seed=2, chunk_size="auto")
  x = tf.random.stateless_normal((B, 70, features(kind)), seed=[1, 2])
  outputs, *final = layer(x)
  states = layer.get_initial_state(B)
  for t in range(70):
    y, states = layer.step(x[:, t], states)
    np.testing.assert_allclose(y, outputs[:, t], rtol=1e-5, atol=1e-5)
  assert_all_close(states, final, tol=1e-5)


def test_bidirectional_with_a_mask():
  forward = random_layer("min_gru", return_state=False)
  both = keras.layers.Bidirectional(forward, dtype="float64")
  x = tf.constant(np.random.default_rng(3).normal(size=(B, T, D)))
  got = both(x, mask=tf.constant(MASK))
  w = weights_of(both.forward_layer)
  w_back = weights_of(both.backward_layer)
  start = tf.fill([B, H], tf.constant(0.5, tf.float64))
  ahead, _ = reference("min_gru", w, x, start, MASK)
  back, _ = reference("min_gru", w_back, x, start, MASK, go_backwards=True)
  # Bidirectional asks for zeros at masked steps, and reverses the
  # backward layer's outputs into time order.
  keep = tf.constant(MASK)[:, :, None]
  want = tf.concat([tf.where(keep, ahead, 0.0),
                    tf.where(keep, tf.reverse(back, [1]), 0.0)], -1)
  assert_all_close(got, want, tol=1e-9)


@pytest.mark.parametrize("kind", ["min_lstm", "griffin"])
def test_stateful_calls_continue_and_reset(kind):
  layer = random_layer(kind, dtype="float32", stateful=True, seed=4)
  x = tf.random.stateless_normal((B, 6, features(kind)), seed=[3, 4])
  whole, *_ = random_layer(kind, dtype="float32", seed=4)(x)
  first, *_ = layer(x[:, :4])
  second, *_ = layer(x[:, 4:])
  assert_all_close(tf.concat([first, second], 1), whole, tol=1e-6)
  layer.reset_state()
  assert_all_close(layer.states, layer.get_initial_state(B))
  again, *_ = layer(x[:, :4])
  assert_all_close(again, first, tol=0)


@pytest.mark.parametrize("policy,tol", [("mixed_float16", 3e-3),
                                        ("mixed_bfloat16", 2e-2)])
def test_mixed_precision_runs_the_recurrence_in_float32(policy, tol):
  """Half-precision inputs and outputs, float32 weights and recurrence:
  within the compute dtype's precision of the float32 layer, gradients too
  (RG-LRU's a near 1 would round to 1 in bfloat16)."""
  x = tf.random.stateless_normal((B, 40, H), seed=[5, 6])
  results = []
  for dtype in ("float32", keras.DTypePolicy(policy)):
    layer = random_layer("rglru", dtype=dtype, seed=5, return_state=False)
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = layer(x)
      loss = tf.reduce_sum(tf.cast(y, tf.float32) ** 2)
    results.append([y] + tape.gradient(loss, [x] + layer.trainable_variables))
  assert results[1][0].dtype == tf.as_dtype(policy.split("_")[1])
  assert all(g.dtype == tf.float32 for g in results[1][2:])
  for got, want in zip(results[1], results[0]):
    want = np.asarray(want)
    np.testing.assert_allclose(np.asarray(tf.cast(got, tf.float32)), want,
                               atol=tol * np.abs(want).max())


def test_rglru_decay_starts_uniform_in_its_range():
  layer = tf_recurrent.RGLRU(4000)
  layer.build((1, 1, 4000))
  a_c = tf.sigmoid(layer.cell.decay) ** 8
  assert 0.9 <= float(tf.reduce_min(a_c)) < 0.901
  assert 0.998 < float(tf.reduce_max(a_c)) <= 0.999
  assert abs(float(tf.reduce_mean(a_c)) - 0.9495) < 0.003


@pytest.mark.parametrize("make,match", [
    (lambda: tf_recurrent.RGLRU(4)(tf.ones([1, 2, 3])), "must have 4 features"),
    (lambda: tf_recurrent.MinGRU(0), "units must be a positive int"),
    (lambda: tf_recurrent.MinGRU(4, chunk_size=0), "chunk_size"),
    (lambda: tf_recurrent.MinLSTM(4, unroll=True), "unroll=True"),
    (lambda: tf_recurrent.GriffinBlock(4, conv_width=1), "conv_width"),
])
def test_bad_arguments_get_clear_errors(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_mixed_precision_under_xla_writes_in_place():
  """Under XLA the outputs and the input gradient are written chunk by
  chunk into bfloat16 buffers in the call's layout (T=41 with chunks of 2:
  a last chunk of one step): within bfloat16's precision of the float32
  layer run eagerly, gradients too."""
  x = tf.random.stateless_normal((B, 41, H), seed=[7, 8])
  results = []
  for dtype, mode in (("float32", "eager"),
                      (keras.DTypePolicy("mixed_bfloat16"), "xla")):
    layer = random_layer("rglru", dtype=dtype, seed=5, return_state=False)

    def run(x, layer=layer):
      with tf.GradientTape() as tape:
        tape.watch(x)
        y = layer(x)
        loss = tf.reduce_sum(tf.cast(y, tf.float32) ** 2)
      return [y] + tape.gradient(loss, [x] + layer.trainable_variables)

    results.append(in_mode(mode, run)(x))
  assert results[1][0].dtype == tf.bfloat16
  for got, want in zip(results[1], results[0]):
    want = np.asarray(want)
    np.testing.assert_allclose(np.asarray(tf.cast(got, tf.float32)), want,
                               atol=2e-2 * np.abs(want).max())
