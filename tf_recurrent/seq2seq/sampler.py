"""Samplers: how a `BasicDecoder` picks each step's sample and next input.

TF Addons' `tfa.seq2seq` samplers with their names, arguments and
semantics: teacher forcing (`TrainingSampler`), scheduled sampling
(`ScheduledEmbeddingTrainingSampler`, `ScheduledOutputTrainingSampler`),
inference (`GreedyEmbeddingSampler`, `SampleEmbeddingSampler`,
`InferenceSampler`) and `CustomSampler`.
"""

import abc
from typing import Any, Callable, Optional

import tensorflow as tf

from tf_recurrent.op import unconverted
from tf_recurrent.seq2seq import decoder
from tf_recurrent.seq2seq import helpers



class Sampler(metaclass=abc.ABCMeta):
  """The interface: `initialize`, `sample`, `next_inputs` and the sample ids'
  `batch_size`, `sample_ids_shape`, `sample_ids_dtype`.

  Example:

  >>> isinstance(TrainingSampler(), Sampler)
  True
  """

  @abc.abstractmethod
  def initialize(self, inputs, **kwargs):
    """Returns `(initial_finished, initial_inputs)`."""

  @abc.abstractmethod
  def sample(self, time, outputs, state):
    """Returns the step's `sample_ids`."""

  @abc.abstractmethod
  def next_inputs(self, time, outputs, state, sample_ids):
    """Returns `(finished, next_inputs, next_state)`."""

  @property
  @abc.abstractmethod
  def batch_size(self):
    raise NotImplementedError("batch_size has not been implemented")

  @property
  @abc.abstractmethod
  def sample_ids_shape(self):
    raise NotImplementedError("sample_ids_shape has not been implemented")

  @property
  @abc.abstractmethod
  def sample_ids_dtype(self):
    raise NotImplementedError("sample_ids_dtype has not been implemented")


class _BatchSized(Sampler):
  """A sampler whose batch size is known once initialized."""
  _batch_size = None

  @property
  def batch_size(self):
    if self._batch_size is None:
      raise ValueError("batch_size accessed before initialize was called")
    return self._batch_size


class _IdSampler(_BatchSized):
  """A sampler of one int32 id per example."""

  @property
  def sample_ids_shape(self):
    return tf.TensorShape([])

  @property
  def sample_ids_dtype(self):
    return tf.int32


class CustomSampler(_BatchSized):
  """A sampler of user functions.

  Args:
    initialize_fn: `(inputs, **kwargs) -> (finished, next_inputs)`.
    sample_fn: `(time, outputs, state) -> sample_ids`.
    next_inputs_fn: `(time, outputs, state, sample_ids) -> (finished,
      next_inputs, next_state)`.
    sample_ids_shape: The sample ids' shape per example (default []).
    sample_ids_dtype: Their dtype (default int32).

  Example:

  >>> sampler = CustomSampler(lambda x: (tf.zeros([2], tf.bool), x),
  ...                         lambda time, outputs, state: outputs,
  ...                         lambda time, outputs, state, sample_ids: None)
  >>> sampler.initialize(tf.ones([2, 3]))[1].shape
  TensorShape([2, 3])
  """

  def __init__(self, initialize_fn: Callable, sample_fn: Callable,
               next_inputs_fn: Callable, sample_ids_shape: Any = None,
               sample_ids_dtype: Any = None):
    self._initialize_fn = initialize_fn
    self._sample_fn = sample_fn
    self._next_inputs_fn = next_inputs_fn
    self._batch_size = None
    self._sample_ids_shape = tf.TensorShape(sample_ids_shape or [])
    self._sample_ids_dtype = sample_ids_dtype or tf.int32

  @property
  def sample_ids_shape(self):
    return self._sample_ids_shape

  @property
  def sample_ids_dtype(self):
    return self._sample_ids_dtype

  def initialize(self, inputs, **kwargs):
    finished, next_inputs = unconverted.like_caller(self._initialize_fn)(
        inputs, **kwargs)
    if self._batch_size is None:
      self._batch_size = tf.size(finished)
    return finished, next_inputs

  def sample(self, time, outputs, state):
    return unconverted.like_caller(self._sample_fn)(
        time=time, outputs=outputs, state=state)

  def next_inputs(self, time, outputs, state, sample_ids):
    return unconverted.like_caller(self._next_inputs_fn)(
        time=time, outputs=outputs, state=state, sample_ids=sample_ids)


def _unstack_ta(inp):
  return tf.TensorArray(dtype=inp.dtype, size=tf.shape(inp)[0],
                        element_shape=inp.shape[1:]).unstack(inp)


# Addons' name, which its tests call.
_check_sequence_is_right_padded = helpers.check_sequence_is_right_padded


class TrainingSampler(_IdSampler):
  """Teacher forcing: each step's input is the given one.

  `initialize(inputs, sequence_length=None, mask=None)` takes the
  `[batch, time, ...]` inputs (`[time, batch, ...]` if `time_major`) and
  either `[batch]` lengths or a right-padded `[batch, time]` bool mask.

  Args:
    time_major: The inputs' layout.

  Example:

  >>> sampler = TrainingSampler()
  >>> finished, first = sampler.initialize(tf.ones([2, 4, 3]),
  ...                                      sequence_length=[4, 0])
  >>> finished.numpy(), first.shape
  (array([False,  True]), TensorShape([2, 3]))
  """

  def __init__(self, time_major: bool = False):
    self.time_major = time_major
    self._batch_size = None

  def initialize(self, inputs, sequence_length=None, mask=None):
    self.inputs = tf.convert_to_tensor(inputs, name="inputs")
    inputs = self.inputs
    if not self.time_major:
      inputs = tf.nest.map_structure(decoder.transpose_batch_time, inputs)
    self._batch_size = tf.shape(tf.nest.flatten(inputs)[0])[1]
    self.input_tas = tf.nest.map_structure(_unstack_ta, inputs)
    if sequence_length is not None and mask is not None:
      raise ValueError(
          "sequence_length and mask can't be provided at the same time.")
    if sequence_length is not None:
      self.sequence_length = tf.convert_to_tensor(sequence_length,
                                                  name="sequence_length")
      if self.sequence_length.shape.ndims != 1:
        raise ValueError("Expected sequence_length to be vector, but received "
                         f"shape: {self.sequence_length.shape}")
    elif mask is not None:
      mask = tf.convert_to_tensor(mask)
      if mask.shape.ndims != 2:
        raise ValueError(f"Expected mask to a 2D tensor, but received shape: "
                         f"{mask}")
      if not mask.dtype.is_bool:
        raise ValueError("Expected mask to be a boolean tensor, but received "
                         f"dtype: {mask.dtype!r}")
      axis = 0 if self.time_major else 1
      with tf.control_dependencies(
          [_check_sequence_is_right_padded(mask, self.time_major)]):
        self.sequence_length = tf.reduce_sum(tf.cast(mask, tf.int32),
                                             axis=axis, name="sequence_length")
    else:
      self.sequence_length = tf.fill([self.batch_size],
                                     tf.shape(tf.nest.flatten(inputs)[0])[0],
                                     name="sequence_length")
    self.zero_inputs = tf.nest.map_structure(lambda x: tf.zeros_like(x[0, :]),
                                             inputs)
    finished = tf.equal(0, self.sequence_length)
    next_inputs = tf.cond(
        tf.reduce_all(finished), lambda: self.zero_inputs,
        lambda: tf.nest.map_structure(lambda ta: ta.read(0), self.input_tas))
    return finished, next_inputs

  def sample(self, time, outputs, state):
    del time, state
    return tf.cast(tf.argmax(outputs, axis=-1), tf.int32)

  def next_inputs(self, time, outputs, state, sample_ids):
    del outputs, sample_ids
    next_time = time + 1
    finished = next_time >= self.sequence_length
    next_inputs = tf.cond(
        tf.reduce_all(finished), lambda: self.zero_inputs,
        lambda: tf.nest.map_structure(lambda ta: ta.read(next_time),
                                      self.input_tas))
    return finished, next_inputs, state


def _sampling_probability(sampling_probability):
  if not isinstance(sampling_probability, tf.Variable):
    sampling_probability = tf.convert_to_tensor(sampling_probability,
                                                name="sampling_probability")
  if sampling_probability.shape.ndims not in (0, 1):
    raise ValueError("sampling_probability must be either a scalar or a "
                     f"vector. saw shape: {sampling_probability.shape}")
  return sampling_probability


def _draw_per_example(probability, batch_size, seed, dtype):
  """One Bernoulli draw per example, `[batch_size]`: each with the scalar
  `probability`, or with its own entry of a `[batch_size]` vector (where
  Addons drew `batch_size` draws of the whole vector, a `[batch, batch]`
  draw its `next_inputs` then failed on)."""
  if probability.shape.ndims == 0:
    return bernoulli_sample(probs=probability, dtype=dtype,
                            sample_shape=batch_size, seed=seed)
  check = tf.debugging.assert_equal(
      tf.size(probability), tf.cast(batch_size, tf.int32),
      message="sampling_probability, a vector, must have one probability "
      "per example (its size the batch size)")
  with tf.control_dependencies([check]):
    return bernoulli_sample(probs=tf.identity(probability), dtype=dtype,
                            seed=seed)


def _merge_by_index(where_a, updates_a, where_b, updates_b, shape):
  """Scatters two disjoint row sets back into one `shape` tensor."""
  return (tf.scatter_nd(where_a, updates_a, shape) +
          tf.scatter_nd(where_b, updates_b, shape))


class ScheduledEmbeddingTrainingSampler(TrainingSampler):
  """Scheduled sampling (Bengio et al. 2015) over embedded sample ids.

  Each example's next input is, with `sampling_probability`, the
  embedding of an id drawn from the step's logits, else the given input.

  Args:
    sampling_probability: Scalar or `[batch]` probability of sampling.
    embedding_fn: `ids -> embeddings`; or pass `embedding` to initialize.
    time_major: The inputs' layout.
    seed: The categorical draw's seed.
    scheduling_seed: The sampling decision's seed.

  Example:

  >>> sampler = ScheduledEmbeddingTrainingSampler(0.0)
  >>> _ = sampler.initialize(tf.ones([2, 4, 3]), embedding=tf.ones([5, 3]))
  >>> sampler.sample(0, tf.ones([2, 5]), None).numpy()
  array([-1, -1], dtype=int32)
  """

  def __init__(self, sampling_probability: Any,
               embedding_fn: Optional[Callable] = None,
               time_major: bool = False, seed: Optional[int] = None,
               scheduling_seed: Optional[Any] = None):
    self.embedding_fn = embedding_fn
    self.sampling_probability = _sampling_probability(sampling_probability)
    self.seed = seed
    self.scheduling_seed = scheduling_seed
    super().__init__(time_major=time_major)

  def initialize(self, inputs, sequence_length=None, mask=None,
                 embedding=None):
    if self.embedding_fn is None:
      if embedding is None:
        raise ValueError("embedding is required as a keyword argument for "
                         "ScheduledEmbeddingTrainingSampler")
      self.embedding_fn = lambda ids: tf.nn.embedding_lookup(embedding, ids)
    return super().initialize(inputs, sequence_length=sequence_length,
                              mask=mask)

  def sample(self, time, outputs, state):
    del state
    select = _draw_per_example(self.sampling_probability, self.batch_size,
                               self.scheduling_seed, tf.bool)
    return tf.where(select, categorical_sample(logits=outputs, seed=self.seed),
                    tf.fill([self.batch_size], -1))

  def next_inputs(self, time, outputs, state, sample_ids):
    finished, base_next_inputs, state = super().next_inputs(
        time=time, outputs=outputs, state=state, sample_ids=sample_ids)

    def maybe_sample():
      where_sampling = tf.cast(tf.where(sample_ids > -1), tf.int32)
      where_not = tf.cast(tf.where(sample_ids <= -1), tf.int32)
      kept = tf.gather_nd(base_next_inputs, where_not)
      sampled = tf.cast(
          unconverted.like_caller(self.embedding_fn)(
              tf.gather_nd(sample_ids, where_sampling)),
          kept.dtype)
      return _merge_by_index(where_sampling, sampled, where_not, kept,
                             tf.shape(base_next_inputs))

    next_inputs = tf.cond(tf.reduce_all(finished), lambda: base_next_inputs,
                          maybe_sample)
    return finished, next_inputs, state


class ScheduledOutputTrainingSampler(TrainingSampler):
  """Scheduled sampling over the step's outputs themselves.

  Each example's next input is, with `sampling_probability`, the step's
  output (through `next_inputs_fn` if given, concatenated with the
  `auxiliary_inputs` given to initialize), else the given input.

  Args:
    sampling_probability: Scalar or `[batch]` probability of sampling.
    time_major: The inputs' layout.
    seed: The sampling decision's seed.
    next_inputs_fn: Optional `outputs -> next inputs`.

  Example:

  >>> sampler = ScheduledOutputTrainingSampler(1.0)
  >>> _ = sampler.initialize(tf.zeros([2, 4, 3]))
  >>> ids = sampler.sample(0, tf.ones([2, 3]), None)
  >>> sampler.next_inputs(0, tf.ones([2, 3]), None, ids)[1].numpy()[0]
  array([1., 1., 1.], dtype=float32)
  """

  def __init__(self, sampling_probability: Any, time_major: bool = False,
               seed: Optional[int] = None,
               next_inputs_fn: Optional[Callable] = None):
    self.sampling_probability = _sampling_probability(sampling_probability)
    self.seed = seed
    self.next_inputs_fn = next_inputs_fn
    super().__init__(time_major=time_major)

  def initialize(self, inputs, sequence_length=None, mask=None,
                 auxiliary_inputs=None):
    if auxiliary_inputs is None:
      maybe_concatenated = inputs
      self._auxiliary_input_tas = None
    else:
      inputs = tf.convert_to_tensor(inputs)
      auxiliary_inputs = tf.convert_to_tensor(auxiliary_inputs)
      maybe_concatenated = tf.nest.map_structure(
          lambda x, y: tf.concat((x, y), -1), inputs, auxiliary_inputs)
      if not self.time_major:
        auxiliary_inputs = tf.nest.map_structure(decoder.transpose_batch_time,
                                                 auxiliary_inputs)
      self._auxiliary_input_tas = tf.nest.map_structure(_unstack_ta,
                                                        auxiliary_inputs)
    return super().initialize(maybe_concatenated,
                              sequence_length=sequence_length, mask=mask)

  def sample(self, time, outputs, state):
    del state
    return _draw_per_example(self.sampling_probability, self.batch_size,
                             self.seed, tf.int32)

  def next_inputs(self, time, outputs, state, sample_ids):
    finished, base_next_inputs, state = super().next_inputs(
        time=time, outputs=outputs, state=state, sample_ids=sample_ids)
    sample_ids = tf.cast(sample_ids, tf.bool)

    def with_auxiliary(outputs_, indices=None):
      if self._auxiliary_input_tas is None:
        return outputs_
      auxiliary = tf.nest.map_structure(lambda ta: ta.read(time + 1),
                                        self._auxiliary_input_tas)
      if indices is not None:
        auxiliary = tf.gather_nd(auxiliary, indices)
      return tf.nest.map_structure(lambda x, y: tf.concat((x, y), -1),
                                   outputs_, auxiliary)

    def maybe_sample():
      if self.next_inputs_fn is None:
        return tf.where(
            tf.broadcast_to(tf.expand_dims(sample_ids, -1),
                            tf.shape(base_next_inputs)),
            with_auxiliary(outputs), base_next_inputs)
      where_sampling = tf.cast(tf.where(sample_ids), tf.int32)
      where_not = tf.cast(tf.where(tf.logical_not(sample_ids)), tf.int32)
      sampled = with_auxiliary(
          unconverted.like_caller(self.next_inputs_fn)(
              tf.gather_nd(outputs, where_sampling)),
          where_sampling)
      return _merge_by_index(where_sampling, sampled, where_not,
                             tf.gather_nd(base_next_inputs, where_not),
                             tf.shape(base_next_inputs))

    no_samples = tf.logical_not(tf.reduce_any(sample_ids))
    next_inputs = tf.cond(
        tf.logical_or(tf.reduce_all(finished), no_samples),
        lambda: base_next_inputs, maybe_sample)
    return finished, next_inputs, state


class GreedyEmbeddingSampler(_IdSampler):
  """Greedy decoding: the next input is the embedding of the argmax id.

  `initialize(embedding, start_tokens, end_token)`; a sequence finishes
  when it emits `end_token`.

  Args:
    embedding_fn: `ids -> embeddings`; or pass `embedding` to initialize.

  Example:

  >>> sampler = GreedyEmbeddingSampler()
  >>> finished, first = sampler.initialize(tf.eye(4), [1, 2], 3)
  >>> first.numpy()[0]
  array([0., 1., 0., 0.], dtype=float32)
  """

  def __init__(self, embedding_fn: Optional[Callable] = None):
    self.embedding_fn = embedding_fn
    self._batch_size = None

  def initialize(self, embedding, start_tokens=None, end_token=None):
    if self.embedding_fn is None:
      self.embedding_fn = lambda ids: tf.nn.embedding_lookup(embedding, ids)
    self.start_tokens = tf.convert_to_tensor(start_tokens, dtype=tf.int32,
                                             name="start_tokens")
    self.end_token = tf.convert_to_tensor(end_token, dtype=tf.int32,
                                          name="end_token")
    if self.start_tokens.shape.ndims != 1:
      raise ValueError("start_tokens must be a vector")
    self._batch_size = tf.size(self.start_tokens)
    if self.end_token.shape.ndims != 0:
      raise ValueError("end_token must be a scalar")
    self.start_inputs = unconverted.like_caller(self.embedding_fn)(
        self.start_tokens)
    finished = tf.tile([False], [self._batch_size])
    return finished, self.start_inputs

  def sample(self, time, outputs, state):
    del time, state
    if not isinstance(outputs, tf.Tensor):
      raise TypeError(
          f"Expected outputs to be a single Tensor, got: {type(outputs)}")
    return tf.argmax(outputs, axis=-1, output_type=tf.int32)

  def next_inputs(self, time, outputs, state, sample_ids):
    del time, outputs
    finished = tf.equal(sample_ids, self.end_token)
    embed = unconverted.like_caller(self.embedding_fn)
    next_inputs = tf.cond(tf.reduce_all(finished), lambda: self.start_inputs,
                          lambda: embed(sample_ids))
    return finished, next_inputs, state


class SampleEmbeddingSampler(GreedyEmbeddingSampler):
  """Like `GreedyEmbeddingSampler`, but draws ids from the softmax.

  Args:
    embedding_fn: `ids -> embeddings`; or pass `embedding` to initialize.
    softmax_temperature: Divides the logits (None: 1).
    seed: The draw's seed.

  Example:

  >>> sampler = SampleEmbeddingSampler(seed=1)
  >>> _ = sampler.initialize(tf.eye(4), [1, 2], 3)
  >>> sampler.sample(0, tf.constant([[0., 0., 100., 0.]] * 2), None).numpy()
  array([2, 2], dtype=int32)
  """

  def __init__(self, embedding_fn: Optional[Callable] = None,
               softmax_temperature: Optional[Any] = None,
               seed: Optional[Any] = None):
    super().__init__(embedding_fn)
    self.softmax_temperature = softmax_temperature
    self.seed = seed

  def sample(self, time, outputs, state):
    del time, state
    if not isinstance(outputs, tf.Tensor):
      raise TypeError(
          f"Expected outputs to be a single Tensor, got: {type(outputs)}")
    logits = (outputs if self.softmax_temperature is None
              else outputs / self.softmax_temperature)
    return categorical_sample(logits=logits, seed=self.seed)


class InferenceSampler(_BatchSized):
  """Inference with user functions on the outputs (not embeddings).

  Args:
    sample_fn: `outputs -> sample`.
    sample_shape: The sample's shape per example.
    sample_dtype: The sample's dtype.
    end_fn: `sample -> finished` bools.
    next_inputs_fn: Optional `sample -> next inputs` (default: the sample).

  Example:

  >>> sampler = InferenceSampler(tf.sigmoid, [3], tf.float32,
  ...                            lambda s: tf.reduce_all(s > 0.9, -1))
  >>> finished, first = sampler.initialize(tf.zeros([2, 3]))
  >>> finished.numpy()
  array([False, False])
  """

  def __init__(self, sample_fn: Callable, sample_shape: Any,
               sample_dtype: Any, end_fn: Callable,
               next_inputs_fn: Optional[Callable] = None):
    self.sample_fn = sample_fn
    self.sample_shape = tf.TensorShape(sample_shape)
    self.sample_dtype = sample_dtype
    self.end_fn = end_fn
    self.next_inputs_fn = next_inputs_fn
    self._batch_size = None

  @property
  def sample_ids_shape(self):
    return self.sample_shape

  @property
  def sample_ids_dtype(self):
    return self.sample_dtype

  def initialize(self, start_inputs):
    self.start_inputs = tf.convert_to_tensor(start_inputs,
                                             name="start_inputs")
    self._batch_size = tf.shape(self.start_inputs)[0]
    return tf.tile([False], [self._batch_size]), self.start_inputs

  def sample(self, time, outputs, state):
    del time, state
    return unconverted.like_caller(self.sample_fn)(outputs)

  def next_inputs(self, time, outputs, state, sample_ids):
    del time, outputs
    next_inputs = (
        sample_ids if self.next_inputs_fn is None else
        unconverted.like_caller(self.next_inputs_fn)(sample_ids))
    return unconverted.like_caller(self.end_fn)(sample_ids), next_inputs, state


def _call_sampler(sample_n_fn, sample_shape):
  """Draws `prod(sample_shape)` samples and shapes them `sample_shape`."""
  sample_shape = tf.convert_to_tensor(sample_shape, dtype=tf.int32)
  pad = tf.cast(tf.equal(tf.rank(sample_shape), 0), tf.int32)
  sample_shape = tf.reshape(
      sample_shape,
      tf.pad(tf.shape(sample_shape), [[pad, 0]], constant_values=1))
  samples = sample_n_fn(tf.reduce_prod(sample_shape))
  return tf.reshape(samples, tf.concat([sample_shape, tf.shape(samples)[1:]],
                                       0))


def bernoulli_sample(probs: Any = None, logits: Any = None,
                     dtype: Any = tf.int32, sample_shape: Any = (),
                     seed: Optional[int] = None) -> tf.Tensor:
  """Bernoulli draws (Addons' helper, without TensorFlow Probability).

  Args:
    probs: The probabilities of 1 (or give `logits`).
    logits: Their logits.
    dtype: The samples' dtype.
    sample_shape: The leading shape of the samples.
    seed: The op seed.

  Returns:
    `sample_shape + probs.shape` samples.

  Example:

  >>> bernoulli_sample(probs=1.0, sample_shape=3).numpy()
  array([1, 1, 1], dtype=int32)
  """
  probs = (tf.sigmoid(logits) if probs is None
           else tf.convert_to_tensor(probs, name="probs"))
  batch_shape = tf.shape(probs)

  def sample_n(n):
    uniform = tf.random.uniform(tf.concat([[n], batch_shape], 0), seed=seed,
                                dtype=probs.dtype)
    return tf.cast(tf.less(uniform, probs), dtype)

  return _call_sampler(sample_n, sample_shape)


def categorical_sample(logits: Any, dtype: Any = tf.int32,
                       sample_shape: Any = (),
                       seed: Optional[int] = None) -> tf.Tensor:
  """Categorical draws from `[..., classes]` logits (Addons' helper).

  Args:
    logits: The logits.
    dtype: The samples' dtype.
    sample_shape: The leading shape of the samples.
    seed: The op seed.

  Returns:
    `sample_shape + logits.shape[:-1]` ids.

  Example:

  >>> categorical_sample([[0., 100.]]).numpy()
  array([1], dtype=int32)
  """
  logits = tf.convert_to_tensor(logits, name="logits")
  event_size = tf.shape(logits)[-1]
  batch_shape = tf.shape(logits)[:-1]

  def sample_n(n):
    logits_2d = (logits if logits.shape.ndims == 2
                 else tf.reshape(logits, [-1, event_size]))
    sample_dtype = tf.int64 if logits.dtype.size > 4 else tf.int32
    draws = tf.random.categorical(logits_2d, n, dtype=sample_dtype, seed=seed)
    draws = tf.reshape(tf.transpose(draws), tf.concat([[n], batch_shape], 0))
    return tf.cast(draws, dtype)

  return _call_sampler(sample_n, sample_shape)
