"""Attention mechanisms: TF Addons' `tfa.seq2seq` mechanisms for Keras 3.

`LuongAttention`, `BahdanauAttention` and their monotonic variants keep
Addons' contract: a mechanism is a Keras layer given its `memory` (the
encoder's outputs, `[batch, max_time, depth]`) at construction or later by
`setup_memory` (or a call with `setup_memory=True`), and then queried with
`mechanism([query, state]) -> (alignments, next_state)`. A memory mask
comes from `memory_sequence_length` or a Keras mask (`memory_mask`): masked
memory rows are zeroed and their scores pushed to the dtype's minimum.

A query runs the mechanism's own code directly rather than through
`keras.Layer.__call__`: the query is one step of a recurrent loop (the op's
traced step, `dynamic_decode`'s `tf.while_loop`), and the memory it reads
is a tensor set up outside that step, which Keras 3's call machinery (its
symbolic tracing and autocasting of the inputs only) cannot see.

A memory that is another layer's symbolic output in a functional model
(Addons' `LuongAttention(units, encoder_output)`) is different: a Keras 3
layer cannot hold it, so the mechanism keeps it until it is queried with
symbolic inputs and then passes it to Keras's call as the `memory` keyword
argument. Keras records it as one of the node's inputs (with its Keras mask
as `memory_mask`), so the model's config connects the encoder to the
mechanism, and each run of the model sets the memory up from the encoder's
output before the query.
"""

import functools
import math
from typing import Any, Callable, Optional

import keras
import numpy as np
import tensorflow as tf

from tf_recurrent.op import seeds
from tf_recurrent.op import unconverted


def _as_tensor(value, name):
  return tf.convert_to_tensor(value, name=name)


def _prepare_memory(memory: Any, memory_sequence_length: Any = None,
                    memory_mask: Any = None,
                    check_inner_dims_defined: bool = True) -> tf.Tensor:
  """The memory as a tensor, its masked rows zeroed; checks its shape."""
  if memory_sequence_length is not None and memory_mask is not None:
    raise ValueError("memory_sequence_length and memory_mask can't be "
                     "provided at same time.")
  if isinstance(memory, keras.KerasTensor):
    raise ValueError(
        "memory is a symbolic KerasTensor (another layer's output in a "
        "functional model), which cannot be set up before the model runs: "
        "give it to the mechanism's constructor and query the mechanism in "
        "the functional model (mechanism([query, state]) with symbolic "
        "inputs), or set the memory up in a layer's or subclassed model's "
        "call: mechanism(memory, setup_memory=True), or "
        "mechanism.setup_memory().")
  memory = _as_tensor(memory, "memory")
  if memory.shape.rank is not None and memory.shape.rank < 3:
    # A [time, depth] memory would otherwise be read as a batch of vectors.
    raise ValueError(
        "memory must be a [batch_size, max_time, depth] tensor (with a batch "
        f"dimension); got shape {memory.shape}.")
  if check_inner_dims_defined and not memory.shape[2:].is_fully_defined():
    raise ValueError("Expected memory to have fully defined inner dims, but "
                     f"saw shape: {memory.shape}")
  if memory_sequence_length is None and memory_mask is None:
    return memory
  if memory_sequence_length is not None:
    lengths = _as_tensor(memory_sequence_length, "memory_sequence_length")
    if lengths.shape.rank != 1:
      raise ValueError("memory_sequence_length must be a [batch_size] vector; "
                       f"got shape {lengths.shape}.")
    if (lengths.shape[0] is not None and memory.shape[0] is not None and
        lengths.shape[0] != memory.shape[0]):
      raise ValueError(
          f"memory_sequence_length has {lengths.shape[0]} entries but the "
          f"memory's batch size is {memory.shape[0]} (memory shape "
          f"{memory.shape}).")
    mask = tf.sequence_mask(lengths, maxlen=tf.shape(memory)[1],
                            dtype=memory.dtype)
  else:
    mask = tf.cast(memory_mask, memory.dtype)
  extra = tf.ones([tf.rank(memory) - 2], tf.int32)
  return memory * tf.reshape(mask, tf.concat([tf.shape(mask), extra], 0))


def _symbolic(structure: Any) -> bool:
  """Whether `structure` holds a KerasTensor (a functional model's)."""
  return any(isinstance(x, keras.KerasTensor)
             for x in tf.nest.flatten(structure))


@unconverted.entry_point
def hardmax(logits: Any, name: Optional[str] = None) -> tf.Tensor:
  """One-hot of the argmax along the last axis.

  Args:
    logits: A `[batch, classes]` tensor (any rank).
    name: An optional name scope.

  Returns:
    A tensor like `logits`, 1 at each row's largest entry, else 0.

  Example:

  >>> hardmax([[0.1, 0.7, 0.2]]).numpy()
  array([[0., 1., 0.]], dtype=float32)
  """
  with tf.name_scope(name or "Hardmax"):
    logits = _as_tensor(logits, "logits")
    depth = logits.shape[-1] or tf.shape(logits)[-1]
    return tf.one_hot(tf.argmax(logits, -1), depth, dtype=logits.dtype)


@unconverted.entry_point
def safe_cumprod(x: Any, *args, **kwargs) -> tf.Tensor:
  """`tf.math.cumprod` as the exp of a cumsum of logs, clipped above 0.

  A product of many probabilities underflows; summing logs keeps it, and
  the clip keeps log(0) out of the gradient. Extra arguments go to
  `tf.cumsum` (`axis`, `exclusive`, `reverse`).

  Args:
    x: A tensor of values in (0, 1].
    *args: Passed to `tf.cumsum`.
    **kwargs: Passed to `tf.cumsum`.

  Returns:
    The cumulative product of `x`.

  Example:

  >>> safe_cumprod([[0.5, 0.5, 0.5]], axis=1).numpy().round(3)
  array([[0.5  , 0.25 , 0.125]], dtype=float32)
  """
  with tf.name_scope("SafeCumprod"):
    x = _as_tensor(x, "x")
    tiny = np.finfo(x.dtype.as_numpy_dtype).tiny
    return tf.exp(tf.cumsum(tf.math.log(tf.clip_by_value(x, tiny, 1)), *args,
                            **kwargs))


@unconverted.entry_point
def monotonic_attention(p_choose_i: Any, previous_attention: Any,
                        mode: str) -> tf.Tensor:
  """The expected monotonic alignment (Raffel et al. 2017).

  Args:
    p_choose_i: `[batch, max_time]` probabilities of stopping at each
      memory entry.
    previous_attention: `[batch, max_time]` alignments of the previous
      step (one-hot at 0 to start).
    mode: "recursive" (a `tf.scan`, exact, slow), "parallel" (cumulative
      products, exact up to their clipping) or "hard" (0/1 `p_choose_i`).

  Returns:
    The `[batch, max_time]` alignments.

  Example:

  >>> monotonic_attention([[0.5, 0.5, 0.5]], [[1.0, 0.0, 0.0]],
  ...                     "parallel").numpy().round(3)
  array([[0.5  , 0.25 , 0.125]], dtype=float32)
  """
  p_choose_i = _as_tensor(p_choose_i, "p_choose_i")
  previous_attention = _as_tensor(previous_attention, "previous_attention")
  if mode == "recursive":
    batch_size = p_choose_i.shape[0] or tf.shape(p_choose_i)[0]
    shifted = tf.concat([tf.ones([batch_size, 1], p_choose_i.dtype),
                         1 - p_choose_i[:, :-1]], 1)
    # q_i = (1 - p_{i-1}) q_{i-1} + a_i: one scan over memory positions.
    q = tf.scan(lambda x, yz: tf.reshape(yz[0] * x + yz[1], [batch_size]),
                [tf.transpose(shifted), tf.transpose(previous_attention)],
                tf.zeros([batch_size], p_choose_i.dtype))
    return p_choose_i * tf.transpose(q)
  if mode == "parallel":
    cumprod = safe_cumprod(1 - p_choose_i, axis=1, exclusive=True)
    # The clip keeps the division finite where the product underflowed.
    return p_choose_i * cumprod * tf.cumsum(
        previous_attention / tf.clip_by_value(cumprod, 1e-10, 1.0), axis=1)
  if mode == "hard":
    p_choose_i *= tf.cumsum(previous_attention, axis=1)
    return p_choose_i * tf.math.cumprod(1 - p_choose_i, axis=1,
                                        exclusive=True)
  raise ValueError("mode must be 'recursive', 'parallel', or 'hard'.")


def _monotonic_probability_fn(score, previous_alignments, sigmoid_noise, mode,
                              seed=None):
  if sigmoid_noise > 0:
    if seeds.in_step():
      # A step on the op is recomputed in its backward pass, which must
      # draw the same noise: a stateless draw from the step's own seed
      # (and the user's, folded in).
      step_seed = seeds.step_seed()
      if seed is not None:
        step_seed = tf.random.experimental.stateless_fold_in(step_seed, seed)
      noise = tf.random.stateless_normal(tf.shape(score), seed=step_seed,
                                         dtype=score.dtype)
    else:
      noise = tf.random.normal(tf.shape(score), dtype=score.dtype, seed=seed)
    score += sigmoid_noise * noise
  if mode == "hard":
    p_choose_i = tf.cast(score > 0, score.dtype)
  else:
    p_choose_i = tf.sigmoid(score)
  return monotonic_attention(p_choose_i, previous_alignments, mode)


_PROBABILITY_FNS = {"softmax": tf.nn.softmax, "hardmax": hardmax}


def _probability_fn(name: str) -> Callable:
  if name not in _PROBABILITY_FNS:
    raise ValueError(f"Invalid probability function: {name}, options are "
                     f"{list(_PROBABILITY_FNS)}")
  fn = _PROBABILITY_FNS[name]
  return lambda score, _: fn(score)


def _dense(units, name, dtype):
  return keras.layers.Dense(units, name=name, use_bias=False, dtype=dtype)


def _serialize_layer(layer):
  # Keras's form without the build state, so that a mechanism's config
  # equals the config of its clone (built or not).
  config = keras.saving.serialize_keras_object(layer)
  config.pop("build_config", None)
  return config


class AttentionMechanism(unconverted.EntryPoint, keras.layers.Layer):
  """The base of the mechanisms: memory setup, masking, queries.

  Subclasses implement `_calculate_attention(query, state)` and create
  their weights in `_build_scoring()`.

  Args:
    memory: The encoder's outputs `[batch, max_time, depth]`, or None to
      give it later with `setup_memory`.
    probability_fn: `(score, previous_state) -> alignments`.
    query_layer: A layer projecting the query, or None.
    memory_layer: A layer projecting the memory into keys, or None (keys
      are the memory).
    memory_sequence_length: Optional `[batch]` lengths of the memory.
    **kwargs: Keras layer arguments (`name`, `dtype`).

  Example (a mechanism built first, its memory set up later, as in a
  model's call):

  >>> mechanism = LuongAttention(3)
  >>> isinstance(mechanism, AttentionMechanism), mechanism.memory_initialized
  (True, False)
  >>> values = mechanism(tf.ones([2, 4, 3]), setup_memory=True,
  ...                    mask=tf.sequence_mask([4, 1], 4))
  >>> values.numpy()[1, :, 0]
  array([1., 0., 0., 0.], dtype=float32)
  >>> alignments, _ = mechanism([tf.ones([2, 3]), None])
  >>> alignments.numpy()[1]
  array([1., 0., 0., 0.], dtype=float32)
  """

  def __init__(self, memory: Any, probability_fn: Callable,
               query_layer: Optional[keras.layers.Layer] = None,
               memory_layer: Optional[keras.layers.Layer] = None,
               memory_sequence_length: Any = None, **kwargs):
    super().__init__(**kwargs)
    self.query_layer = query_layer
    self.memory_layer = memory_layer
    self.default_probability_fn = probability_fn
    self.probability_fn = probability_fn
    self.keys = None
    self.values = None
    self.batch_size = None
    self._alignments_size = None
    self._score_mask = None
    self._memory_initialized = False
    # The memory's depth and the query's: what the weights' shapes depend
    # on, kept (unlike the memory) in the build config, so that a loaded
    # mechanism creates its weights before any memory is set up.
    self._memory_depth = None
    self._query_depth = None
    self._check_inner_dims_defined = True
    self._scoring_built = False
    self.supports_masking = True
    # A functional model's symbolic memory (and lengths), passed to Keras's
    # call when the mechanism is queried there (the module docstring).
    self._symbolic_memory = None
    if memory is not None:
      if _symbolic([memory, memory_sequence_length]):
        self._symbolic_memory = (memory, memory_sequence_length)
        self._memory_depth = memory.shape[-1]
      else:
        self.setup_memory(memory, memory_sequence_length)

  @property
  def memory_initialized(self) -> bool:
    """Whether a memory has been set up."""
    return self._memory_initialized

  @property
  def has_symbolic_memory(self) -> bool:
    """Whether the mechanism was given a functional model's symbolic memory.

    Such a memory is taken when the mechanism is queried inside that model;
    an `AttentionWrapper` needs `setup_memory` called with real tensors.

    >>> import numpy as np
    >>> mechanism = LuongAttention(3, memory=np.ones([2, 4, 3], "float32"))
    >>> mechanism.has_symbolic_memory, mechanism.memory_initialized
    (False, True)
    """
    return self._symbolic_memory is not None

  def build(self, input_shape):
    # Keras 3 locks a built layer's state; this build runs twice (memory
    # shape, then query shapes), so it reopens it.
    self._tracker.unlock()
    if not self._memory_initialized:
      if self.memory_layer is not None and not self.memory_layer.built:
        shape = input_shape[0] if isinstance(input_shape, list) else input_shape
        self.memory_layer.build(tuple(shape))
      return
    self._query_depth = tf.TensorShape(input_shape[0])[-1]
    if self.query_layer is not None and not self.query_layer.built:
      self.query_layer.build(tuple(input_shape[0]))
    if not self._scoring_built:
      self._build_scoring()
      self._scoring_built = True

  def _build_without_memory(self, memory_depth: int,
                            query_depth: Optional[int]) -> None:
    """Creates the weights from the depths alone (no memory set up yet):
    a loaded model's mechanisms, before their memory comes at its call."""
    self._tracker.unlock()
    self._memory_depth = memory_depth
    if self.memory_layer is not None and not self.memory_layer.built:
      self.memory_layer.build((None, None, memory_depth))
    if query_depth is not None:
      self._query_depth = query_depth
      if self.query_layer is not None and not self.query_layer.built:
        self.query_layer.build((None, query_depth))
      if not self._scoring_built:
        self._build_scoring()
        self._scoring_built = True
    self.built = True
    self._lock_state()

  def get_build_config(self):
    """The depths the weights' shapes depend on (the memory is not config)."""
    if self._memory_depth is None:
      return None
    return {"memory_depth": self._memory_depth,
            "query_depth": self._query_depth}

  def build_from_config(self, config):
    if config and config.get("memory_depth") is not None:
      self._build_without_memory(config["memory_depth"],
                                 config.get("query_depth"))

  def _build_scoring(self):
    """Creates the mechanism's own weights."""

  def _weight(self, variable, dtype):
    # The query bypasses Keras's autocasting (module docstring).
    return tf.cast(tf.convert_to_tensor(variable), dtype)

  def __call__(self, inputs, mask=None, setup_memory=False, memory=None,
               memory_sequence_length=None, **kwargs):
    """`setup_memory=True`: sets up `inputs` (memory or [memory, lengths])
    as the memory; else queries with `inputs = [query, state]` (after
    setting up `memory`, with its lengths, where given)."""
    del kwargs
    if (memory is None and self._symbolic_memory is not None and
        not setup_memory and _symbolic(inputs)):
      memory, memory_sequence_length = self._symbolic_memory
    if memory is not None:
      return self._call_with_memory(inputs, memory, memory_sequence_length)
    if setup_memory:
      if isinstance(inputs, (list, tuple)):
        if len(inputs) not in (1, 2):
          raise ValueError("Expect inputs to have 1 or 2 tensors, got "
                           f"{len(inputs)}")
        memory = inputs[0]
        lengths = inputs[1] if len(inputs) == 2 else None
      else:
        memory, lengths = inputs, None
      self.setup_memory(memory, lengths, mask)
      return self.values
    if not self._memory_initialized:
      if self._symbolic_memory is not None:
        raise ValueError(
            f"{self.name}'s memory is a functional model's symbolic tensor: "
            "query the mechanism with that model's symbolic inputs (the "
            "model then sets the memory up at each run), or set a memory up "
            "(setup_memory).")
      raise ValueError("Cannot query the attention before the setup of memory")
    if not isinstance(inputs, (list, tuple)) or len(inputs) not in (2, 3):
      raise ValueError("Expect the inputs to have query, state, and optional "
                       "processed memory")
    query = _as_tensor(inputs[0], "query")
    if query.dtype.is_floating and query.dtype != self.compute_dtype:
      query = tf.cast(query, self.compute_dtype)
    state = inputs[1]
    if not self._scoring_built:
      self.build([query.shape, None if state is None else
                  tf.TensorShape(np.shape(state))])
    with tf.name_scope(self.name):
      return self._calculate_attention(query, state)

  def _call_with_memory(self, inputs, memory, memory_sequence_length):
    """A query given its memory: through Keras's call, which records the
    memory as an input of a functional model's node and passes its Keras
    mask as `memory_mask`."""
    if not isinstance(inputs, (list, tuple)) or len(inputs) not in (2, 3):
      raise ValueError("Expect the inputs to have query, state, and optional "
                       "processed memory")
    if not self.built:
      query_depth = inputs[0].shape[-1]
      self._build_without_memory(memory.shape[-1], query_depth)
    memory_kwargs = {"memory": memory}
    if memory_sequence_length is not None:
      memory_kwargs["memory_sequence_length"] = memory_sequence_length
    if not _symbolic([inputs, memory_kwargs]):
      return super().__call__(list(inputs), **memory_kwargs)
    # A symbolic call runs `call` on placeholders: keep the memory set up
    # before it, not theirs.
    kept = self._memory_setup()
    try:
      return super().__call__(list(inputs), **memory_kwargs)
    finally:
      self._set_memory_setup(kept)

  _MEMORY_SETUP = ("values", "keys", "batch_size", "_alignments_size",
                   "_score_mask", "_memory_initialized")

  def _memory_setup(self):
    return {name: getattr(self, name) for name in self._MEMORY_SETUP}

  def _set_memory_setup(self, setup):
    for name, value in setup.items():
      setattr(self, name, value)

  def call(self, inputs, mask=None, setup_memory=False, memory=None,  # pylint: disable=arguments-differ
           memory_sequence_length=None, memory_mask=None):
    if memory is not None:
      # Keras passes the memory's Keras mask; explicit lengths win.
      self.setup_memory(memory, memory_sequence_length,
                        None if memory_sequence_length is not None
                        else memory_mask)
    return self(inputs, mask=mask, setup_memory=setup_memory)

  def setup_memory(self, memory: Any, memory_sequence_length: Any = None,
                   memory_mask: Any = None) -> None:
    """Sets (or replaces) the memory the mechanism attends over.

    Args:
      memory: `[batch, max_time, depth]` encoder outputs.
      memory_sequence_length: Optional `[batch]` lengths.
      memory_mask: Optional `[batch, max_time]` bool mask (a Keras mask);
        not with `memory_sequence_length`.
    """
    if memory_sequence_length is not None and memory_mask is not None:
      raise ValueError("memory_sequence_length and memory_mask cannot be "
                       "used at same time for attention.")
    with tf.name_scope(self.name or "BaseAttentionMechanismInit"):
      values = _prepare_memory(
          memory, memory_sequence_length=memory_sequence_length,
          memory_mask=memory_mask,
          check_inner_dims_defined=self._check_inner_dims_defined)
      if values.dtype.is_floating and values.dtype != self.compute_dtype:
        values = tf.cast(values, self.compute_dtype)
      self.values = values
      self._memory_depth = values.shape[-1]
      if self.memory_layer is not None:
        if not self.memory_layer.built:
          self.build(values.shape)
        self.keys = self.memory_layer(values)
      else:
        self.keys = values
      self.batch_size = self.keys.shape[0] or tf.shape(self.keys)[0]
      self._alignments_size = self.keys.shape[1] or tf.shape(self.keys)[1]
      if memory_sequence_length is not None:
        lengths = _as_tensor(memory_sequence_length, "memory_sequence_length")
        check = tf.debugging.assert_positive(
            lengths,
            message="All values in memory_sequence_length must greater than "
            "zero.")
        with tf.control_dependencies([check]):
          self._score_mask = tf.sequence_mask(lengths,
                                              maxlen=tf.shape(self.keys)[1])
      elif memory_mask is not None:
        self._score_mask = tf.cast(memory_mask, tf.bool)
      else:
        self._score_mask = None
    self._memory_initialized = True

  def _probabilities(self, score, state):
    """The probability function on the score, masked entries at -inf."""
    if self._score_mask is not None:
      score = tf.where(self._score_mask, score,
                       tf.fill(tf.shape(score),
                               tf.constant(score.dtype.min, score.dtype)))
    return self.probability_fn(score, state)

  def _calculate_attention(self, query, state):
    raise NotImplementedError(
        "_calculate_attention need to be implemented by subclasses.")

  def compute_mask(self, inputs, mask=None):
    return None, None

  def get_config(self):
    config = {"memory": None}
    if self.query_layer is not None:
      config["query_layer"] = _serialize_layer(self.query_layer)
    if self.memory_layer is not None:
      config["memory_layer"] = _serialize_layer(self.memory_layer)
    return {**super().get_config(), **config}

  @classmethod
  def deserialize_inner_layer_from_config(cls, config, custom_objects):
    """The config with its query and memory layers deserialized."""
    config = dict(config)
    for key in ("query_layer", "memory_layer"):
      layer_config = config.pop(key, None)
      if layer_config:
        config[key] = keras.layers.deserialize(layer_config,
                                               custom_objects=custom_objects)
    return config

  @classmethod
  def from_config(cls, config, custom_objects=None):
    return cls(**cls.deserialize_inner_layer_from_config(config,
                                                         custom_objects))

  @property
  def alignments_size(self):
    if isinstance(self._alignments_size, int):
      return self._alignments_size
    return tf.TensorShape([None])

  @property
  def state_size(self):
    return self.alignments_size

  def initial_alignments(self, batch_size: Any, dtype: Any) -> tf.Tensor:
    """Zeros `[batch_size, max_time]`: the alignments before step 0."""
    return tf.zeros([batch_size, self._alignments_size], dtype=dtype)

  def initial_state(self, batch_size: Any, dtype: Any) -> tf.Tensor:
    """The mechanism's state before step 0 (its initial alignments)."""
    return self.initial_alignments(batch_size, dtype)


def _luong_score(query, keys, scale):
  depth, key_units = query.shape[-1], keys.shape[-1]
  if depth != key_units:
    raise ValueError(
        "Incompatible or unknown inner dimensions between query and keys. "
        f"Query has units: {depth}.  Keys have units: {key_units}.  Perhaps "
        f"you need to set num_units to the keys' dimension ({key_units})?")
  score = tf.squeeze(tf.matmul(tf.expand_dims(query, 1), keys,
                               transpose_b=True), [1])
  return score if scale is None else scale * score


def _bahdanau_score(processed_query, keys, attention_v, attention_g=None,
                    attention_b=None):
  if processed_query.shape[-1] != keys.shape[-1]:
    raise ValueError(
        f"The processed query's depth ({processed_query.shape[-1]}) must equal "
        f"the keys' depth ({keys.shape[-1]}): give the query_layer and the "
        "memory_layer the same number of units.")
  processed_query = tf.expand_dims(processed_query, 1)
  if attention_g is not None and attention_b is not None:
    normed_v = attention_g * attention_v * tf.math.rsqrt(
        tf.reduce_sum(tf.square(attention_v)))
    return tf.reduce_sum(normed_v * tf.tanh(keys + processed_query +
                                            attention_b), [2])
  return tf.reduce_sum(attention_v * tf.tanh(keys + processed_query), [2])


@keras.saving.register_keras_serializable(package="tf_recurrent")
class LuongAttention(AttentionMechanism):
  """Luong's multiplicative attention (Luong et al. 2015), as Addons'.

  score = query . keys (times a learned scalar `g` with `scale=True`);
  the keys are the memory projected to `units` without bias, so `units`
  must equal the query's depth.

  Args:
    units: The depth of the keys (the query's depth).
    memory: Optional `[batch, max_time, depth]` memory.
    memory_sequence_length: Optional `[batch]` memory lengths.
    scale: Whether to scale the score by a learned scalar.
    probability_fn: "softmax" or "hardmax".
    dtype: The layer's dtype.
    name: The layer's name.
    **kwargs: `memory_layer`, and Keras layer arguments.

  Example:

  >>> attention = LuongAttention(4, memory=tf.ones([2, 5, 3]),
  ...                            memory_sequence_length=[5, 2])
  >>> alignments, _ = attention([tf.ones([2, 4]), None])
  >>> alignments.numpy()[1].round(2)
  array([0.5, 0.5, 0. , 0. , 0. ], dtype=float32)
  """

  def __init__(self, units: int, memory: Any = None,
               memory_sequence_length: Any = None, scale: bool = False,
               probability_fn: str = "softmax", dtype: Any = None,
               name: str = "LuongAttention", **kwargs):
    self.probability_fn_name = probability_fn
    memory_layer = kwargs.pop("memory_layer", None) or _dense(
        units, "memory_layer", dtype)
    self.units = units
    self.scale = scale
    self.scale_weight = None
    super().__init__(memory=memory,
                     memory_sequence_length=memory_sequence_length,
                     query_layer=None, memory_layer=memory_layer,
                     probability_fn=_probability_fn(probability_fn),
                     name=name, dtype=dtype, **kwargs)

  def _build_scoring(self):
    if self.scale and self.scale_weight is None:
      self.scale_weight = self.add_weight(name="attention_g", shape=(),
                                          initializer="ones")

  def _calculate_attention(self, query, state):
    scale = (None if self.scale_weight is None else
             self._weight(self.scale_weight, query.dtype))
    alignments = self._probabilities(_luong_score(query, self.keys, scale),
                                     state)
    return alignments, alignments

  def get_config(self):
    return {**super().get_config(), "units": self.units, "scale": self.scale,
            "probability_fn": self.probability_fn_name}


class _BahdanauWeights:
  """Bahdanau's v (and, normalized, g and b) weights."""

  def _bahdanau_init(self, units, normalize, kernel_initializer, dtype,
                     kwargs):
    """Sets the arguments; returns the (given or new) query and memory
    layers, popped from `kwargs`."""
    self.units = units
    self.normalize = normalize
    self.kernel_initializer = keras.initializers.get(kernel_initializer)
    self.attention_v = self.attention_g = self.attention_b = None
    return (kwargs.pop("query_layer", None) or _dense(units, "query_layer",
                                                      dtype),
            kwargs.pop("memory_layer", None) or _dense(units, "memory_layer",
                                                       dtype))

  def _build_bahdanau(self):
    if self.attention_v is None:
      self.attention_v = self.add_weight(
          name="attention_v", shape=[self.units],
          initializer=self.kernel_initializer)
    if self.normalize and self.attention_g is None:
      self.attention_g = self.add_weight(
          name="attention_g", shape=(),
          initializer=keras.initializers.Constant(math.sqrt(1.0 / self.units)))
      self.attention_b = self.add_weight(name="attention_b",
                                         shape=[self.units],
                                         initializer="zeros")

  def _bahdanau(self, query):
    processed = self.query_layer(query) if self.query_layer else query
    dtype = processed.dtype
    g = b = None
    if self.attention_g is not None:
      g = self._weight(self.attention_g, dtype)
      b = self._weight(self.attention_b, dtype)
    return _bahdanau_score(processed, self.keys,
                           self._weight(self.attention_v, dtype), g, b)


@keras.saving.register_keras_serializable(package="tf_recurrent")
class BahdanauAttention(_BahdanauWeights, AttentionMechanism):
  """Bahdanau's additive attention (Bahdanau et al. 2015), as Addons'.

  score = v . tanh(W_q query + W_m memory); with `normalize=True` weight
  normalization (Salimans & Kingma 2016): v is replaced by g v / |v| and a
  bias is added inside the tanh.

  Args:
    units: The depth of the projected query and memory.
    memory: Optional `[batch, max_time, depth]` memory.
    memory_sequence_length: Optional `[batch]` memory lengths.
    normalize: Whether to weight-normalize.
    probability_fn: "softmax" or "hardmax".
    kernel_initializer: The initializer of v.
    dtype: The layer's dtype.
    name: The layer's name.
    **kwargs: `query_layer`, `memory_layer`, and Keras layer arguments.

  Example:

  >>> attention = BahdanauAttention(4, memory=tf.ones([2, 5, 3]))
  >>> alignments, state = attention([tf.ones([2, 6]), None])
  >>> alignments.shape
  TensorShape([2, 5])
  """

  def __init__(self, units: int, memory: Any = None,
               memory_sequence_length: Any = None, normalize: bool = False,
               probability_fn: str = "softmax",
               kernel_initializer: Any = "glorot_uniform", dtype: Any = None,
               name: str = "BahdanauAttention", **kwargs):
    self.probability_fn_name = probability_fn
    query_layer, memory_layer = self._bahdanau_init(
        units, normalize, kernel_initializer, dtype, kwargs)
    super().__init__(memory=memory,
                     memory_sequence_length=memory_sequence_length,
                     query_layer=query_layer, memory_layer=memory_layer,
                     probability_fn=_probability_fn(probability_fn),
                     name=name, dtype=dtype, **kwargs)

  def _build_scoring(self):
    self._build_bahdanau()

  def _calculate_attention(self, query, state):
    alignments = self._probabilities(self._bahdanau(query), state)
    return alignments, alignments

  def get_config(self):
    return {**super().get_config(), "units": self.units,
            "normalize": self.normalize,
            "probability_fn": self.probability_fn_name,
            "kernel_initializer": keras.initializers.serialize(
                self.kernel_initializer)}


class _BaseMonotonicAttentionMechanism(AttentionMechanism):
  """Monotonic mechanisms start attending at the memory's first entry."""

  def initial_alignments(self, batch_size, dtype):
    return tf.one_hot(tf.zeros([batch_size], tf.int32), self._alignments_size,
                      dtype=dtype)

  def _monotonic_init(self, sigmoid_noise, sigmoid_noise_seed,
                      score_bias_init, mode):
    self.sigmoid_noise = sigmoid_noise
    self.sigmoid_noise_seed = sigmoid_noise_seed
    self.score_bias_init = score_bias_init
    self.mode = mode
    self.attention_score_bias = None
    return functools.partial(_monotonic_probability_fn,
                             sigmoid_noise=sigmoid_noise, mode=mode,
                             seed=sigmoid_noise_seed)

  def _build_score_bias(self):
    if self.attention_score_bias is None:
      self.attention_score_bias = self.add_weight(
          name="attention_score_bias", shape=(),
          initializer=keras.initializers.Constant(self.score_bias_init))

  def _monotonic_config(self):
    return {"sigmoid_noise": self.sigmoid_noise,
            "sigmoid_noise_seed": self.sigmoid_noise_seed,
            "score_bias_init": self.score_bias_init, "mode": self.mode}


@keras.saving.register_keras_serializable(package="tf_recurrent")
class BahdanauMonotonicAttention(_BahdanauWeights,
                                 _BaseMonotonicAttentionMechanism):
  """Monotonic attention with Bahdanau's score (Raffel et al. 2017).

  Args:
    units: The depth of the projected query and memory.
    memory: Optional `[batch, max_time, depth]` memory.
    memory_sequence_length: Optional `[batch]` memory lengths.
    normalize: Whether to weight-normalize the score.
    sigmoid_noise: The stddev of the noise added to the score before the
      sigmoid (0: none). On the op (`tf_recurrent.RNN`, a teacher-forced
      `BasicDecoder`) it is drawn statelessly from `tf_recurrent.step_seed()`,
      so the backward pass's recompute of a step sees the same noise.
    sigmoid_noise_seed: The noise's seed (on the op, folded into the step's).
    score_bias_init: The score bias's initial value.
    mode: "parallel", "recursive" or "hard" (`monotonic_attention`).
    kernel_initializer: The initializer of v.
    dtype: The layer's dtype.
    name: The layer's name.
    **kwargs: `query_layer`, `memory_layer`, and Keras layer arguments.

  Example:

  >>> attention = BahdanauMonotonicAttention(4, memory=tf.ones([2, 5, 3]))
  >>> state = attention.initial_state(2, tf.float32)
  >>> alignments, _ = attention([tf.ones([2, 6]), state])
  >>> alignments.shape
  TensorShape([2, 5])
  """

  def __init__(self, units: int, memory: Any = None,
               memory_sequence_length: Any = None, normalize: bool = False,
               sigmoid_noise: float = 0.0,
               sigmoid_noise_seed: Optional[int] = None,
               score_bias_init: float = 0.0, mode: str = "parallel",
               kernel_initializer: Any = "glorot_uniform", dtype: Any = None,
               name: str = "BahdanauMonotonicAttention", **kwargs):
    probability_fn = self._monotonic_init(sigmoid_noise, sigmoid_noise_seed,
                                          score_bias_init, mode)
    query_layer, memory_layer = self._bahdanau_init(
        units, normalize, kernel_initializer, dtype, kwargs)
    super().__init__(memory=memory,
                     memory_sequence_length=memory_sequence_length,
                     query_layer=query_layer, memory_layer=memory_layer,
                     probability_fn=probability_fn, name=name, dtype=dtype,
                     **kwargs)

  def _build_scoring(self):
    self._build_bahdanau()
    self._build_score_bias()

  def _calculate_attention(self, query, state):
    score = self._bahdanau(query)
    score += self._weight(self.attention_score_bias, score.dtype)
    alignments = self._probabilities(score, state)
    return alignments, alignments

  def get_config(self):
    return {**super().get_config(), "units": self.units,
            "normalize": self.normalize, **self._monotonic_config(),
            "kernel_initializer": keras.initializers.serialize(
                self.kernel_initializer)}


@keras.saving.register_keras_serializable(package="tf_recurrent")
class LuongMonotonicAttention(_BaseMonotonicAttentionMechanism):
  """Monotonic attention with Luong's score (Raffel et al. 2017).

  Args:
    units: The depth of the keys (the query's depth).
    memory: Optional `[batch, max_time, depth]` memory.
    memory_sequence_length: Optional `[batch]` memory lengths.
    scale: Whether to scale the score by a learned scalar.
    sigmoid_noise: The stddev of the noise added to the score before the
      sigmoid (0: none). On the op (`tf_recurrent.RNN`, a teacher-forced
      `BasicDecoder`) it is drawn statelessly from `tf_recurrent.step_seed()`,
      so the backward pass's recompute of a step sees the same noise.
    sigmoid_noise_seed: The noise's seed (on the op, folded into the step's).
    score_bias_init: The score bias's initial value.
    mode: "parallel", "recursive" or "hard" (`monotonic_attention`).
    dtype: The layer's dtype.
    name: The layer's name.
    **kwargs: `memory_layer`, and Keras layer arguments.

  Example:

  >>> attention = LuongMonotonicAttention(4, memory=tf.ones([2, 5, 3]))
  >>> state = attention.initial_state(2, tf.float32)
  >>> alignments, _ = attention([tf.ones([2, 4]), state])
  >>> alignments.shape
  TensorShape([2, 5])
  """

  def __init__(self, units: int, memory: Any = None,
               memory_sequence_length: Any = None, scale: bool = False,
               sigmoid_noise: float = 0.0,
               sigmoid_noise_seed: Optional[int] = None,
               score_bias_init: float = 0.0, mode: str = "parallel",
               dtype: Any = None, name: str = "LuongMonotonicAttention",
               **kwargs):
    probability_fn = self._monotonic_init(sigmoid_noise, sigmoid_noise_seed,
                                          score_bias_init, mode)
    memory_layer = kwargs.pop("memory_layer", None) or _dense(
        units, "memory_layer", dtype)
    self.units = units
    self.scale = scale
    self.attention_g = None
    super().__init__(memory=memory,
                     memory_sequence_length=memory_sequence_length,
                     query_layer=None, memory_layer=memory_layer,
                     probability_fn=probability_fn, name=name, dtype=dtype,
                     **kwargs)

  def _build_scoring(self):
    if self.scale and self.attention_g is None:
      self.attention_g = self.add_weight(name="attention_g", shape=(),
                                         initializer="ones")
    self._build_score_bias()

  def _calculate_attention(self, query, state):
    scale = (None if self.attention_g is None else
             self._weight(self.attention_g, query.dtype))
    score = _luong_score(query, self.keys, scale)
    score += self._weight(self.attention_score_bias, score.dtype)
    alignments = self._probabilities(score, state)
    return alignments, alignments

  def get_config(self):
    return {**super().get_config(), "units": self.units, "scale": self.scale,
            **self._monotonic_config()}
