"""`AttentionWrapper`: a Keras 3 cell adding attention to any Keras cell.

TF Addons' `AttentionWrapper` and `AttentionWrapperState`, for Keras 3.
Its state is Addons' `AttentionWrapperState` (cell_state, attention,
alignments, alignment_history, attention_state). Keras 3's `RNN` (and
`tf_recurrent.RNN`, whose generic engine path packs each step's new state
into the structure of the initial one) carry it as the list
`list(AttentionWrapperState)`, its `cell_state` nested and an empty tuple
for `alignment_history`; `call` takes either form and returns the form it
was given. `alignment_history=True` keeps a `TensorArray` in the state, for
`dynamic_decode`/`BasicDecoder` only (a recurrent layer's state holds
tensors: there, collect the alignments as an output instead).

Teacher-forced training runs it in `tf_recurrent.RNN(AttentionWrapper(...))`:
the engine's generic path runs the wrapper's call on `tf_recurrent.recurrent`,
which keeps only the state per step and recomputes each step (attention
included) in the backward pass.
"""

import collections
import functools
from typing import Any, Callable, List, Optional, Union

import keras
import tensorflow as tf

from tf_recurrent.engine import tracking
from tf_recurrent.op import unconverted
from tf_recurrent.seq2seq import attention as attention_lib
# Addons' module path `seq2seq.attention_wrapper` also held the mechanisms.
from tf_recurrent.seq2seq.attention import AttentionMechanism  # pylint: disable=unused-import
from tf_recurrent.seq2seq.attention import BahdanauAttention  # pylint: disable=unused-import
from tf_recurrent.seq2seq.attention import BahdanauMonotonicAttention  # pylint: disable=unused-import
from tf_recurrent.seq2seq.attention import hardmax  # pylint: disable=unused-import
from tf_recurrent.seq2seq.attention import LuongAttention  # pylint: disable=unused-import
from tf_recurrent.seq2seq.attention import LuongMonotonicAttention  # pylint: disable=unused-import
from tf_recurrent.seq2seq.attention import monotonic_attention  # pylint: disable=unused-import
from tf_recurrent.seq2seq.attention import safe_cumprod  # pylint: disable=unused-import


class AttentionWrapperState(
    collections.namedtuple("AttentionWrapperState",
                           ("cell_state", "attention", "alignments",
                            "alignment_history", "attention_state"))):
  """The state of an `AttentionWrapper`, as Addons'.

  Fields: `cell_state` (the wrapped cell's state), `attention` (the
  previous step's attention output), `alignments` (each mechanism's),
  `alignment_history` (TensorArrays when enabled, else `()`),
  `attention_state` (each mechanism's state).

  Example:

  >>> state = AttentionWrapperState([tf.zeros([1, 2])], tf.zeros([1, 3]),
  ...                               tf.zeros([1, 4]), (), tf.zeros([1, 4]))
  >>> state.clone(attention=tf.ones([1, 3])).attention.shape
  TensorShape([1, 3])
  """

  def clone(self, **kwargs) -> "AttentionWrapperState":
    """A copy with the given fields replaced; their shapes must not change.

    Args:
      **kwargs: Fields to replace.

    Returns:
      The new state.
    """
    def same_shape(old, new):
      if isinstance(old, tf.Tensor) and isinstance(new, tf.Tensor):
        if old.shape.is_fully_defined() and new.shape.is_fully_defined():
          if old.shape != new.shape:
            raise ValueError(
                "The shape of the AttentionWrapperState is expected to be "
                "same as the one to clone. self.shape: "
                f"{old.shape}, input.shape: {new.shape}")
        elif not tf.executing_eagerly():
          check = tf.debugging.assert_equal(tf.shape(new), tf.shape(old))
          with tf.control_dependencies([check]):
            return tf.identity(new)
      return new

    return tf.nest.map_structure(same_shape, self,
                                 super()._replace(**kwargs))


def _compute_attention(attention_mechanism, cell_output, attention_state,
                       attention_layer):
  """One mechanism's attention: (attention, alignments, next state)."""
  alignments, next_attention_state = attention_mechanism(
      [cell_output, attention_state])
  # The context: the alignments' weighted sum of the memory.
  context = tf.squeeze(tf.matmul(tf.expand_dims(alignments, 1),
                                 attention_mechanism.values), [1])
  if attention_layer is not None:
    attention = attention_layer(tf.concat([cell_output, context], 1))
  else:
    attention = context
  return attention, alignments, next_attention_state


def _default_cell_input_fn(inputs, attention):
  return tf.concat([inputs, attention], -1)


def _check_cell(cell):
  if not ("state_size" in dir(cell) and callable(cell)):
    raise TypeError("The argument 'cell' must be an RNN cell (a layer with "
                    f"state_size and call(inputs, states)); got {cell!r}.")


@keras.saving.register_keras_serializable(package="tf_recurrent")
class AttentionWrapper(unconverted.EntryPoint, keras.layers.Layer):
  """Wraps a Keras cell with attention over one or more mechanisms.

  Each step: the cell reads `cell_input_fn(inputs, previous attention)`,
  each mechanism aligns the cell's output with its memory, the context is
  the aligned sum of the memory, and the attention is the context passed
  through an attention layer (`attention_layer_size` or `attention_layer`)
  with the cell's output, or the context itself.

  Keras 3 saving (`model.save("x.keras")`, `keras.models.load_model`)
  needs no `custom_objects`: the config holds the cell, the mechanisms
  (their memory None), the attention layer sizes or layers and the
  options; the build config holds each memory's depth, so a loaded wrapper
  creates its weights before any memory is set up. The memory and
  `initial_cell_state` are tensors, not config: set the memory up in a
  layer's or model's `call` (`mechanism.setup_memory`), which then runs in
  the loaded model too; a wrapper given `initial_cell_state` refuses
  `get_config` (pass the state to the layer's call instead).

  Args:
    cell: A Keras cell.
    attention_mechanism: An `AttentionMechanism` or a list of them.
    attention_layer_size: An int (or one per mechanism): the depth of a
      bias-free Dense attention layer; None: no such layer.
    alignment_history: Whether to keep every step's alignments (a
      TensorArray in the state, for `dynamic_decode`).
    cell_input_fn: `(inputs, attention) -> cell inputs`; by default their
      concatenation.
    output_attention: Whether the output is the attention (Luong style)
      or the cell's output (Bahdanau style).
    initial_cell_state: The cell's initial state, if not its zeros.
    name: The layer's name.
    attention_layer: A layer (or one per mechanism) instead of
      `attention_layer_size`.
    attention_fn: `(mechanism, cell_output, attention_state,
      attention_layer) -> (attention, alignments, next_attention_state)`.
    **kwargs: Keras layer arguments (`dtype`).

  Example:

  >>> import keras
  >>> mechanism = attention_lib.LuongAttention(4, memory=tf.ones([2, 6, 5]))
  >>> cell = AttentionWrapper(keras.layers.LSTMCell(4), mechanism,
  ...                         attention_layer_size=3)
  >>> state = cell.get_initial_state(batch_size=2, dtype=tf.float32)
  >>> output, state = cell(tf.ones([2, 7]), state)
  >>> output.shape, state.alignments.shape
  (TensorShape([2, 3]), TensorShape([2, 6]))
  """

  def __init__(self, cell: keras.layers.Layer,
               attention_mechanism: Union[attention_lib.AttentionMechanism,
                                          List[attention_lib.AttentionMechanism]],
               attention_layer_size: Optional[Union[int, List[int]]] = None,
               alignment_history: bool = False,
               cell_input_fn: Optional[Callable] = None,
               output_attention: bool = True,
               initial_cell_state: Any = None, name: Optional[str] = None,
               attention_layer: Optional[Union[keras.layers.Layer,
                                               List[keras.layers.Layer]]] = None,
               attention_fn: Optional[Callable] = None, **kwargs):
    super().__init__(name=name, **kwargs)
    _check_cell(cell)
    # The arguments as given, for get_config.
    self._config_arguments = {
        "attention_layer_size": (list(attention_layer_size)
                                 if isinstance(attention_layer_size, tuple)
                                 else attention_layer_size),
        "alignment_history": alignment_history,
        "cell_input_fn": cell_input_fn,
        "output_attention": output_attention,
        "attention_fn": attention_fn,
    }
    self._is_multi = isinstance(attention_mechanism, (list, tuple))
    mechanisms = (list(attention_mechanism) if self._is_multi
                  else [attention_mechanism])
    for m in mechanisms:
      if not isinstance(m, attention_lib.AttentionMechanism):
        raise TypeError("attention_mechanism must be an AttentionMechanism "
                        f"or a list of them; got {m!r}.")
    if attention_layer_size is not None and attention_layer is not None:
      raise ValueError(
          "Only one of attention_layer_size and attention_layer should be set")
    if attention_layer_size is not None:
      sizes = tuple(attention_layer_size
                    if isinstance(attention_layer_size, (list, tuple))
                    else (attention_layer_size,))
      if len(sizes) != len(mechanisms):
        raise ValueError(
            "If provided, attention_layer_size must contain exactly one "
            f"integer per attention_mechanism, saw: {len(sizes)} vs "
            f"{len(mechanisms)}")
      layers = [keras.layers.Dense(size, name="attention_layer",
                                   use_bias=False, dtype=kwargs.get("dtype"))
                for size in sizes]
    elif attention_layer is not None:
      layers = list(attention_layer if isinstance(attention_layer,
                                                  (list, tuple))
                    else (attention_layer,))
      if len(layers) != len(mechanisms):
        raise ValueError(
            "If provided, attention_layer must contain exactly one layer per "
            f"attention_mechanism, saw: {len(layers)} vs {len(mechanisms)}")
    else:
      layers = None
    self._attention_layers = layers
    self._attention_fn = attention_fn or _compute_attention
    self._attention_layer_size = None
    self._cell = cell
    self._attention_mechanisms = mechanisms
    # Keras 3 keeps these lists out of tf.train.Checkpoint: tracked here
    # under Addons' paths (`_attention_layers/0/...`).
    tracking.track_list(self, "_attention_layers")
    tracking.track_list(self, "_attention_mechanisms")
    self._cell_input_fn = cell_input_fn or _default_cell_input_fn
    self._output_attention = output_attention
    self._alignment_history = alignment_history
    self._initial_cell_state = None
    if initial_cell_state is not None:
      last = tf.nest.flatten(initial_cell_state)[-1]
      self._check_batch(last.shape[0] or tf.shape(last)[0],
                        f"When constructing AttentionWrapper {self.name}: "
                        "Non-matching batch sizes between the memory (encoder "
                        "output) and initial_cell_state. You may need to tile "
                        "your initial state via the tile_batch function with "
                        "argument multiple=beam_width.")
      self._initial_cell_state = initial_cell_state

  # Checks.

  def _attention_mechanisms_checks(self):
    for mechanism in self._attention_mechanisms:
      if mechanism.has_symbolic_memory and not mechanism.memory_initialized:
        raise ValueError(
            f"The memory of {mechanism.name} is a functional model's symbolic "
            "tensor, which a mechanism queried in that model takes; an "
            "AttentionWrapper's mechanisms need their memory set up before "
            "the wrapper runs: call mechanism.setup_memory(memory) in a "
            "layer's or subclassed model's call (docs/seq2seq.md).")
      if not mechanism.memory_initialized:
        raise ValueError(
            "The AttentionMechanism instances passed to this "
            "AttentionWrapper should be initialized with a memory first, "
            "either by passing it to the AttentionMechanism constructor or "
            "calling attention_mechanism.setup_memory()")

  def _check_batch(self, batch_size, message):
    """Raises on a static mismatch; returns run-time checks otherwise."""
    self._attention_mechanisms_checks()
    checks = []
    for mechanism in self._attention_mechanisms:
      static = (tf.get_static_value(batch_size),
                tf.get_static_value(mechanism.batch_size))
      if None not in static:
        if static[0] != static[1]:
          raise ValueError(f"{message} (batch sizes {static[0]} and "
                           f"{static[1]})")
      else:
        checks.append(tf.debugging.assert_equal(
            batch_size, mechanism.batch_size, message=message))
    return checks

  # Sizes.

  def _memory_depths(self):
    """Each memory's depth: the memory's, or its build config's (a loaded
    wrapper before its memory is set up); None where unknown."""
    return [m._memory_depth for m in self._attention_mechanisms]  # pylint: disable=protected-access

  def _get_attention_layer_size(self):
    if self._attention_layer_size is not None:
      return self._attention_layer_size
    depths = self._memory_depths()
    if None in depths:
      self._attention_mechanisms_checks()
    if self._attention_layers is None:
      self._attention_layer_size = sum(depths)
    else:
      self._attention_layer_size = sum(
          layer.compute_output_shape([None, self._cell_output_size() + d])[-1]
          for layer, d in zip(self._attention_layers, depths))
    return self._attention_layer_size

  def _cell_output_size(self):
    size = getattr(self._cell, "output_size", None)
    if size is None:
      size = tf.nest.flatten(self._cell.state_size)[0]
    return size

  @property
  def attention_mechanisms(self) -> List[attention_lib.AttentionMechanism]:
    """The wrapper's mechanisms, a list (of one for a single mechanism).

    A layer that sets the memory up in its `call` reaches them here (a
    loaded model's wrapper has its own, deserialized ones).

    Example:

    >>> import keras
    >>> mechanism = attention_lib.LuongAttention(4)
    >>> wrapper = AttentionWrapper(keras.layers.LSTMCell(4), mechanism)
    >>> wrapper.attention_mechanisms == [mechanism]
    True
    """
    return list(self._attention_mechanisms)

  def _item_or_tuple(self, seq):
    t = tuple(seq)
    return t if self._is_multi else t[0]

  @property
  def output_size(self):
    if self._output_attention:
      return self._get_attention_layer_size()
    return self._cell_output_size()

  def _attention_size_without_memory(self):
    """The attention's depth when the memory is not set up yet: known from
    the attention layers' units, else None."""
    if self._attention_layers is None:
      return None
    try:
      return sum(layer.compute_output_shape([None, None])[-1]
                 for layer in self._attention_layers)
    except Exception:  # pylint: disable=broad-except
      return None

  @property
  def state_size(self) -> AttentionWrapperState:
    """The sizes in `AttentionWrapperState`'s structure.

    Before the memory is set up (a `tf_recurrent.RNN` or `keras.layers.RNN`
    built before the encoder has run), the sizes that depend on the memory
    are None.
    """
    mechanisms = self._attention_mechanisms
    if not all(m.memory_initialized for m in mechanisms):
      unknown = self._item_or_tuple(None for _ in mechanisms)
      return AttentionWrapperState(
          cell_state=self._cell.state_size,
          attention=self._attention_size_without_memory(),
          alignments=unknown, attention_state=unknown,
          alignment_history=(unknown if self._alignment_history else
                             self._item_or_tuple(() for _ in mechanisms)))
    return AttentionWrapperState(
        cell_state=self._cell.state_size,
        attention=self._get_attention_layer_size(),
        alignments=self._item_or_tuple(m.alignments_size for m in mechanisms),
        attention_state=self._item_or_tuple(m.state_size for m in mechanisms),
        alignment_history=self._item_or_tuple(
            m.alignments_size if self._alignment_history else ()
            for m in mechanisms))

  # Building: Keras's RNN builds its cell before the loop, so that no weight
  # is first created inside the op's traced step.

  def build(self, input_shape):
    input_shape = tf.TensorShape(input_shape)
    depths = self._memory_depths()
    if None in depths:
      return  # Built at the first call, once the memory is there.
    attention_size = self._get_attention_layer_size()
    cell_inputs = self._cell_input_fn(
        tf.zeros([1] + input_shape[1:].as_list(), self.compute_dtype),
        tf.zeros([1, attention_size], self.compute_dtype))
    if not self._cell.built:
      self._cell.build(tuple([input_shape[0]] + cell_inputs.shape[1:].as_list()))
    out = self._cell_output_size()
    if all(m.memory_initialized for m in self._attention_mechanisms):
      self._check_query_depth(out)
    for i, mechanism in enumerate(self._attention_mechanisms):
      if mechanism.memory_initialized:
        # The memory's time (the alignments' size) may be unknown: a shape.
        alignments = mechanism.alignments_size
        if not isinstance(alignments, tf.TensorShape):
          alignments = tf.TensorShape([alignments])
        mechanism.build([tf.TensorShape([input_shape[0], out]),
                         tf.TensorShape([input_shape[0]]).concatenate(
                             alignments)])
      else:
        # A loaded wrapper: its weights exist before its memory does.
        mechanism._build_without_memory(depths[i], out)  # pylint: disable=protected-access
      if self._attention_layers is not None:
        layer = self._attention_layers[i]
        if not layer.built:
          layer.build((input_shape[0], out + depths[i]))

  # Keras 3 saving.

  def get_config(self):
    """The wrapper's arguments, its cell and mechanisms serialized.

    Returns:
      A dict `from_config` takes. The mechanisms' memory is None: it is a
      tensor set up at run time.

    Raises:
      ValueError: `initial_cell_state` was given (a tensor, not config).
    """
    if self._initial_cell_state is not None:
      raise ValueError(
          "initial_cell_state is a tensor, like the memory, and not config: "
          "an AttentionWrapper given one cannot be saved. Pass the initial "
          "state to the recurrent layer's call (initial_state=, e.g. "
          "wrapper.get_initial_state(...).clone(cell_state=...)) instead.")
    serialize = keras.saving.serialize_keras_object
    mechanisms = [serialize(m) for m in self._attention_mechanisms]
    arguments = dict(self._config_arguments)
    for key in ("cell_input_fn", "attention_fn"):
      if arguments[key] is not None:
        arguments[key] = serialize(arguments[key])
    attention_layer = None
    if arguments["attention_layer_size"] is None and self._attention_layers:
      attention_layer = [serialize(layer) for layer in self._attention_layers]
      if not self._is_multi:
        attention_layer = attention_layer[0]
    return {**super().get_config(), **arguments,
            "cell": serialize(self._cell),
            "attention_mechanism": (mechanisms if self._is_multi
                                    else mechanisms[0]),
            "attention_layer": attention_layer}

  @classmethod
  def from_config(cls, config, custom_objects=None):
    """An `AttentionWrapper` from `get_config`'s dict.

    Example:

    >>> import keras
    >>> wrapper = AttentionWrapper(keras.layers.LSTMCell(4),
    ...                            attention_lib.LuongAttention(4),
    ...                            attention_layer_size=3)
    >>> clone = AttentionWrapper.from_config(wrapper.get_config())
    >>> clone.get_config() == wrapper.get_config()
    True
    """
    config = dict(config)
    deserialize = functools.partial(keras.saving.deserialize_keras_object,
                                    custom_objects=custom_objects)
    for key in ("cell", "attention_mechanism", "attention_layer",
                "cell_input_fn", "attention_fn"):
      value = config.get(key)
      if isinstance(value, list):
        config[key] = [deserialize(item) for item in value]
      elif value is not None:
        config[key] = deserialize(value)
    return cls(**config)

  def get_build_config(self):
    """The input shape and each memory's depth (not the memory itself)."""
    config = super().get_build_config()
    if config is not None:
      config = {**config, "memory_depths": self._memory_depths()}
    return config

  def build_from_config(self, config):
    for mechanism, depth in zip(self._attention_mechanisms,
                                (config or {}).get("memory_depths") or []):
      if mechanism._memory_depth is None:  # pylint: disable=protected-access
        mechanism._memory_depth = depth  # pylint: disable=protected-access
    super().build_from_config(config)

  def _check_query_depth(self, depth):
    """A mechanism without a query layer scores the cell's output against
    its keys directly: their depths must agree (say so before any loop)."""
    for mechanism in self._attention_mechanisms:
      keys = mechanism.keys.shape[-1]
      if mechanism.query_layer is None and depth is not None and keys != depth:
        raise ValueError(
            f"attention_mechanism {mechanism.name} has keys of depth {keys} "
            f"(its units) but the cell's output, its query, has depth "
            f"{depth}: set the mechanism's units to {depth}.")

  # The state.

  def _cell_initial_state(self, batch_size, dtype):
    get = getattr(self._cell, "get_initial_state", None)
    if get is not None:
      try:
        state = get(batch_size=batch_size)  # Keras 3's signature.
      except TypeError:
        state = get(batch_size=batch_size, dtype=dtype)
    else:
      state = [tf.zeros([batch_size, size], dtype)
               for size in tf.nest.flatten(self._cell.state_size)]
      if not isinstance(self._cell.state_size, (list, tuple)):
        state = state[0]
    return tf.nest.map_structure(lambda s: tf.cast(s, dtype), state)

  def get_initial_state(self, inputs: Any = None, batch_size: Any = None,
                        dtype: Any = None) -> AttentionWrapperState:
    """The initial `AttentionWrapperState`.

    Args:
      inputs: Optional inputs whose batch size and dtype are used.
      batch_size: The batch size (the memory's).
      dtype: The dtype (the layer's compute dtype by default).

    Returns:
      An `AttentionWrapperState` of zeros (the mechanisms' initial
      alignments and states; `initial_cell_state` if given).
    """
    if inputs is not None:
      inputs = tf.convert_to_tensor(inputs)
      batch_size = tf.shape(inputs)[0]
      dtype = inputs.dtype
    if self._alignment_history and dtype is None:
      # Keras 3's RNN asks for `get_initial_state(batch_size=...)` alone;
      # Addons' TensorArray needs a dtype, and no recurrent layer carries
      # a TensorArray in its state.
      raise ValueError(
          "alignment_history=True keeps a TensorArray in the state, which "
          "only dynamic_decode/BasicDecoder carry (call get_initial_state "
          "with a dtype there); a recurrent layer (keras.layers.RNN, "
          "tf_recurrent.RNN) cannot: return the alignments as outputs instead.")
    dtype = tf.as_dtype(dtype or self.compute_dtype)
    with tf.name_scope(type(self).__name__ + "ZeroState"):
      if self._initial_cell_state is not None:
        cell_state = self._initial_cell_state
      else:
        cell_state = self._cell_initial_state(batch_size, dtype)
      checks = self._check_batch(
          batch_size,
          f"When calling get_initial_state of AttentionWrapper {self.name}: "
          "Non-matching batch sizes between the memory (encoder output) and "
          "the requested batch size. If you use beam search, tile the "
          "encoder output to beam_width via tile_batch, and pass "
          "batch_size * beam_width.")
      with tf.control_dependencies(checks):
        cell_state = tf.nest.map_structure(tf.identity, cell_state)
      alignments = [m.initial_alignments(batch_size, dtype)
                    for m in self._attention_mechanisms]
      return AttentionWrapperState(
          cell_state=cell_state,
          attention=tf.zeros([batch_size, self._get_attention_layer_size()],
                             dtype),
          alignments=self._item_or_tuple(alignments),
          attention_state=self._item_or_tuple(
              m.initial_state(batch_size, dtype)
              for m in self._attention_mechanisms),
          alignment_history=self._item_or_tuple(
              tf.TensorArray(dtype, size=0, dynamic_size=True,
                             element_shape=a.shape)
              if self._alignment_history else () for a in alignments))

  # The step.

  def __call__(self, inputs, states=None, training=None, **kwargs):
    if not any(isinstance(leaf, tf.TensorArray)
               for leaf in tf.nest.flatten(states)):
      return super().__call__(inputs, states, training=training, **kwargs)
    # An alignment history (dynamic_decode's state): Keras 3's __call__
    # takes tensors only, so this does its part itself (build, cast).
    inputs = tf.nest.map_structure(self._autocast, inputs)
    states = tf.nest.map_structure(self._autocast, states)
    if not self.built:
      self.build(tf.nest.flatten(inputs)[0].shape)
    with tf.name_scope(self.name):
      return self.call(inputs, states, training=training)

  def _autocast(self, x):
    if isinstance(x, tf.Tensor) and x.dtype.is_floating and (
        x.dtype != self.compute_dtype):
      return tf.cast(x, self.compute_dtype)
    return x

  def call(self, inputs, state, training=None):
    """One step: `(output, next state)`, the state in the form given."""
    given_list = not isinstance(state, AttentionWrapperState)
    if given_list:
      try:
        state = AttentionWrapperState(*state)
      except TypeError as e:
        raise TypeError(
            "Expected state to be instance of AttentionWrapperState or values "
            "that can construct AttentionWrapperState. Received type "
            f"{type(state)} instead.") from e
    cell_inputs = self._cell_input_fn(inputs, state.attention)
    cell_state = state.cell_state
    kwargs = ({"training": training}
              if getattr(self._cell, "_call_has_training_arg", False) else {})
    cell_output, next_cell_state = self._cell(cell_inputs, cell_state,
                                              **kwargs)
    next_cell_state = tf.nest.pack_sequence_as(
        cell_state, tf.nest.flatten(next_cell_state))
    # A static batch mismatch raises here; an unknown one is left to the
    # matmul with the memory (no assertion in the step, which would keep
    # the op from compiling the step outside XLA).
    self._check_static_batch(cell_output.shape[0])
    if self._is_multi:
      previous_states = state.attention_state
      previous_histories = state.alignment_history
    else:
      previous_states = [state.attention_state]
      previous_histories = [state.alignment_history]
    attentions, alignments, attention_states, histories = [], [], [], []
    for i, mechanism in enumerate(self._attention_mechanisms):
      attention, alignment, next_attention_state = self._attention_fn(
          mechanism, cell_output, previous_states[i],
          self._attention_layers[i] if self._attention_layers else None)
      if self._alignment_history:
        history = previous_histories[i]
        if not isinstance(history, tf.TensorArray):
          raise ValueError(
              "alignment_history=True keeps a TensorArray in the state, "
              "which only dynamic_decode/BasicDecoder carry; a recurrent "
              "layer's state holds tensors.")
        history = history.write(history.size(), alignment)
      else:
        history = ()
      attentions.append(attention)
      alignments.append(alignment)
      attention_states.append(next_attention_state)
      histories.append(history)
    attention = tf.concat(attentions, 1)
    next_state = AttentionWrapperState(
        cell_state=next_cell_state, attention=attention,
        attention_state=self._item_or_tuple(attention_states),
        alignments=self._item_or_tuple(alignments),
        alignment_history=self._item_or_tuple(histories))
    if given_list:
      next_state = list(next_state)
    output = attention if self._output_attention else cell_output
    return output, next_state

  def _check_static_batch(self, batch):
    for mechanism in self._attention_mechanisms:
      memory_batch = tf.get_static_value(mechanism.batch_size)
      if batch is not None and memory_batch is not None and (
          batch != memory_batch):
        raise ValueError(
            f"When applying AttentionWrapper {self.name}: Non-matching batch "
            f"sizes between the memory (encoder output, {memory_batch}) and "
            f"the query (decoder output, {batch}). You may need to tile your "
            "memory input via the tile_batch function with argument "
            "multiple=beam_width.")

