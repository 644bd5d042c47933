"""Keras's own tests of its recurrent layers, run on tf_recurrent's layers.

The cases of keras/src/layers/rnn/{bidirectional,lstm,gru,simple_rnn,
conv_lstm1d,conv_lstm2d,conv_lstm3d,conv_lstm,rnn}_test.py (Keras 3.15),
with `keras.layers.RNN`, `LSTM`, `GRU`, `SimpleRNN` and `ConvLSTM1D/2D/3D`
replaced by tf_recurrent's:
their inputs, expected outputs and tolerances as Keras has them, as tables.
Keras's `run_layer_test` (shapes, weights and losses counts, masking,
serialization, a training step, mixed precision) runs as Keras runs it.

Left out: the torch-only cuDNN dispatch tests
(`test_torch_cudnn_dispatch_fires`, `test_torch_cudnn_bidirectional_gru_
dispatch_fires`: skipped by Keras on the TensorFlow backend) and
`ConvLSTMCellTest` (one call of Keras's cell; no layer of ours runs it).
`ConvLSTMTest` runs Keras's abstract `ConvLSTM(rank=2)`; here it runs
`ConvLSTM2D`, which is that class with rank 2.
"""

import dataclasses
from typing import Any, Callable, Optional

import keras
from keras.src import testing as keras_testing
import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent

# The layers under test, where Keras's tests name `layers.X`.
peer = tf_recurrent


class _KerasTestCase(keras_testing.TestCase):
  """Keras's TestCase, for its `run_layer_test` and friends."""

  def runTest(self):  # pylint: disable=invalid-name
    pass


KERAS = _KerasTestCase()
KERAS_VERSION = tuple(int(p) for p in keras.version().split(".")[:2])


def keras_since(version, what):
  """Skips a case whose behaviour is Keras's own and new in `version`."""
  return pytest.mark.skipif(KERAS_VERSION < version,
                            reason=f"Keras {keras.version()}: {what} is "
                            f"Keras {version[0]}.{version[1]}'s")


def constant(**options):
  """Keras's tests' weights: kernel 0.01, recurrent kernel 0.02, bias 0.03."""
  return dict(kernel_initializer=keras.initializers.Constant(0.01),
              recurrent_initializer=keras.initializers.Constant(0.02),
              bias_initializer=keras.initializers.Constant(0.03), **options)


def arange(*shape, scale=1.0):
  return np.arange(np.prod(shape)).reshape(shape).astype("float32") / scale


def rows(*values, width):
  """An expected [batch, width] output whose rows repeat one value."""
  return np.array([[v] * width for v in values], "float32")


@keras.saving.register_keras_serializable(package="tests")
class OneStateRNNCell(keras.layers.Layer):
  """rnn_test.py's cell: output = x @ 1 + h @ 1."""

  def __init__(self, units, state_size=None, **kwargs):
    super().__init__(**kwargs)
    self.units = units
    self.state_size = state_size if state_size else units

  def build(self, input_shape):
    self.kernel = self.add_weight(shape=(input_shape[-1], self.units),
                                  initializer="ones", name="kernel")
    self.recurrent_kernel = self.add_weight(
        shape=(self.units, self.units), initializer="ones",
        name="recurrent_kernel")

  def call(self, inputs, states):
    output = (keras.ops.matmul(inputs, self.kernel) +
              keras.ops.matmul(states[0], self.recurrent_kernel))
    return output, [output]


@keras.saving.register_keras_serializable(package="tests")
class TwoStatesRNNCell(keras.layers.Layer):
  """rnn_test.py's two-state cell (both states read states[0], as there)."""

  def __init__(self, units, state_size=None, **kwargs):
    super().__init__(**kwargs)
    self.units = units
    self.state_size = state_size if state_size else [units, units]
    self.output_size = units

  def build(self, input_shape):
    self.kernel = self.add_weight(shape=(input_shape[-1], self.units),
                                  initializer="ones", name="kernel")
    self.recurrent_kernel_1 = self.add_weight(
        shape=(self.units, self.units), initializer="ones",
        name="recurrent_kernel_1")
    self.recurrent_kernel_2 = self.add_weight(
        shape=(self.units, self.units), initializer="ones",
        name="recurrent_kernel_2")

  def call(self, inputs, states):
    h = keras.ops.matmul(inputs, self.kernel)
    output_1 = h + keras.ops.matmul(states[0], self.recurrent_kernel_1)
    output_2 = h + keras.ops.matmul(states[0], self.recurrent_kernel_2)
    return output_1 + output_2, [output_1, output_2]


CHANNELS_LAST = keras.config.image_data_format() == "channels_last"


def video_shape(batch, frames, side, channels):
  return ((batch, frames, side, side, channels) if CHANNELS_LAST
          else (batch, frames, channels, side, side))


def frames_shape(batch, *rest, rank):
  """`(batch, [frames,] side, ..., channels)` for frames of `rank` spatial
  axes (`rest`: optional frames, then side and channels), or channels first."""
  *frames, side, channels = rest
  spatial = (side,) * rank
  return ((batch, *frames, *spatial, channels) if CHANNELS_LAST
          else (batch, *frames, channels, *spatial))


def basics(**arguments):
  """The arguments the test_basics of lstm/gru/simple_rnn_test share."""
  return dict(input_shape=(3, 2, 4), expected_num_trainable_weights=3,
              expected_num_non_trainable_weights=0, supports_masking=True,
              **arguments)


DROPOUT = dict(call_kwargs={"training": True}, expected_output_shape=(3, 3))
REGULARIZED = dict(init_kwargs={"units": 3, "return_sequences": True,
                                "bias_regularizer": "l1",
                                "kernel_regularizer": "l2",
                                "recurrent_regularizer": "l2"},
                   expected_output_shape=(3, 2, 3), expected_num_losses=3)

# Keras's run_layer_test calls: (test, layer, its arguments, expectations).
LAYER_TESTS = [
    (f"{name.lower()}_test.test_basics", lambda name=name: getattr(peer, name),
     arguments)
    for name in ("LSTM", "GRU")
    for arguments in [
        basics(init_kwargs={"units": 3, "dropout": 0.5}, **DROPOUT),
        basics(init_kwargs={"units": 3, "dropout": 0.5,
                            "recurrent_dropout": 0.5}, **DROPOUT),
        basics(**REGULARIZED),
    ]
] + [
    ("simple_rnn_test.test_basics", lambda: peer.SimpleRNN,
     basics(init_kwargs={"units": 3, "dropout": 0.5, "recurrent_dropout": 0.5},
            expected_num_non_trainable_variables=1, **DROPOUT)),
    ("simple_rnn_test.test_basics", lambda: peer.SimpleRNN,
     basics(**REGULARIZED)),
    ("conv_lstm2d_test.test_basics", lambda: peer.ConvLSTM2D,
     dict(init_kwargs={"filters": 5, "kernel_size": 3, "padding": "same"},
          input_shape=video_shape(3, 2, 4, 3),
          expected_output_shape=(3, 4, 4, 5) if CHANNELS_LAST else (3, 5, 4, 4),
          expected_num_trainable_weights=3,
          expected_num_non_trainable_weights=0, supports_masking=True)),
    ("conv_lstm2d_test.test_basics", lambda: peer.ConvLSTM2D,
     dict(init_kwargs={"filters": 5, "kernel_size": 3, "padding": "valid",
                       "recurrent_dropout": 0.5},
          input_shape=video_shape(3, 2, 8, 3), call_kwargs={"training": True},
          expected_output_shape=(3, 6, 6, 5) if CHANNELS_LAST else (3, 5, 6, 6),
          expected_num_trainable_weights=3,
          expected_num_non_trainable_weights=0, supports_masking=True)),
    ("conv_lstm2d_test.test_basics", lambda: peer.ConvLSTM2D,
     dict(init_kwargs={"filters": 5, "kernel_size": 3, "padding": "valid",
                       "return_sequences": True},
          input_shape=video_shape(3, 2, 8, 3),
          expected_output_shape=((3, 2, 6, 6, 5) if CHANNELS_LAST
                                 else (3, 2, 5, 6, 6)),
          expected_num_trainable_weights=3,
          expected_num_non_trainable_weights=0, supports_masking=True)),
] + [
    # conv_lstm1d_test and conv_lstm3d_test.test_basics: conv_lstm2d's
    # cases, frames of rank 1 and 3.
    (f"conv_lstm{rank}d_test.test_basics",
     lambda rank=rank: getattr(peer, f"ConvLSTM{rank}D"),
     dict(init_kwargs={"filters": 5, "kernel_size": 3, **options},
          input_shape=frames_shape(3, 2, side, 3, rank=rank), call_kwargs=call,
          expected_output_shape=frames_shape(3, *steps, out, 5, rank=rank),
          expected_num_trainable_weights=3,
          expected_num_non_trainable_weights=0, supports_masking=True))
    for rank in (1, 3)
    for options, side, out, steps, call in [
        ({"padding": "same"}, 4, 4, (), None),
        ({"padding": "valid", "recurrent_dropout": 0.5}, 8, 6, (),
         {"training": True}),
        ({"padding": "valid", "return_sequences": True}, 8, 6, (2,), None)]
] + [
    ("bidirectional_test.test_basics", lambda: keras.layers.Bidirectional,
     dict(init_kwargs={"layer": lambda: peer.SimpleRNN(4)},
          input_shape=(3, 2, 4), expected_output_shape=(3, 8),
          expected_num_trainable_weights=6,
          expected_num_non_trainable_weights=0, supports_masking=True)),
    ("bidirectional_test.test_basics", lambda: keras.layers.Bidirectional,
     dict(init_kwargs={
         "layer": lambda: peer.SimpleRNN(4),
         "backward_layer": lambda: peer.SimpleRNN(4, go_backwards=True),
         "merge_mode": "sum"},
          input_shape=(3, 2, 4), expected_output_shape=(3, 4),
          expected_num_trainable_weights=6,
          expected_num_non_trainable_weights=0, supports_masking=True)),
] + [
    # rnn_test.test_basics: keras.layers.RNN over its two test cells.
    ("rnn_test.test_basics", lambda: peer.RNN,
     dict(init_kwargs={"cell": cell, **options}, input_shape=(3, 2, 4),
          expected_output_shape=(3, 2, 5) if options.get("return_sequences")
          else (3, 5),
          expected_num_trainable_weights=weights,
          expected_num_non_trainable_weights=0,
          expected_num_seed_generators=0, supports_masking=True))
    for cell, options, weights in [
        (lambda: OneStateRNNCell(5, state_size=5), {}, 2),
        (lambda: OneStateRNNCell(5, state_size=[5]), {}, 2),
        (lambda: OneStateRNNCell(5, state_size=(5,)), {}, 2),
        (lambda: OneStateRNNCell(5), {"return_sequences": True}, 2),
        (lambda: OneStateRNNCell(5), {"go_backwards": True, "unroll": True},
         2),
        (lambda: TwoStatesRNNCell(5, state_size=[5, 5]), {}, 3),
        (lambda: TwoStatesRNNCell(5, state_size=(5, 5)), {}, 3),
        (lambda: TwoStatesRNNCell(5), {"return_sequences": True}, 3),
    ]
]


@pytest.mark.parametrize("test,layer_cls,arguments", LAYER_TESTS,
                         ids=[t[0] for t in LAYER_TESTS])
def test_run_layer_test(test, layer_cls, arguments):
  """Keras's run_layer_test; layers in init_kwargs are made fresh per call."""
  del test
  arguments = dict(arguments)
  arguments["init_kwargs"] = {k: v() if callable(v) else v
                              for k, v in arguments["init_kwargs"].items()}
  KERAS.run_layer_test(layer_cls(), **arguments)


@dataclasses.dataclass
class Case:
  """One output check of Keras's tests: `make()(inputs, **call_kwargs)`.

  `expected` is the output's structure (a tuple for several outputs);
  `stateful` calls the layer twice and checks the second output, then
  resets the state and does so again (Keras's test_statefulness).
  """
  make: Callable[[], keras.layers.Layer]
  inputs: Any
  expected: Any
  call_kwargs: Optional[dict] = None
  tol: float = 1e-6
  stateful: bool = False
  reduce: Optional[Callable[[Any], Any]] = None


SEQUENCE_364 = arange(3, 6, 4)
SEQUENCE_234 = arange(2, 3, 4)
SEQUENCE_243 = arange(2, 4, 3)
MASK = np.array([[True, True, False, True], [True, False, False, True]])
LSTM_MASK = np.array([[True, True, True, False], [True, True, False, False]])
LSTM_BACKWARDS_MASK = np.array([[False, True, True, True],
                                [False, False, True, True]])


def masking_cases(name, units, mask, backwards_mask, unroll, sequences,
                  zeroed, backwards, tol=1e-6):
  """test_masking of lstm/gru/simple_rnn_test: the last output with
  unroll=True and units[0], the sequences (and with zero_output_for_mask)
  with units[1], the last output backwards with units[0]; each example's
  outputs repeat one value per step."""
  def make(units, **options):
    return lambda: getattr(peer, name)(units, **constant(**options))
  last, every = units
  prefix = name.lower().replace("simplernn", "simple_rnn") + ".masking"
  return {
      f"{prefix}.unroll": Case(
          make(last, unroll=True), SEQUENCE_243,
          rows(*unroll, width=last), {"mask": mask}, tol=tol),
      f"{prefix}.return_sequences": Case(
          make(every, return_sequences=True), SEQUENCE_243,
          np.stack([rows(*s, width=every) for s in sequences]),
          {"mask": mask}, tol=tol),
      f"{prefix}.zero_output_for_mask": Case(
          make(every, return_sequences=True, zero_output_for_mask=True),
          SEQUENCE_243, np.stack([rows(*s, width=every) for s in zeroed]),
          {"mask": mask}, tol=tol),
      f"{prefix}.go_backwards": Case(
          make(last, go_backwards=True), SEQUENCE_243,
          rows(*backwards, width=last), {"mask": backwards_mask}, tol=tol),
  }


CASES = {
    # lstm_test.test_correctness, for implementation 1 and 2.
    **{f"lstm.correctness.{name}.implementation{i}": Case(
        lambda options=options, i=i: peer.LSTM(
            3, **constant(**options, implementation=i)),
        SEQUENCE_364, rows(*values, width=3), tol=1e-5)
       for i in (1, 2)
       for name, options, values in [
           ("plain", {}, (0.6288687, 0.86899155, 0.9460773)),
           ("go_backwards", {"go_backwards": True},
            (0.35622165, 0.74789524, 0.8872726)),
           ("unroll", {"unroll": True}, (0.6288687, 0.86899155, 0.9460773)),
           ("unit_forget_bias", {"unit_forget_bias": False},
            (0.57019705, 0.8661914, 0.9459622)),
           ("use_bias", {"use_bias": False},
            (0.54986924, 0.86226785, 0.9443936)),
       ]},
    "lstm.statefulness": Case(
        lambda: peer.LSTM(4, **constant(stateful=True)), SEQUENCE_234,
        rows(0.3124785, 0.6863672, width=4), tol=1e-5, stateful=True),
    "lstm.pass_initial_state": Case(
        lambda: peer.LSTM(2, **constant()), SEQUENCE_243,
        np.array([[0.20574439, 0.3558822], [0.64930826, 0.66276]]),
        {"initial_state": [arange(2, 2), arange(2, 2)]}, tol=1e-5),
    "lstm.pass_initial_state.go_backwards": Case(
        lambda: peer.LSTM(2, **constant(go_backwards=True)), SEQUENCE_243,
        np.array([[0.13281618, 0.2790356], [0.5839337, 0.5992567]]),
        {"initial_state": [arange(2, 2), arange(2, 2)]}, tol=1e-5),
    # lstm_test.test_masking.
    **masking_cases(
        "LSTM", (2, 2), LSTM_MASK, LSTM_BACKWARDS_MASK,
        unroll=(0.11755939, 0.28556206),
        sequences=((0.01588910, 0.05552048, 0.11755939, 0.11755939),
                   (0.14185596, 0.28556206, 0.28556206, 0.28556206)),
        zeroed=((0.01588910, 0.05552048, 0.11755939, 0.0),
                (0.14185596, 0.28556206, 0.0, 0.0)),
        backwards=(0.15341201, 0.3844719), tol=1e-5),
    # gru_test.test_correctness (its implementation parameter is unused) and
    # test_legacy_implementation_argument.
    **{f"gru.correctness.{name}": Case(
        lambda options=options: peer.GRU(3, **constant(**options)),
        SEQUENCE_364, np.array([[v, v, w] for v, w in values]))
       for name, options, values in [
           ("plain", {}, ((0.5217289, 0.5217289), (0.6371659, 0.6371659),
                          (0.39384964, 0.3938496))),
           ("go_backwards", {"go_backwards": True},
            ((0.24406259,) * 2, (0.611516,) * 2, (0.3928808,) * 2)),
           ("unroll", {"unroll": True},
            ((0.5217289, 0.5217289), (0.6371659, 0.6371659),
             (0.39384964, 0.3938496))),
           ("reset_after", {"reset_after": False},
            ((0.51447755,) * 2, (0.6426879,) * 2, (0.40208298,) * 2)),
           ("use_bias", {"use_bias": False},
            ((0.49988455,) * 2, (0.64701194,) * 2, (0.4103359,) * 2)),
       ]},
    "gru.legacy_implementation_argument": Case(
        lambda: peer.GRU.from_config(
            {**peer.GRU(3, **constant()).get_config(), "implementation": 0}),
        SEQUENCE_364, np.array([[0.5217289] * 3, [0.6371659] * 3,
                                 [0.39384964, 0.39384964, 0.3938496]])),
    "gru.statefulness": Case(
        lambda: peer.GRU(4, **constant(stateful=True)), SEQUENCE_234,
        rows(0.29542392, 0.5885018, width=4), stateful=True),
    **{f"gru.pass_initial_state.{name}": Case(
        lambda options=options: peer.GRU(2, **constant(**options)),
        SEQUENCE_243, expected, {"initial_state": arange(2, 2)})
       for name, options, expected in [
           ("forward", {},
            np.array([[0.23774096, 0.33508456], [0.83659905, 1.0227708]])),
           ("go_backwards", {"go_backwards": True},
            np.array([[0.13486053, 0.23261218], [0.78257304, 0.9691353]])),
           # test_pass_return_state: the state is the output.
           ("return_state", {"return_state": True},
            (np.array([[0.23774096, 0.33508456], [0.83659905, 1.0227708]]),) *
            2),
           ("return_state.go_backwards",
            {"return_state": True, "go_backwards": True},
            (np.array([[0.13486053, 0.23261218], [0.78257304, 0.9691353]]),) *
            2),
       ]},
    # gru_test.test_masking.
    **masking_cases(
        "GRU", (2, 2), MASK, MASK,
        unroll=(0.19393763, 0.30818558),
        sequences=((0.03606692, 0.09497581, 0.09497581, 0.19393763),
                   (0.16051409, 0.16051409, 0.16051409, 0.30818558)),
        zeroed=((0.03606692, 0.09497581, 0.0, 0.19393763),
                (0.16051409, 0.0, 0.0, 0.30818558)),
        backwards=(0.11669192, 0.28380975)),
    # simple_rnn_test.
    **{f"simple_rnn.correctness.{name}": Case(
        lambda options=options: peer.SimpleRNN(4, **constant(**options)),
        SEQUENCE_234, rows(*values, width=4))
       for name, options, values in [
           ("plain", {}, (0.405432, 0.73605347)),
           ("unroll", {"unroll": True}, (0.405432, 0.73605347)),
           ("go_backwards", {"go_backwards": True}, (0.11144729, 0.5528889)),
           ("go_backwards.unroll", {"go_backwards": True, "unroll": True},
            (0.11144729, 0.5528889)),
       ]},
    "simple_rnn.statefulness": Case(
        lambda: peer.SimpleRNN(4, **constant(stateful=True)), SEQUENCE_234,
        rows(0.40559256, 0.7361247, width=4), stateful=True),
    "simple_rnn.pass_initial_state": Case(
        lambda: peer.SimpleRNN(4, **constant()), SEQUENCE_243,
        rows(0.33621645, 0.6262637, width=4),
        {"initial_state": arange(2, 4)}),
    "simple_rnn.pass_initial_state.go_backwards": Case(
        lambda: peer.SimpleRNN(4, **constant(go_backwards=True)),
        SEQUENCE_243, rows(0.07344437, 0.43043602, width=4),
        {"initial_state": arange(2, 4)}),
    # simple_rnn_test.test_masking.
    **masking_cases(
        "SimpleRNN", (4, 2), MASK, MASK,
        unroll=(0.32951632, 0.61799484),
        sequences=((0.0599281, 0.15122814, 0.15122814, 0.32394567),
                   (0.3969304, 0.3969304, 0.3969304, 0.608085)),
        zeroed=((0.0599281, 0.15122814, 0.0, 0.32394567),
                (0.3969304, 0.0, 0.0, 0.608085)),
        backwards=(0.07376196, 0.43645123)),
    # conv_lstm2d_test.test_correctness.
    "conv_lstm2d.correctness": Case(
        lambda: peer.ConvLSTM2D(filters=2, kernel_size=3, **constant()),
        arange(2, 3, 4, 4, 5, scale=100) if CHANNELS_LAST else
        arange(2, 3, 4, 4, 5, scale=100).transpose((0, 1, 4, 2, 3)),
        np.array([[[[0.48694518] * 2, [0.50237733] * 2],
                   [[0.5461202] * 2, [0.5598283] * 2]],
                  [[[0.8661607] * 2, [0.86909103] * 2],
                   [[0.8774414] * 2, [0.8800861] * 2]]]).transpose(
                       (0, 1, 2, 3) if CHANNELS_LAST else (0, 3, 1, 2))),
    # conv_lstm1d_test.test_correctness.
    "conv_lstm1d.correctness": Case(
        lambda: peer.ConvLSTM1D(filters=2, kernel_size=3, **constant()),
        arange(2, 3, 4, 5, scale=10) if CHANNELS_LAST else
        arange(2, 3, 4, 5, scale=10).transpose((0, 1, 3, 2)),
        np.array([[[0.40807986] * 2, [0.46421072] * 2],
                  [[0.80933154] * 2, [0.8233646] * 2]]).transpose(
                      (0, 1, 2) if CHANNELS_LAST else (0, 2, 1))),
    # conv_lstm3d_test.test_correctness.
    "conv_lstm3d.correctness": Case(
        lambda: peer.ConvLSTM3D(filters=2, kernel_size=3, **constant()),
        arange(2, 3, 4, 4, 4, 5, scale=100) if CHANNELS_LAST else
        arange(2, 3, 4, 4, 4, 5, scale=100).transpose((0, 1, 5, 2, 3, 4)),
        np.array([[[[[0.99149036] * 2, [0.99180907] * 2],
                    [[0.99258363] * 2, [0.9927925] * 2]],
                   [[[0.99413764] * 2, [0.99420583] * 2],
                    [[0.9943788] * 2, [0.9944278] * 2]]],
                  [[[[0.9950547] * 2] * 2] * 2] * 2]).transpose(
                      (0, 1, 2, 3, 4) if CHANNELS_LAST else (0, 4, 1, 2, 3))),
    # conv_lstm_test.ConvLSTMTest (ConvLSTM(rank=2) there): the sum of the
    # output after an initial state.
    "conv_lstm.correctness": Case(
        lambda: peer.ConvLSTM2D(
            filters=4, kernel_size=3, padding="same",
            kernel_initializer=keras.initializers.Constant(0.01),
            recurrent_initializer=keras.initializers.Constant(0.02)),
        arange(2, 3, 5, 5, 3, scale=100) if CHANNELS_LAST else
        arange(2, 3, 5, 5, 3, scale=100).transpose((0, 1, 4, 2, 3)),
        np.float32(119.812454),
        {"initial_state": [
            arange(2, 5, 5, 4, scale=100) if CHANNELS_LAST else
            arange(2, 5, 5, 4, scale=100).transpose((0, 3, 1, 2))] * 2},
        reduce=np.sum),
    # bidirectional_test.
    "bidirectional.correctness.concat": Case(
        lambda: keras.layers.Bidirectional(peer.SimpleRNN(2, **constant())),
        SEQUENCE_234,
        np.array([[0.39687276, 0.39687276, 0.10004295, 0.10004295],
                  [0.7237238, 0.7237238, 0.53391594, 0.53391594]]),
        tol=1e-5),
    "bidirectional.correctness.ave": Case(
        lambda: keras.layers.Bidirectional(peer.SimpleRNN(2, **constant()),
                                           merge_mode="ave"),
        SEQUENCE_234, rows(0.24845785, 0.6288199, width=2), tol=1e-5),
    "bidirectional.correctness.none": Case(
        lambda: keras.layers.Bidirectional(peer.SimpleRNN(2, **constant()),
                                           merge_mode=None),
        SEQUENCE_234, (rows(0.39687276, 0.7237238, width=2),
                       rows(0.10004295, 0.53391594, width=2)), tol=1e-5),
    "bidirectional.correctness.mul": Case(
        lambda: keras.layers.Bidirectional(
            peer.SimpleRNN(2, **constant()),
            backward_layer=peer.SimpleRNN(
                2, kernel_initializer=keras.initializers.Constant(0.03),
                recurrent_initializer=keras.initializers.Constant(0.02),
                bias_initializer=keras.initializers.Constant(0.01),
                go_backwards=True),
            merge_mode="mul"),
        SEQUENCE_234, rows(0.08374989, 0.6740834, width=2), tol=1e-5),
    "bidirectional.correctness.gru_sum": Case(
        lambda: keras.layers.Bidirectional(
            peer.GRU(2, **constant(return_sequences=True)), merge_mode="sum"),
        SEQUENCE_234,
        np.stack([rows(0.20937867, 0.34462988, 0.40290534, width=2),
                  rows(0.59829646, 0.6734641, 0.6479671, width=2)]),
        tol=1e-5),
    "bidirectional.statefulness": Case(
        lambda: keras.layers.Bidirectional(
            peer.LSTM(2, **constant(stateful=True))),
        SEQUENCE_243,
        np.array([[0.26234663, 0.26234663, 0.16959146, 0.16959146],
                  [0.6137073, 0.6137073, 0.5381646, 0.5381646]]),
        tol=1e-5, stateful=True),
    "bidirectional.pass_initial_state": Case(
        lambda: keras.layers.Bidirectional(peer.LSTM(2, **constant())),
        SEQUENCE_243,
        np.array([[0.20794602, 0.4577124, 0.14046375, 0.48191673],
                  [0.6682636, 0.6711909, 0.60943645, 0.60950446]]),
        {"initial_state": [arange(2, 2) * k for k in (1, 2, 3, 4)]},
        tol=1e-5),
    "bidirectional.masking": Case(
        lambda: keras.layers.Bidirectional(peer.GRU(2, **constant())),
        SEQUENCE_243,
        np.array([[0.19393763, 0.19393763, 0.11669192, 0.11669192],
                  [0.30818558, 0.30818558, 0.28380975, 0.28380975]]),
        {"mask": MASK}, tol=1e-5),
    "bidirectional.return_state": Case(
        lambda: keras.layers.Bidirectional(
            peer.LSTM(2, **constant(return_state=True))),
        SEQUENCE_243,
        (np.array([[0.1990008, 0.1990008, 0.12659755, 0.12659755],
                   [0.52335435, 0.52335435, 0.44717982, 0.44717982]]),
         rows(0.1990008, 0.52335435, width=2),
         rows(0.35567185, 1.0492687, width=2),
         rows(0.12659755, 0.44717982, width=2),
         rows(0.2501858, 0.941473, width=2)),
        tol=1e-5),
    # rnn_test: keras.layers.RNN over its test cells (exact integers).
    **{f"rnn.forward_pass.{cell}.{name}": Case(
        lambda cell=cell, options=options: peer.RNN(
            {"one_state": OneStateRNNCell,
             "two_states": TwoStatesRNNCell}[cell](2), **options),
        np.ones((1, 2, 3)), expected)
       for cell, name, options, expected in [
           ("one_state", "last", {}, np.array([[9.0, 9.0]])),
           ("one_state", "sequences", {"return_sequences": True},
            np.array([[[3.0, 3.0], [9.0, 9.0]]])),
           ("one_state", "state", {"return_state": True},
            (np.array([[9.0, 9.0]]),) * 2),
           ("one_state", "sequences_state",
            {"return_sequences": True, "return_state": True},
            (np.array([[[3.0, 3.0], [9.0, 9.0]]]), np.array([[9.0, 9.0]]))),
           ("two_states", "last", {}, np.array([[18.0, 18.0]])),
           ("two_states", "sequences", {"return_sequences": True},
            np.array([[[6.0, 6.0], [18.0, 18.0]]])),
           ("two_states", "state", {"return_state": True},
            (np.array([[18.0, 18.0]]), np.array([[9.0, 9.0]]),
             np.array([[9.0, 9.0]]))),
           ("two_states", "sequences_state",
            {"return_sequences": True, "return_state": True},
            (np.array([[[6.0, 6.0], [18.0, 18.0]]]), np.array([[9.0, 9.0]]),
             np.array([[9.0, 9.0]]))),
       ]},
    "rnn.passing_initial_state.one_state": Case(
        lambda: peer.RNN(OneStateRNNCell(2), return_state=True),
        np.ones((2, 3, 2)), (np.full((2, 2), 22.0),) * 2,
        {"initial_state": np.ones((2, 2))}),
    "rnn.passing_initial_state.two_states": Case(
        lambda: peer.RNN(TwoStatesRNNCell(2), return_state=True),
        np.ones((2, 3, 2)),
        (np.full((2, 2), 44.0), np.full((2, 2), 22.0), np.full((2, 2), 22.0)),
        {"initial_state": [np.ones((2, 2)), np.ones((2, 2))]}),
    "rnn.statefulness.one_state": Case(
        lambda: peer.RNN(OneStateRNNCell(2), stateful=True, return_state=True),
        np.ones((1, 2, 3)), (np.array([[45.0, 45.0]]),) * 2, stateful=True),
    "rnn.statefulness.two_states": Case(
        lambda: peer.RNN(TwoStatesRNNCell(2), stateful=True,
                         return_state=True),
        np.ones((1, 2, 3)),
        (np.array([[90.0, 90.0]]), np.array([[45.0, 45.0]]),
         np.array([[45.0, 45.0]])), stateful=True),
    "rnn.go_backwards": Case(
        lambda: peer.RNN(OneStateRNNCell(2), go_backwards=True),
        arange(2, 3, 4), np.array([[202.0, 202.0], [538.0, 538.0]])),
    "rnn.go_backwards.stateful": Case(
        lambda: peer.RNN(OneStateRNNCell(2), stateful=True, return_state=True),
        arange(2, 3, 4),
        (np.array([[954.0, 954.0], [3978.0, 3978.0]]),) * 2, stateful=True),
    **{f"rnn.masking.unroll_{unroll}": Case(
        lambda unroll=unroll: peer.RNN(OneStateRNNCell(2), unroll=unroll,
                                       return_sequences=True),
        SEQUENCE_243,
        np.array([[[3.0] * 2, [18.0] * 2, [57.0] * 2, [57.0] * 2],
                  [[39.0] * 2, [126.0] * 2, [126.0] * 2, [126.0] * 2]]),
        {"mask": LSTM_MASK}, tol=1e-5)
       for unroll in (False, True)},
    **{f"rnn.masking.last.unroll_{unroll}": Case(
        lambda unroll=unroll: peer.RNN(OneStateRNNCell(2), unroll=unroll),
        SEQUENCE_243, np.array([[57.0, 57.0], [126.0, 126.0]]),
        {"mask": LSTM_MASK}, tol=1e-5)
       for unroll in (False, True)},
}


def check(case, layer, mode):
  """Checks the layer's output; "xla_tape" records it on a GradientTape, as
  training does (a call nothing differentiates may take another loop)."""
  def run(x):
    if mode != "xla_tape":
      return layer(x, **(case.call_kwargs or {}))
    with tf.GradientTape() as tape:
      tape.watch(x)
      return layer(x, **(case.call_kwargs or {}))
  if mode != "eager":
    run = tf.function(run, jit_compile=True)
  x = tf.constant(case.inputs, tf.float32)
  if case.stateful:
    run(x)
  got = tf.nest.map_structure(np.asarray, run(x))
  if case.reduce is not None:
    got = case.reduce(got)
  assert isinstance(got, tuple) == isinstance(case.expected, tuple)
  for g, e in zip(tf.nest.flatten(got), tf.nest.flatten(case.expected)):
    np.testing.assert_allclose(g, e, atol=case.tol, rtol=case.tol)
  assert len(tf.nest.flatten(got)) == len(tf.nest.flatten(case.expected))


# The cases also run compiled by XLA (the training jobs' loop), one or two of
# each path: chunked, masked, reversed, initial state, generic cell, unroll.
XLA_CASES = [
    "bidirectional.masking",
    "conv_lstm.correctness",
    "gru.masking.zero_output_for_mask",
    "gru.pass_initial_state.return_state.go_backwards",
    "lstm.correctness.plain.implementation2",
    "lstm.masking.go_backwards",
    "lstm.masking.return_sequences",
    "lstm.pass_initial_state.go_backwards",
    "rnn.masking.unroll_False",
    "rnn.statefulness.two_states",
    "simple_rnn.masking.return_sequences",
    "simple_rnn.masking.unroll",
]


@pytest.mark.parametrize("name,mode", [(name, "eager") for name in sorted(CASES)]
                         + [(name, mode) for name in XLA_CASES
                            for mode in ("xla", "xla_tape")])
def test_output_is_keras_number(name, mode):
  """Keras's expected outputs, eagerly as Keras checks them (and for some
  compiled by XLA, for inference and recorded for a gradient)."""
  case = CASES[name]
  layer = case.make()
  check(case, layer, mode)
  if case.stateful:
    layer.reset_state()
    check(case, layer, mode)


@pytest.mark.parametrize("merge_mode", ["ave", "concat", "mul", "sum", None])
@pytest.mark.parametrize("return_state", [True, False])
def test_bidirectional_output_shape(merge_mode, return_state):
  """bidirectional_test.test_output_shape."""
  x = np.array([[[101, 202], [303, 404]]])
  layer = keras.layers.Bidirectional(peer.LSTM(2, return_state=return_state),
                                     merge_mode=merge_mode)
  output = layer(x)
  output_shape = layer.compute_output_shape(x.shape)
  if merge_mode is None or return_state:
    assert len(output) == len(output_shape)
    for out, shape in zip(output, output_shape):
      assert out.shape == shape
  else:
    assert output.shape == output_shape


def test_bidirectional_keeps_use_cudnn():
  """bidirectional_test.test_keeps_use_cudnn."""
  for rnn_class in [peer.GRU, peer.LSTM]:
    for use_cudnn in [True, False, "auto"]:
      bidi = keras.layers.Bidirectional(rnn_class(1, use_cudnn=use_cudnn))
      assert bidi.forward_layer.use_cudnn == use_cudnn
      assert bidi.backward_layer.use_cudnn == use_cudnn
  bidi = keras.layers.Bidirectional(peer.SimpleRNN(1))
  assert not hasattr(bidi.forward_layer, "use_cudnn")
  assert not hasattr(bidi.backward_layer, "use_cudnn")


FUSED = getattr(keras.layers.Bidirectional, "_can_attempt_fused_lstm", None)


@pytest.mark.skipif(FUSED is None, reason="this Keras has no fused "
                    "Bidirectional path (Keras 3.15 has)")
def test_bidirectional_fused_eligibility():
  """bidirectional_test.test_fused_lstm_eligibility and
  test_fused_gru_eligibility: our LSTM/GRU are Keras's to the dispatch."""
  def built(layer):
    bidi = keras.layers.Bidirectional(layer)
    bidi.build((None, 5, 3))
    return bidi
  lstm, gru = built(peer.LSTM(4)), built(peer.GRU(4))
  assert lstm._can_attempt_fused_lstm(mask=None)  # pylint: disable=protected-access
  assert not gru._can_attempt_fused_lstm(mask=None)  # pylint: disable=protected-access
  assert not built(peer.SimpleRNN(4))._can_attempt_fused_lstm(mask=None)  # pylint: disable=protected-access
  assert not built(peer.LSTM(4, use_cudnn=False))._can_attempt_fused_lstm(  # pylint: disable=protected-access
      mask=None)
  assert not built(peer.LSTM(4, dropout=0.1))._can_attempt_fused_lstm(  # pylint: disable=protected-access
      mask=None)
  assert not lstm._can_attempt_fused_lstm(mask=np.ones((2, 5), dtype="bool"))  # pylint: disable=protected-access
  wrong_state = [np.zeros((2, 4), dtype="float32")] * 2
  assert not lstm._can_attempt_fused_lstm(mask=None, initial_state=wrong_state)  # pylint: disable=protected-access
  assert gru._can_attempt_fused_gru(mask=None)  # pylint: disable=protected-access
  assert not lstm._can_attempt_fused_gru(mask=None)  # pylint: disable=protected-access
  assert not built(peer.GRU(4, reset_after=False))._can_attempt_fused_gru(  # pylint: disable=protected-access
      mask=None)
  assert not gru._can_attempt_fused_gru(  # pylint: disable=protected-access
      mask=None, initial_state=[np.zeros((2, 4), dtype="float32")] * 4)


@pytest.mark.parametrize("name", ["LSTM", "GRU"])
def test_bidirectional_fused_matches_unfused(name):
  """bidirectional_test.test_fused_{lstm,gru}_matches_unfused."""
  x = np.random.default_rng(0).standard_normal((3, 6, 4)).astype("float32")

  def build(use_cudnn):
    layer = keras.layers.Bidirectional(getattr(peer, name)(
        5, use_cudnn=use_cudnn, return_sequences=True,
        kernel_initializer=keras.initializers.GlorotUniform(seed=1),
        recurrent_initializer=keras.initializers.Orthogonal(seed=2)))
    layer.build(x.shape)
    return layer

  ref, fused = build(False), build("auto")
  for rv, fv in zip(ref.weights, fused.weights):
    fv.assign(rv.value)
  np.testing.assert_allclose(ref(x), fused(x), atol=1e-5, rtol=1e-6)


def test_gru_stateful_with_symbolic_batch_size():
  """gru_test.test_stateful_with_symbolic_batch_size."""
  layer = peer.GRU(5, stateful=True)
  x_concrete = np.ones((2, 10, 10), dtype=np.float32)
  layer(x_concrete, training=True)

  @tf.function(input_signature=[tf.TensorSpec(shape=(None, 10, 10),
                                              dtype=tf.float32)])
  def f(x):
    return layer(x, training=True)

  assert f(x_concrete).shape == (2, 5)


@keras_since((3, 14), "the check of strides against dilation_rate")
@pytest.mark.parametrize("rank", [1, 2, 3])
def test_conv_lstm_symbolic_invalid_strides_dilation_rate(rank):
  """conv_lstm{1,2,3}d_test.test_symbolic_invalid_strides_dilation_rate."""
  with pytest.raises(ValueError, match=r"Specifying `strides > 1` is not "
                     r"compatible with `dilation_rate > 1`"):
    getattr(peer, f"ConvLSTM{rank}D")(
        filters=1, kernel_size=1, strides=2, padding="same", dilation_rate=3,
        return_sequences=True)


@pytest.mark.parametrize("cell,states", [(OneStateRNNCell, 1),
                                         (TwoStatesRNNCell, 2)])
@pytest.mark.parametrize("batch,time", [(3, 4), (None, None)])
def test_rnn_compute_output_shape(cell, states, batch, time):
  """rnn_test.test_compute_output_shape_{single,two}_state(s) and
  test_dynamic_shapes."""
  shape = (batch, time, 5 if batch else 3)
  for return_sequences in (False, True):
    output = (batch, time, 8) if return_sequences else (batch, 8)
    layer = peer.RNN(cell(8), return_sequences=return_sequences)
    assert layer.compute_output_shape(shape) == output
    layer = peer.RNN(cell(8), return_sequences=return_sequences,
                     return_state=True)
    got = layer.compute_output_shape(shape)
    assert len(got) == 1 + states
    assert got[0] == output and all(s == (batch, 8) for s in got[1:])


@pytest.mark.parametrize("cell", [TwoStatesRNNCell, OneStateRNNCell])
def test_rnn_serialization(cell):
  """rnn_test.test_serialization."""
  KERAS.run_class_serialization_test(peer.RNN(cell(2), return_sequences=False))


@keras_since((3, 12), "the check of a stateful RNN's batch size")
def test_rnn_stateful_batch_size_mismatch_raises():
  """rnn_test.test_stateful_batch_size_mismatch_raises."""
  batch_size, timesteps, features = 4, 5, 3
  layer = peer.RNN(TwoStatesRNNCell(2), stateful=True)
  inputs = keras.layers.Input(shape=(timesteps, features),
                              batch_size=batch_size)
  model = keras.Model(inputs, layer(inputs))
  model(keras.random.uniform(shape=(batch_size, timesteps, features)))
  with pytest.raises(ValueError, match="batch size"):
    model(keras.random.uniform(shape=(1, timesteps, features)))
