"""Decoders and `dynamic_decode`, as TF Addons' `tfa.seq2seq.decoder`.

`dynamic_decode` runs a decoder's `step` in a plain `tf.while_loop` until
every sequence is finished (or `maximum_iterations`): the loop for
inference, whose steps feed back their own samples and need no gradient's
memory savings. A decoder whose steps' inputs are all known in advance
(`BasicDecoder` with a `TrainingSampler`: teacher forcing) answers
`decode_teacher_forced` instead, running its cell over the whole sequence
on the op, whose backward pass keeps only the state per step.
"""

import abc
from typing import Any, Optional, Tuple, Union

import keras
import tensorflow as tf

from tf_recurrent.op import unconverted


def transpose_batch_time(tensor):
  """Swaps the first two axes of a tensor of rank 2 or more."""
  shape = tensor.shape
  if shape.rank is not None and shape.rank < 2:
    return tensor
  perm = tf.concat(([1, 0], tf.range(2, tf.rank(tensor))), axis=0)
  return tf.transpose(tensor, perm)


def _prepend_batch(batch_size, shape):
  static = tf.get_static_value(batch_size) if isinstance(
      batch_size, tf.Tensor) else batch_size
  if static is None:
    return tf.concat(([batch_size], shape), axis=0)
  return [static] + list(shape)


class _DecoderInterface:
  """What `dynamic_decode` reads of a decoder besides its steps."""

  @property
  def batch_size(self):
    raise NotImplementedError

  @property
  def output_size(self):
    raise NotImplementedError

  @property
  def output_dtype(self):
    raise NotImplementedError

  def finalize(self, outputs, final_state, sequence_lengths):
    raise NotImplementedError

  @property
  def tracks_own_finished(self):
    return False


class Decoder(_DecoderInterface, metaclass=abc.ABCMeta):
  """An RNN decoder's interface for `dynamic_decode` (TF1-style objects).

  Subclasses define `batch_size`, `output_size`, `output_dtype`,
  `initialize()`, `step(time, inputs, state, training)` and optionally
  `finalize` and `tracks_own_finished`. `BaseDecoder` is the Keras layer
  form.

  Example:

  >>> class Counter(Decoder):  # Emits 0, 1, 2, ... and stops after 3.
  ...   batch_size = 2
  ...   output_size = tf.TensorShape([])
  ...   output_dtype = tf.int32
  ...   def initialize(self, name=None):
  ...     return tf.zeros([2], tf.bool), tf.zeros([2], tf.int32), ()
  ...   def step(self, time, inputs, state, training=None, name=None):
  ...     return inputs, state, inputs + 1, tf.fill([2], time >= 2)
  >>> outputs, _, lengths = dynamic_decode(Counter())
  >>> outputs.numpy()[0], lengths.numpy()
  (array([0, 1, 2], dtype=int32), array([3, 3], dtype=int32))
  """


  @abc.abstractmethod
  def initialize(self, name=None):
    """Returns `(finished, initial_inputs, initial_state)`."""
    raise NotImplementedError

  @abc.abstractmethod
  def step(self, time, inputs, state, training=None, name=None):
    """Returns `(outputs, next_state, next_inputs, finished)`."""
    raise NotImplementedError



class BaseDecoder(_DecoderInterface, keras.layers.Layer):
  """A decoder as a Keras layer: calling it runs `dynamic_decode`.

  Args:
    output_time_major: Whether the outputs are `[time, batch, ...]`.
    impute_finished: Whether a finished sequence's outputs are zeros and
      its state is copied through.
    maximum_iterations: The most steps to run (required under XLA).
    parallel_iterations: The while loop's `parallel_iterations`.
    swap_memory: The while loop's `swap_memory`.
    **kwargs: Keras layer arguments.

  Example:

  >>> BaseDecoder(maximum_iterations=5).maximum_iterations
  5
  """

  def __init__(self, output_time_major: bool = False,
               impute_finished: bool = False,
               maximum_iterations: Optional[Any] = None,
               parallel_iterations: int = 32, swap_memory: bool = False,
               **kwargs):
    super().__init__(**kwargs)
    self.output_time_major = output_time_major
    self.impute_finished = impute_finished
    self.maximum_iterations = maximum_iterations
    self.parallel_iterations = parallel_iterations
    self.swap_memory = swap_memory

  def __call__(self, inputs, initial_state=None, training=None, **kwargs):
    # Decoding is a loop over the decoder's own steps: Keras's call
    # machinery (symbolic tracing, input conversion of the state's
    # TensorArrays) has nothing to add and is bypassed.
    with unconverted.errors_as_raised():
      return self.call(inputs, initial_state=initial_state,
                       training=training, **kwargs)

  def call(self, inputs, initial_state=None, training=None, **kwargs):
    init_kwargs = dict(kwargs, initial_state=initial_state)
    return dynamic_decode(
        self, output_time_major=self.output_time_major,
        impute_finished=self.impute_finished,
        maximum_iterations=self.maximum_iterations,
        parallel_iterations=self.parallel_iterations,
        swap_memory=self.swap_memory, training=training,
        decoder_init_input=inputs, decoder_init_kwargs=init_kwargs)


  def initialize(self, inputs, initial_state=None, **kwargs):
    """Returns `(finished, initial_inputs, initial_state)`."""
    raise NotImplementedError

  def decode_teacher_forced(self, inputs: Any, initial_state: Any = None,
                            training: Optional[bool] = None, *,
                            maximum_iterations: Optional[tf.Tensor],
                            impute_finished: bool, output_time_major: bool,
                            in_xla: bool,
                            **initialize_kwargs) -> Optional[Tuple[Any, Any, Any]]:
    """`dynamic_decode`'s result computed without its step loop, or None.

    A decoder whose every step's inputs are known before decoding (teacher
    forcing) may run them as one sequence on the op, whose gradient keeps
    only the state per step; `dynamic_decode` asks this first and runs
    its `tf.while_loop` when the answer is None, as it is here.

    Args:
      inputs: `dynamic_decode`'s `decoder_init_input`.
      initial_state: The decoder's initial state.
      training: Passed to the cell.
      maximum_iterations: The checked scalar, or None.
      impute_finished: `dynamic_decode`'s.
      output_time_major: `dynamic_decode`'s.
      in_xla: Whether the call is being compiled by XLA.
      **initialize_kwargs: The other arguments of `initialize`.

    Returns:
      None, or `(final_outputs, final_state, final_sequence_lengths)`.

    Example:

    >>> BaseDecoder().decode_teacher_forced(
    ...     None, None, None, maximum_iterations=None, impute_finished=False,
    ...     output_time_major=False, in_xla=False) is None
    True
    """
    del inputs, initial_state, training, maximum_iterations, impute_finished
    del output_time_major, in_xla, initialize_kwargs
    return None

  def step(self, time, inputs, state, training):
    """Returns `(outputs, next_state, next_inputs, finished)`."""
    raise NotImplementedError



def in_xla_context() -> bool:
  """Whether the graph being built is compiled by XLA (`jit_compile`)."""
  if tf.executing_eagerly():
    return False
  from tensorflow.python.ops import control_flow_util  # pylint: disable=g-import-not-at-top
  return control_flow_util.GraphOrParentsInXlaContext(
      tf.compat.v1.get_default_graph())


@unconverted.entry_point
def dynamic_decode(decoder: Union[Decoder, BaseDecoder],
                   output_time_major: bool = False,
                   impute_finished: bool = False,
                   maximum_iterations: Optional[Any] = None,
                   parallel_iterations: int = 32, swap_memory: bool = False,
                   training: Optional[bool] = None,
                   scope: Optional[str] = None,
                   enable_tflite_convertible: bool = False,
                   **kwargs) -> Tuple[Any, Any, Any]:
  """Runs `decoder` step by step until all sequences finish.

  Args:
    decoder: A `Decoder` or `BaseDecoder`.
    output_time_major: Whether the outputs are `[time, batch, ...]`.
    impute_finished: Zero the outputs and copy the state of finished
      sequences.
    maximum_iterations: The most steps (required under XLA).
    parallel_iterations: Passed to `tf.while_loop`.
    swap_memory: Passed to `tf.while_loop`.
    training: Passed to the decoder's step.
    scope: A name scope.
    enable_tflite_convertible: Fixed-size TensorArrays of flattened
      outputs, batch size 1 (as Addons').
    **kwargs: `decoder_init_input` and `decoder_init_kwargs` for a
      `BaseDecoder`'s `initialize`.

  Returns:
    `(final_outputs, final_state, final_sequence_lengths)`.

  Example:

  >>> import keras
  >>> from tf_recurrent import seq2seq
  >>> cell = keras.layers.GRUCell(4)
  >>> decoder = seq2seq.BasicDecoder(cell, seq2seq.TrainingSampler())
  >>> outputs, state, lengths = seq2seq.dynamic_decode(
  ...     decoder, decoder_init_input=tf.ones([2, 3, 5]),
  ...     decoder_init_kwargs={"initial_state": [tf.zeros([2, 4])],
  ...                          "sequence_length": [3, 1]})
  >>> outputs.rnn_output.shape, lengths.numpy()
  (TensorShape([2, 3, 4]), array([3, 1], dtype=int32))
  """
  with tf.name_scope(scope or "decoder"):
    is_xla = in_xla_context()
    if maximum_iterations is not None:
      maximum_iterations = tf.convert_to_tensor(
          maximum_iterations, dtype=tf.int32, name="maximum_iterations")
      if maximum_iterations.shape.ndims != 0:
        raise ValueError("maximum_iterations must be a scalar")
      static = tf.get_static_value(maximum_iterations)
      if static is not None and static <= 0:
        raise ValueError("maximum_iterations should be greater than 0")
    elif is_xla:
      raise ValueError("maximum_iterations is required for XLA compilation.")

    if isinstance(decoder, Decoder):
      initial_finished, initial_inputs, initial_state = (
          unconverted.like_caller(decoder.initialize)())
    else:
      init_input = kwargs.pop("decoder_init_input", None)
      init_kwargs = kwargs.pop("decoder_init_kwargs", {})
      if not enable_tflite_convertible:
        decoded = decoder.decode_teacher_forced(
            init_input, training=training,
            maximum_iterations=maximum_iterations,
            impute_finished=impute_finished,
            output_time_major=output_time_major, in_xla=is_xla,
            **init_kwargs)
        if decoded is not None:
          return decoded
      initial_finished, initial_inputs, initial_state = (
          unconverted.like_caller(decoder.initialize)(init_input,
                                                      **init_kwargs))

    def zeros(shape, dtype):
      z = tf.zeros(_prepend_batch(decoder.batch_size, shape), dtype=dtype)
      return tf.reshape(z, [-1]) if enable_tflite_convertible else z

    if enable_tflite_convertible:
      tf.debugging.assert_equal(decoder.batch_size, 1,
                                message="TFLite conversion requires a batch "
                                "size of 1")
    zero_outputs = tf.nest.map_structure(zeros, decoder.output_size,
                                         decoder.output_dtype)
    if maximum_iterations is not None:
      initial_finished = tf.logical_or(initial_finished,
                                       0 >= maximum_iterations)
    initial_sequence_lengths = tf.zeros_like(initial_finished, dtype=tf.int32)

    def element_shape(shape):
      if enable_tflite_convertible:
        return (1,) if (isinstance(shape, tf.TensorShape) and
                        shape.ndims == 0) else shape
      if not isinstance(shape, tf.TensorShape) or shape.ndims == 0:
        return None
      batch = tf.get_static_value(tf.convert_to_tensor(decoder.batch_size))
      return tf.TensorShape([batch]).concatenate(shape)

    # XLA needs fixed-size arrays; elsewhere they grow with the steps.
    dynamic_size = ((maximum_iterations is None or not is_xla) and
                    not enable_tflite_convertible)
    outputs_ta = tf.nest.map_structure(
        lambda s, d: tf.TensorArray(
            dtype=d, size=0 if dynamic_size else maximum_iterations,
            dynamic_size=dynamic_size, element_shape=element_shape(s)),
        decoder.output_size, decoder.output_dtype)

    def condition(unused_time, unused_outputs_ta, unused_state, unused_inputs,
                  finished, unused_sequence_lengths):
      return tf.logical_not(tf.reduce_all(finished))

    def body(time, outputs_ta, state, inputs, finished, sequence_lengths):
      next_outputs, decoder_state, next_inputs, decoder_finished = (
          unconverted.like_caller(decoder.step)(time, inputs, state,
                                                training))
      state_lengths = False
      if decoder.tracks_own_finished:
        next_finished = decoder_finished
        lengths = getattr(decoder_state, "lengths", None)
        if lengths is not None:
          state_lengths = True
          sequence_lengths = tf.cast(lengths, tf.int32)
      else:
        next_finished = tf.logical_or(decoder_finished, finished)
      if not state_lengths:
        sequence_lengths = tf.where(
            tf.logical_not(finished),
            tf.fill(tf.shape(sequence_lengths), time + 1), sequence_lengths)
      tf.nest.assert_same_structure(state, decoder_state)
      tf.nest.assert_same_structure(outputs_ta, next_outputs)
      tf.nest.assert_same_structure(inputs, next_inputs)

      def where_finished(new, old):
        mask = finished
        if mask.shape.rank < new.shape.rank:
          mask = tf.broadcast_to(
              tf.reshape(finished, tf.concat(
                  [tf.shape(finished),
                   tf.ones([new.shape.rank - 1], tf.int32)], 0)),
              tf.shape(new))
        return tf.where(mask, old, new)

      if impute_finished:
        emit = tf.nest.map_structure(lambda out, zero: where_finished(out, zero),
                                     next_outputs, zero_outputs)

        def copy_state(new, cur):
          if isinstance(cur, tf.TensorArray):
            return new
          new.set_shape(cur.shape)
          return new if new.shape.ndims == 0 else where_finished(new, cur)

        next_state = tf.nest.map_structure(copy_state, decoder_state, state)
      else:
        emit, next_state = next_outputs, decoder_state
      if enable_tflite_convertible:
        emit = tf.nest.map_structure(lambda x: tf.reshape(x, [-1]), emit)
      outputs_ta = tf.nest.map_structure(lambda ta, out: ta.write(time, out),
                                         outputs_ta, emit)
      return (time + 1, outputs_ta, next_state, next_inputs, next_finished,
              sequence_lengths)

    res = tf.while_loop(
        condition, body,
        loop_vars=(tf.constant(0, tf.int32), outputs_ta, initial_state,
                   initial_inputs, initial_finished, initial_sequence_lengths),
        parallel_iterations=parallel_iterations,
        maximum_iterations=maximum_iterations, swap_memory=swap_memory)
    final_outputs = tf.nest.map_structure(lambda ta: ta.stack(), res[1])
    final_state, final_sequence_lengths = res[2], res[5]
    try:
      final_outputs, final_state = unconverted.like_caller(decoder.finalize)(
          final_outputs, final_state, final_sequence_lengths)
    except NotImplementedError:
      pass
    if not output_time_major:
      if enable_tflite_convertible:
        final_outputs = tf.nest.map_structure(lambda x: tf.expand_dims(x, 1),
                                              final_outputs)
      final_outputs = tf.nest.map_structure(transpose_batch_time,
                                            final_outputs)
  return final_outputs, final_state, final_sequence_lengths
