"""`BasicDecoder`: a cell, a sampler and an optional output layer, stepped
by `dynamic_decode` (TF Addons' `tfa.seq2seq.BasicDecoder`)."""

import collections
from typing import Optional

import keras
import numpy as np
import tensorflow as tf

from tf_recurrent import engine
from tf_recurrent.op import unconverted
from tf_recurrent.seq2seq import decoder
from tf_recurrent.seq2seq import sampler as sampler_py


class BasicDecoderOutput(
    collections.namedtuple("BasicDecoderOutput", ("rnn_output", "sample_id"))):
  """A `BasicDecoder`'s per-step outputs: the (projected) cell output and
  the sampler's ids.

  Example:

  >>> BasicDecoderOutput(rnn_output=1, sample_id=2).sample_id
  2
  """


class BasicDecoder(decoder.BaseDecoder):
  """Steps `cell` on inputs chosen by `sampler`; calling it decodes.

  `decoder(inputs, initial_state=..., **sampler kwargs)` runs
  `dynamic_decode` and returns `(BasicDecoderOutput, final state, lengths)`.

  Args:
    cell: A Keras cell (or `AttentionWrapper`).
    sampler: A `Sampler`.
    output_layer: Optional layer applied to the cell's output (e.g. the
      vocabulary projection) before sampling.
    **kwargs: `BaseDecoder`'s arguments (`maximum_iterations`,
      `impute_finished`, `output_time_major`, ...) and Keras's.

  Example:

  >>> decoder = BasicDecoder(keras.layers.SimpleRNNCell(4),
  ...                        sampler_py.TrainingSampler())
  >>> outputs, state, lengths = decoder(tf.ones([2, 3, 5]),
  ...                                   initial_state=[tf.zeros([2, 4])])
  >>> outputs.rnn_output.shape, outputs.sample_id.shape
  (TensorShape([2, 3, 4]), TensorShape([2, 3]))
  """

  def __init__(self, cell: keras.layers.Layer, sampler: sampler_py.Sampler,
               output_layer: Optional[keras.layers.Layer] = None, **kwargs):
    if not ("state_size" in dir(cell) and callable(cell)):
      raise TypeError("The argument 'cell' must be an RNN cell (a layer with "
                      f"state_size and call(inputs, states)); got {cell!r}.")
    if not isinstance(sampler, sampler_py.Sampler):
      raise TypeError(f"sampler must be a Sampler; got {sampler!r}.")
    super().__init__(**kwargs)
    self.cell = cell
    self.sampler = sampler
    self.output_layer = output_layer

  def initialize(self, inputs, initial_state=None, **kwargs):
    self._cell_dtype = tf.nest.flatten(initial_state)[0].dtype
    return unconverted.like_caller(self.sampler.initialize)(
        inputs, **kwargs) + (initial_state,)

  @property
  def batch_size(self):
    return self.sampler.batch_size

  def decode_teacher_forced(self, inputs, initial_state=None, training=None,
                            *, maximum_iterations, impute_finished,
                            output_time_major, in_xla, **initialize_kwargs):
    """With a `TrainingSampler` (teacher forcing: step t reads input t),
    `dynamic_decode`'s result from one run of the cell over the inputs'
    first n = min(max(sequence_length), maximum_iterations) steps on the
    op (`tf_recurrent.engine.run`, the cell's own call: the loop's step
    math, to the bit), whose gradient keeps the state per step
    where the while loop's autodiff keeps every step's intermediates (an
    attention's scores over the whole memory); None otherwise (a sampler
    that feeds back samples, a TensorArray in the state as with
    `alignment_history`, or a step count XLA cannot know)."""
    if (type(self.sampler) is not sampler_py.TrainingSampler or  # pylint: disable=unidiomatic-typecheck
        any(isinstance(s, tf.TensorArray)
            for s in tf.nest.flatten(initial_state))):
      return None
    _, _, state0 = self.initialize(inputs, initial_state=initial_state,
                                   **initialize_kwargs)
    x = tf.nest.map_structure(tf.convert_to_tensor, inputs)
    if not self.sampler.time_major:
      x = tf.nest.map_structure(decoder.transpose_batch_time, x)
    lengths = tf.cast(self.sampler.sequence_length, tf.int32)
    steps = tf.reduce_max(lengths)
    if maximum_iterations is not None:
      steps = tf.minimum(steps, maximum_iterations)
    # The step count in Python where the lengths and the maximum are known
    # (reductions are beyond tf.get_static_value).
    known_lengths = tf.get_static_value(lengths)
    if (initialize_kwargs.get("sequence_length") is None and
        initialize_kwargs.get("mask") is None):  # Every sequence is whole.
      time = tf.nest.flatten(x)[0].shape[0]
      known_lengths = None if time is None else np.array([time])
    known_maximum = (None if maximum_iterations is None else
                     tf.get_static_value(maximum_iterations))
    known = None
    if known_lengths is not None and (maximum_iterations is None or
                                      known_maximum is not None):
      known = int(max(known_lengths.max(initial=0), 0))
      if known_maximum is not None:
        known = min(known, int(known_maximum))
      steps = known
    if in_xla:
      # Static shapes: the step count must be known, and the outputs have
      # maximum_iterations steps, as the loop's fixed-size arrays do.
      if known is None or known_maximum is None:
        return None
    if known is not None and known <= 0:
      return None  # Nothing to run: the loop's empty result.
    x = tf.nest.map_structure(lambda t: t[:steps], x)
    lengths = tf.minimum(lengths, steps)
    if not self.cell.built:
      # Outside the op's traced step, where a distribution strategy cannot
      # create (mirrored) variables, as keras.layers.RNN builds its cell.
      self.cell.build(tf.nest.map_structure(
          lambda t: tuple(t.shape[1:].as_list()), x))
    outputs, final, _ = engine.run(
        self.cell, x, state0, lengths=lengths if impute_finished else None,
        training=training, time_major=True, zero_output_for_mask=True,
        convertible=False, own_step=True)
    final_state = tf.nest.pack_sequence_as(state0, tf.nest.flatten(final))
    if self.output_layer is not None:
      outputs = self.output_layer(outputs)
    sample_ids = unconverted.like_caller(self.sampler.sample)(
        time=None, outputs=outputs, state=None)
    decoded = BasicDecoderOutput(outputs, sample_ids)
    if impute_finished:  # A finished sequence emits zeros, as in the loop.
      running = tf.sequence_mask(lengths, tf.shape(sample_ids)[0])
      running = tf.transpose(running)
      decoded = tf.nest.map_structure(
          lambda t: tf.where(tf.reshape(running, tf.concat(
              [tf.shape(running), tf.ones([t.shape.rank - 2], tf.int32)], 0)),
                             t, tf.zeros_like(t)), decoded)
    if in_xla and known_maximum > known:
      decoded = tf.nest.map_structure(
          lambda t: tf.pad(t, [[0, int(known_maximum) - known]] + [[0, 0]] * (
              t.shape.rank - 1)), decoded)
    if not output_time_major:
      decoded = tf.nest.map_structure(decoder.transpose_batch_time, decoded)
    return decoded, final_state, lengths

  def _rnn_output_size(self):
    size = tf.TensorShape(self.cell.output_size)
    if self.output_layer is None:
      return size
    shape = self.output_layer.compute_output_shape(
        tuple([None] + size.as_list()))
    return tf.TensorShape(shape[1:])

  @property
  def output_size(self):
    return BasicDecoderOutput(rnn_output=self._rnn_output_size(),
                              sample_id=self.sampler.sample_ids_shape)

  @property
  def output_dtype(self):
    dtype = self._cell_dtype
    return BasicDecoderOutput(
        tf.nest.map_structure(lambda _: dtype, self._rnn_output_size()),
        self.sampler.sample_ids_dtype)

  def step(self, time, inputs, state, training=None):
    kwargs = ({"training": training}
              if getattr(self.cell, "_call_has_training_arg", False) else {})
    cell_outputs, cell_state = self.cell(inputs, state, **kwargs)
    cell_state = tf.nest.pack_sequence_as(state, tf.nest.flatten(cell_state))
    if self.output_layer is not None:
      cell_outputs = self.output_layer(cell_outputs)
    sample_ids = unconverted.like_caller(self.sampler.sample)(
        time=time, outputs=cell_outputs, state=cell_state)
    finished, next_inputs, next_state = unconverted.like_caller(
        self.sampler.next_inputs)(
        time=time, outputs=cell_outputs, state=cell_state,
        sample_ids=sample_ids)
    return (BasicDecoderOutput(cell_outputs, sample_ids), next_state,
            next_inputs, finished)
