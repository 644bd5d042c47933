"""TF1's functional RNNs on the op: `dynamic_rnn`, `bidirectional_dynamic_rnn`,
`raw_rnn`.

The signatures, return values and semantics of `tf.compat.v1.nn`'s functions
of the same names, for Keras 3 cells (`keras.layers.LSTMCell`, `GRUCell`,
`SimpleRNNCell`, `StackedRNNCells`, a user's layer with `state_size` and
`call`) and for objects following the RNNCell protocol (`state_size`,
`output_size`, `__call__(inputs, state) -> (output, new_state)`, and
`zero_state` or `get_initial_state`; tf_keras's legacy cells are such
objects). Their backward pass keeps only the per-step states:

* a plain `keras.layers.LSTMCell` / `GRUCell` / `SimpleRNNCell` (the options
  `tf_recurrent.LSTM` / `GRU` / `SimpleRNN` run with a built-in step) runs
  on the engine's chunked loops (`tf_recurrent.engine`);
* any other cell runs on `tf_recurrent.recurrent`, the cell recomputed step
  by step in the backward pass, its variables getting gradients through the
  op's captured-variable support;
* a cell the op cannot recompute (stateful random numbers, as tf_keras's
  `DropoutWrapper` draws, or variable assignments) or whose state (or
  `raw_rnn`'s `loop_state`) holds a TensorArray, and, called eagerly, a
  cell or `loop_fn` the op cannot trace (it reads an eager TensorArray at
  the step's index, say), runs under ordinary autodiff, as TensorFlow ran
  it (`_autodiff`), with one log line saying that its memory saving is lost
  and why.

`parallel_iterations` and `swap_memory` are accepted for compatibility; every
loop here runs one step at a time (the fallback's too, so that a seeded
cell's draws reproduce) and keeps the per-step states in memory.
"""

import contextlib
from typing import Any, Callable, Optional, Tuple

from absl import logging
import keras
import tensorflow as tf
from tensorflow.core.protobuf import config_pb2
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.eager import context  # pylint: disable=g-direct-tensorflow-import

from tf_recurrent import engine
from tf_recurrent.op import accumulators
from tf_recurrent.op import bidirectional as bidirectional_lib
from tf_recurrent.op import lengths as lengths_lib
from tf_recurrent.op import masks
from tf_recurrent.op import op
from tf_recurrent.op import probe
from tf_recurrent.op import structs
from tf_recurrent.op import unconverted

LoopFn = Callable[[tf.Tensor, Any, Any, Any], Tuple[Any, Any, Any, Any, Any]]


@unconverted.entry_point
def dynamic_rnn(cell: Any,
                inputs: Any,
                sequence_length: Any = None,
                initial_state: Any = None,
                dtype: Optional[tf.DType] = None,
                parallel_iterations: Optional[int] = None,
                swap_memory: bool = False,
                time_major: bool = False,
                scope: Any = None) -> Tuple[Any, Any]:
  """`tf.compat.v1.nn.dynamic_rnn`, whose backward pass keeps only the states.

  Runs `output, state = cell(inputs[:, t], state)` for every step t. Past
  `sequence_length[b]` example b's state is copied through and its outputs
  are zeros.

  Args:
    cell: A Keras 3 cell or an object following the RNNCell protocol.
    inputs: A `[batch, time, ...]` tensor (`[time, batch, ...]` when
      `time_major`), or a nested structure of such tensors sharing the batch
      and time dimensions; the cell gets one step of the structure.
    sequence_length: Optional `[batch]` int32/int64 lengths.
    initial_state: Optional initial state, a structure like
      `cell.state_size` of `[batch, size]` tensors (a tensor when
      `state_size` is an int).
    dtype: The dtype of the initial state and the outputs; required when
      `initial_state` is not given.
    parallel_iterations: Accepted for compatibility; steps run one by one.
    swap_memory: Accepted for compatibility; the per-step states stay where
      they are computed.
    time_major: Whether `inputs` and the outputs are `[time, batch, ...]`.
    scope: Variable scope (name or `tf.compat.v1.VariableScope`) in which the
      cell's variables are created; defaults to "rnn".

  Returns:
    `(outputs, state)`: `outputs` shaped by `cell.output_size` with leading
    `[batch, time]` (`[time, batch]` when `time_major`), nested where
    `output_size` is; `state` the final state, structured like
    `cell.state_size`.

  Raises:
    TypeError: If `cell` is not a cell.
    ValueError: If `inputs` is None or empty or of rank < 2, if
      `sequence_length` is not a `[batch]` vector, if `initial_state` does
      not match `cell.state_size`, or if `dtype` is missing without an
      `initial_state`.

  Example:

  >>> import keras
  >>> import tf_recurrent
  >>> cell = keras.layers.LSTMCell(4)
  >>> outputs, (h, c) = tf_recurrent.dynamic_rnn(
  ...     cell, tf.ones([2, 5, 3]), sequence_length=[5, 2], dtype=tf.float32)
  >>> outputs.shape, h.shape
  (TensorShape([2, 5, 4]), TensorShape([2, 4]))
  >>> float(tf.reduce_max(tf.abs(outputs[1, 2:])))
  0.0
  """
  del parallel_iterations, swap_memory
  _check_cell(cell, "cell")
  inputs = _check_inputs(inputs)
  with _variable_scope(scope, "rnn"):
    if not time_major:
      inputs = structs.swap_batch_and_time(inputs, "inputs")
    outputs, state = _dynamic(cell, inputs, sequence_length, initial_state,
                              dtype, "initial_state")
  if not time_major:
    outputs = structs.swap_batch_and_time(outputs, "outputs")
  return outputs, state


@unconverted.entry_point
def bidirectional_dynamic_rnn(
    cell_fw: Any,
    cell_bw: Any,
    inputs: Any,
    sequence_length: Any = None,
    initial_state_fw: Any = None,
    initial_state_bw: Any = None,
    dtype: Optional[tf.DType] = None,
    parallel_iterations: Optional[int] = None,
    swap_memory: bool = False,
    time_major: bool = False,
    scope: Any = None) -> Tuple[Tuple[Any, Any], Tuple[Any, Any]]:
  """`tf.compat.v1.nn.bidirectional_dynamic_rnn` on the op.

  The backward direction reads each example's first `sequence_length[b]`
  steps in reverse (as `tf.reverse_sequence` does); its outputs are
  reversed back, so step t of both outputs belongs to input step t.

  Args:
    cell_fw: The forward direction's cell.
    cell_bw: The backward direction's cell.
    inputs: As for `dynamic_rnn`.
    sequence_length: Optional `[batch]` lengths.
    initial_state_fw: Optional initial state of the forward direction.
    initial_state_bw: Optional initial state of the backward direction.
    dtype: Required when either initial state is not given.
    parallel_iterations: Accepted for compatibility.
    swap_memory: Accepted for compatibility.
    time_major: Whether `inputs` and outputs are `[time, batch, ...]`.
    scope: Variable scope; defaults to "bidirectional_rnn", with the
      directions in its "fw" and "bw" sub-scopes.

  Returns:
    `((output_fw, output_bw), (output_state_fw, output_state_bw))`.

  Raises:
    TypeError: If `cell_fw` or `cell_bw` is not a cell.
    ValueError: As `dynamic_rnn` does.

  Example:

  >>> import keras
  >>> import tf_recurrent
  >>> (fw, bw), _ = tf_recurrent.bidirectional_dynamic_rnn(
  ...     keras.layers.GRUCell(4), keras.layers.GRUCell(2),
  ...     tf.ones([3, 6, 5]), sequence_length=[6, 3, 0], dtype=tf.float32)
  >>> tf.concat([fw, bw], 2).shape
  TensorShape([3, 6, 6])
  """
  del parallel_iterations, swap_memory
  _check_cell(cell_fw, "cell_fw")
  _check_cell(cell_bw, "cell_bw")
  inputs = _check_inputs(inputs)
  with _variable_scope(scope, "bidirectional_rnn"):
    if not time_major:
      inputs = structs.swap_batch_and_time(inputs, "inputs")
    lengths = _check_sequence_length(sequence_length, _batch_size(inputs))
    with _variable_scope(None, "fw"):
      output_fw, state_fw = _dynamic(cell_fw, inputs, lengths,
                                     initial_state_fw, dtype,
                                     "initial_state_fw")
    with _variable_scope(None, "bw"):
      # pylint: disable=protected-access
      reversed_bw, state_bw = _dynamic(
          cell_bw, bidirectional_lib.reverse_time(inputs, lengths), lengths,
          initial_state_bw, dtype, "initial_state_bw")
      output_bw = bidirectional_lib.reverse_time(reversed_bw, lengths)
  if not time_major:
    output_fw, output_bw = (structs.swap_batch_and_time(o, name) for o, name
                            in ((output_fw, "output_fw"),
                                (output_bw, "output_bw")))
  return (output_fw, output_bw), (state_fw, state_bw)


@unconverted.entry_point
def raw_rnn(cell: Any,
            loop_fn: LoopFn,
            parallel_iterations: Optional[int] = None,
            swap_memory: bool = False,
            scope: Any = None) -> Tuple[Any, Any, Any]:
  """`tf.compat.v1.nn.raw_rnn` on the op: `loop_fn` feeds each step's input.

  Computes, as TF1's pseudo-code says:

      finished, next_input, state, emit, loop_state = loop_fn(0, None, None,
                                                              None)
      while not all(finished):
        output, cell_state = cell(next_input, state)
        next_finished, next_input, next_state, emit, loop_state = loop_fn(
            time + 1, output, cell_state, loop_state)
        state = where(finished, state, next_state)
        emit_ta[time] = where(finished, zeros, emit)
        finished |= next_finished

  No maximum number of steps is given, so the loop is first run forward
  without gradient to count its steps, then on the op: one extra forward
  pass, for a backward pass that keeps only the per-step states (the cell
  state, the next input, `loop_state` and the emitted outputs). For the
  same reason it does not run under `jit_compile=True` (XLA needs the step
  count at compile time).

  Args:
    cell: A Keras 3 cell or an object following the RNNCell protocol.
    loop_fn: `(time, cell_output, cell_state, loop_state) -> (finished,
      next_input, next_cell_state, emit_output, next_loop_state)`, called
      first with `time=0` and None for the rest; that call's results set the
      initial state, the structure, dtypes and per-example shapes of the
      emitted outputs (`cell.output_size` when its `emit_output` is None)
      and the structure of `loop_state` (tensors, or TensorArrays, which
      run the loop under ordinary autodiff).
      Every later call must return the same structures. It is recomputed in
      the backward pass, so it must be free of side effects.
    parallel_iterations: Accepted for compatibility.
    swap_memory: Accepted for compatibility.
    scope: Variable scope; defaults to "rnn".

  Returns:
    `(emit_ta, final_state, final_loop_state)`: `emit_ta` a TensorArray (or
    structure of them) of `[batch, ...]` rows, one per step run.

  Raises:
    TypeError: If `cell` is not a cell or `loop_fn` is not callable.
    ValueError: If `loop_fn` returns structures inconsistent with its first
      call, or a `finished` that is not a `[batch]` bool vector, or under
      `jit_compile=True`.

  Example:

  >>> import keras
  >>> import tf_recurrent
  >>> cell = keras.layers.SimpleRNNCell(3)
  >>> x = tf.ones([4, 2, 5])  # [time, batch, depth]
  >>> lengths = tf.constant([4, 2])
  >>> def loop_fn(time, cell_output, cell_state, loop_state):
  ...   state = tf.zeros([2, 3]) if cell_output is None else cell_state
  ...   finished = time >= lengths
  ...   next_input = x[tf.minimum(time, 3)]
  ...   return finished, next_input, state, cell_output, loop_state
  >>> emit_ta, state, _ = tf_recurrent.raw_rnn(cell, loop_fn)
  >>> emit_ta.stack().shape
  TensorShape([4, 2, 3])
  """
  del parallel_iterations, swap_memory
  _check_cell(cell, "cell")
  if not callable(loop_fn):
    raise TypeError(f"loop_fn must be a callable; got {type(loop_fn).__name__}.")
  loop_fn = unconverted.like_caller(loop_fn)
  if accumulators.in_xla_context():
    raise ValueError(
        "raw_rnn cannot run under jit_compile=True: its loop has no maximum "
        "number of steps, and XLA needs the step count at compile time. Call "
        "it outside the compiled function, or use dynamic_rnn.")
  with _variable_scope(scope, "rnn"):
    return _raw(cell, loop_fn)


# The cells.


def _check_cell(cell: Any, name: str):
  """TF1's check: a cell has a state_size and is callable (or a Keras call)."""
  if isinstance(cell, keras.layers.Layer):
    missing = [a for a in ("state_size",) if not hasattr(cell, a)]
  else:
    missing = [a for a in ("state_size", "output_size")
               if not hasattr(cell, a)]
    if not callable(cell):
      missing.append("__call__")
    if not (hasattr(cell, "zero_state") or hasattr(cell, "get_initial_state")):
      missing.append("zero_state or get_initial_state")
  if missing:
    raise TypeError(
        f"{name} must be an RNN cell (a Keras cell with state_size, or an "
        f"RNNCell with state_size, output_size, __call__ and zero_state); got "
        f"{type(cell).__name__}, missing {', '.join(missing)}.")


def _output_size(cell: Any) -> Any:
  """`cell.output_size`, or as Keras's RNN takes it: the first state's size."""
  size = getattr(cell, "output_size", None)
  if size is None:
    size = tf.nest.flatten(cell.state_size)[0]
  return size


def _zeros(size: Any, batch: Any, dtype: tf.DType) -> Any:
  """Zeros `[batch] + size` for every leaf of a structure of sizes."""
  def zeros(s):
    shape = tf.TensorShape(s).as_list()
    if isinstance(batch, int):
      return tf.zeros([batch] + shape, dtype)
    return tf.zeros(tf.concat([[batch], tf.constant(shape, tf.int32)], 0),
                    dtype)
  return tf.nest.map_structure(zeros, size)


def _initial_state(cell: Any, batch: Any, dtype: Optional[tf.DType]) -> Any:
  """TF1's default initial state: the cell's own, else zeros of state_size."""
  if not dtype:
    raise ValueError(
        "If there is no initial_state, you must give a dtype (dtype=None and "
        "initial_state=None).")
  dtype = tf.as_dtype(dtype)
  size = cell.state_size
  if isinstance(cell, keras.layers.Layer):
    if hasattr(cell, "get_initial_state"):
      state = cell.get_initial_state(batch_size=batch)
      flat = [tf.cast(s, dtype) for s in tf.nest.flatten(state)]
      if len(flat) == len(tf.nest.flatten(size)):
        # Keras returns a list even for an int state_size.
        return tf.nest.pack_sequence_as(size, flat)
      return tf.nest.pack_sequence_as(state, flat)
    return _zeros(size, batch, dtype)
  if hasattr(cell, "get_initial_state"):
    return cell.get_initial_state(inputs=None, batch_size=batch, dtype=dtype)
  return cell.zero_state(batch, dtype)


def _to_tensors(struct: Any, name: str) -> Any:
  """`structs.to_tensors`, TensorArray leaves kept (a cell's state may hold
  them, as TensorFlow's tests' TensorArrayStateRNNCell does)."""
  flat = tf.nest.flatten(struct)
  arrays = {i: leaf for i, leaf in enumerate(flat)
            if isinstance(leaf, tf.TensorArray)}
  if not arrays:
    return structs.to_tensors(struct, name)
  converted = tf.nest.flatten(structs.to_tensors(
      [leaf for i, leaf in enumerate(flat) if i not in arrays], name))
  it = iter(converted)
  return tf.nest.pack_sequence_as(
      struct, [arrays[i] if i in arrays else next(it)
               for i in range(len(flat))])


def _has_arrays(struct: Any) -> bool:
  return any(isinstance(leaf, tf.TensorArray)
             for leaf in tf.nest.flatten(struct))


def _check_initial_state(cell: Any, state: Any, name: str) -> Any:
  """`state` as tensors, one per leaf of `cell.state_size`, sizes matching."""
  state = _to_tensors(state, name)
  sizes = tf.nest.flatten(cell.state_size)
  flat = tf.nest.flatten(state)
  if len(flat) != len(sizes):
    raise ValueError(
        f"{name} must hold {len(sizes)} tensor(s), one per entry of the "
        f"cell's state_size={cell.state_size}; got {len(flat)}.")
  for path, size, leaf in zip(structs.leaf_paths(state, name), sizes, flat):
    if isinstance(leaf, tf.TensorArray):
      continue
    want = tf.TensorShape(size)
    got = leaf.shape[1:] if leaf.shape.rank else None
    if want.rank and got is not None and not got.is_compatible_with(want):
      raise ValueError(
          f"{path} must have shape [batch] + {want.as_list()} (state_size "
          f"{size}); got {structs.describe(leaf)}.")
  return state


def _build(cell: Any, step_shapes: Any,
           first_call: Optional[Callable[[], Any]] = None):
  """Creates the cell's variables once, outside the loop: a Keras 3 cell's
  from the shapes (`TensorShape`s) of one step's inputs; an RNNCell
  object's (tf_keras's legacy cells, which create theirs on their first
  call, a MultiRNNCell's layers included) by `first_call()`, a call whose
  results are dropped, in the variable scope TensorFlow would use.

  In a TF1 graph a tf_keras layer's first call once built is also made
  here, in the caller's graph: the layer caches that call's variable scope,
  with its graph, and enters that graph on every later call outside a
  function. Made by the op's trace of one step (`op/probe.py`), it sent
  every later call (a one-step run's, the user's own) into the trace's graph.
  """
  if isinstance(cell, keras.layers.Layer) or first_call is None:
    if not getattr(cell, "built", True) and callable(getattr(cell, "build",
                                                             None)):
      cell.build(tf.nest.map_structure(lambda s: tuple(s.as_list()),
                                       step_shapes))
    return
  if not hasattr(cell, "built"):  # Not a layer: nothing to build or cache.
    return
  calls = 0 if cell.built else 1
  if not tf.executing_eagerly() and not (
      tf.compat.v1.get_default_graph().building_function):
    calls += 1
  for _ in range(calls):
    for leaf in tf.nest.flatten(first_call()):
      if hasattr(leaf, "mark_used"):  # A TensorArray written and dropped.
        leaf.mark_used()


def _call(cell: Any, x: Any, state: Any) -> Tuple[Any, Any]:
  """One step, the new state packed like `state` (Keras returns lists); an
  RNNCell object's call converted by AutoGraph where our caller's code is."""
  output, new_state = unconverted.like_caller(cell)(x, state)
  flat = tf.nest.flatten(new_state)
  if len(flat) != len(tf.nest.flatten(state)):
    raise ValueError(
        f"The cell returned a state of {len(flat)} tensor(s) for a state of "
        f"{len(tf.nest.flatten(state))} (state_size={cell.state_size}).")
  return output, tf.nest.pack_sequence_as(state, flat)


def _zero_step(inputs: Any) -> Any:
  """Zeros shaped like one step of time-major inputs."""
  def zeros(x):
    step = tf.zeros(tf.shape(x)[1:], x.dtype)
    step.set_shape(x.shape[1:])
    return step
  return tf.nest.map_structure(zeros, inputs)


@contextlib.contextmanager
def _exact_when_eager(cell: Any):
  """An RNNCell object's eager call of the op without Grappler's
  arithmetic rewrites, so its outputs equal `static_rnn`'s bit for bit as
  in a TF1 graph (TensorFlow's tests assert it). Eagerly `static_rnn` runs
  op by op, and the op one traced function, which Grappler optimizes: its
  arithmetic optimizer regroups the legacy LSTMCell's sums (4e-11 off)."""
  if not tf.executing_eagerly() or _xla_steps(cell):
    yield
    return
  eager = context.context()
  # The thread's own setting, None until first read (then it follows the
  # context's config): restored exactly as it was, None included.
  before = eager._thread_local_data.function_call_options  # pylint: disable=protected-access
  options = eager.function_call_options
  config = config_pb2.ConfigProto()
  config.ParseFromString(options.config_proto_serialized)
  config.graph_options.rewrite_options.arithmetic_optimization = (
      rewriter_config_pb2.RewriterConfig.OFF)
  eager.function_call_options = context.FunctionCallOptions(
      executor_type=options.executor_type, config_proto=config)
  try:
    yield
  finally:
    eager._thread_local_data.function_call_options = before  # pylint: disable=protected-access


def _xla_steps(cell: Any):
  """The op's `xla_steps` for a cell: "auto" (a step may run as one XLA
  cluster) for a Keras 3 cell; False for an RNNCell object (tf_keras's
  legacy cells), whose outputs then equal a static unroll of the same cell
  bit for bit, as TensorFlow's tests assert of its dynamic_rnn (an XLA
  cluster computes the same math with other rounding)."""
  return "auto" if isinstance(cell, keras.layers.Layer) else False


def _checked_call(cell: Any, x: Any, state: Any,
                  zero_output: Any) -> Tuple[Any, Any]:
  """`_call`, the output checked against the structure of `zero_output`
  (zeros of `cell.output_size`)."""
  output, new_state = _call(cell, x, state)
  try:
    tf.nest.assert_same_structure(output, zero_output, check_types=False)
  except (ValueError, TypeError) as e:
    raise ValueError(
        f"The cell's output does not match its output_size="
        f"{_output_size(cell)}: {e}") from None
  return output, new_state


def _variable_scope(scope: Any, default: str):
  return tf.compat.v1.variable_scope(scope or default)


# dynamic_rnn.


def _check_inputs(inputs: Any) -> Any:
  if inputs is None or not tf.nest.flatten(inputs):
    raise ValueError(f"inputs must not be None or empty; got {inputs!r}.")
  return structs.to_tensors(inputs, "inputs")


def _check_sequence_length(sequence_length: Any,
                           batch: Any = None) -> Optional[tf.Tensor]:
  """`sequence_length` as a `[batch]` int32 vector.

  A rank or size only known when the graph runs (a TF1
  `tf.compat.v1.placeholder(tf.int32)` without a shape, as TF1 code feeds
  lengths) is checked then, as TensorFlow does, by asserts the lengths
  depend on; a rank known now and other than 1 is an error now.
  """
  if sequence_length is None:
    return None
  lengths = tf.convert_to_tensor(sequence_length)
  rank = lengths.shape.rank
  if not lengths.dtype.is_integer or rank not in (None, 1):
    raise ValueError(
        "sequence_length must be a vector of length batch_size, but saw "
        f"{structs.describe(lengths)}.")
  static_batch = batch if isinstance(batch, int) else None
  if rank is None or lengths.shape[0] is None:
    checks = []
    if rank is None:
      checks.append(tf.debugging.assert_rank(
          lengths, 1, message="sequence_length must be a vector of length "
          "batch_size"))
    if batch is not None:
      checks.append(tf.debugging.assert_equal(
          tf.size(lengths, out_type=tf.int32), tf.cast(batch, tf.int32),
          message="sequence_length must be a vector of length batch_size "
          "(the inputs' batch size)"))
    with tf.control_dependencies(checks):
      lengths = tf.identity(lengths)
    lengths.set_shape([static_batch])
  return tf.cast(lengths, tf.int32)


def _set_static_shapes(outputs: Any, state: Any, num_steps: Optional[int],
                       batch: Any, state0: Any) -> None:
  """What TensorFlow's dynamic_rnn states statically: outputs `[T, batch,
  ...]` with T and batch those of the inputs' static shape, every final
  state leaf shaped as its initial one (a while loop's shape invariant)."""
  for leaf in tf.nest.flatten(outputs):
    if leaf.shape.rank and leaf.shape.rank >= 2:
      leaf.set_shape([num_steps, batch if isinstance(batch, int) else None] +
                     [None] * (leaf.shape.rank - 2))
  for leaf, leaf0 in zip(tf.nest.flatten(state), tf.nest.flatten(state0)):
    if (isinstance(leaf, tf.Tensor) and isinstance(leaf0, tf.Tensor) and
        leaf.shape.is_compatible_with(leaf0.shape)):
      leaf.set_shape(leaf.shape.merge_with(leaf0.shape))


def _batch_size(inputs: Any) -> Any:
  """The batch size of time-major inputs: static where known."""
  for x in tf.nest.flatten(inputs):
    if x.shape.rank is not None and x.shape.rank < 2:
      raise ValueError(
          f"inputs must have shape [batch, time, ...] or [time, batch, ...]; "
          f"got {structs.describe(x)}.")
    if x.shape.rank is not None and x.shape[1] is not None:
      return x.shape[1]
  return tf.shape(tf.nest.flatten(inputs)[0])[1]


def _output_dtype(dtype: Optional[tf.DType], state: Any) -> tf.DType:
  """TF1's rule: `dtype` if given, else the state's one dtype."""
  if dtype:
    return tf.as_dtype(dtype)
  dtypes = {s.dtype for s in tf.nest.flatten(state)}
  if len(dtypes) != 1:
    raise ValueError(
        f"The state has several dtypes {sorted(d.name for d in dtypes)}; "
        "pass dtype for the outputs.")
  return dtypes.pop()


def _dynamic(cell, inputs, sequence_length, initial_state, dtype,
             state_name):
  """dynamic_rnn on time-major tensors inside the variable scope."""
  batch = _batch_size(inputs)
  lengths = _check_sequence_length(sequence_length, batch)
  if initial_state is None:
    state0 = _initial_state(cell, batch, dtype)
  else:
    state0 = _check_initial_state(cell, initial_state, state_name)
  state0 = _to_tensors(state0, state_name)
  tensors0 = [s for s in tf.nest.flatten(state0)
              if not isinstance(s, tf.TensorArray)]
  num_steps = tf.nest.flatten(inputs)[0].shape[0]
  if lengths is not None:
    lengths_lib.check_sequence_length(
        lengths, [s for s in tensors0 if s.shape.rank != 0], inputs,
        num_steps)
  _build(cell, tf.nest.map_structure(lambda x: x.shape[1:], inputs),
         lambda: _call(cell, _zero_step(inputs), state0))
  fast = None
  if num_steps != 0 and not _has_arrays(state0):
    fast = _fast(cell, inputs, lengths, state0)
  outputs, state = fast or _generic(cell, inputs, lengths, state0,
                                    _output_dtype(dtype, state0))
  _set_static_shapes(outputs, state, num_steps, batch, state0)
  return outputs, state


def _fast(cell, inputs, lengths, state0):
  """The engine's run of a plain built-in Keras cell (LSTMCell, GRUCell,
  SimpleRNNCell, a ConvLSTM cell, ...) on its chunked loops, or None for
  any other cell (which `_generic` runs: it also steps RNNCell-protocol
  objects, and stops at the longest sequence)."""
  ran = engine.run(cell, inputs, tf.nest.flatten(state0), lengths=lengths,
                   time_major=True, zero_output_for_mask=True,
                   convertible=False, generic=lambda: None)
  if ran is None:
    return None
  outputs, final, _ = ran
  return outputs, tf.nest.pack_sequence_as(state0, list(final))


def _generic(cell, inputs, lengths, state0, output_dtype):
  """Any cell on the op: states and output carried, outputs accumulated;
  under ordinary autodiff (`_autodiff`) a cell the op cannot recompute."""
  if _has_arrays(state0):
    return _autodiff(cell, inputs, lengths, state0, output_dtype,
                     "its state holds a TensorArray, which the op's "
                     "per-step states cannot keep")
  try:
    return _on_op(cell, inputs, lengths, state0, output_dtype)
  except op.UnrecomputableStepError as e:
    return _autodiff(cell, inputs, lengths, state0, output_dtype, str(e))
  except op.UntraceableStepError:
    return _autodiff(cell, inputs, lengths, state0, output_dtype,
                     _UNTRACEABLE)


def _on_op(cell, inputs, lengths, state0, output_dtype):
  """`_generic` on the op, whose backward pass keeps the per-step states."""
  flat0 = tf.nest.flatten(state0)
  # A state leaf without a batch axis (a step counter, say) is carried per
  # example while on the op; it advances while any example runs, so the
  # longest example's copy is the value.
  unbatched = [s.shape.rank == 0 for s in flat0]
  batch = _batch_size(inputs)
  longest = None
  if lengths is not None and any(unbatched):
    longest = tf.argmax(lengths)
    flat0 = [tf.fill(tf.reshape(batch, [1]), s) if u else s
             for s, u in zip(flat0, unbatched)]

  def unpack(flat):
    if longest is None:
      return tf.nest.pack_sequence_as(state0, flat)
    return tf.nest.pack_sequence_as(state0, [
        tf.gather(s, longest) if u else s for s, u in zip(flat, unbatched)])

  output_size = _output_size(cell)
  zero_output = _zeros(output_size, batch, output_dtype)

  def cell_fn(theta, state, x):
    del theta
    output, new_state = _checked_call(cell, x, unpack(state["cell"]),
                                      zero_output)
    new_flat = tf.nest.flatten(new_state)
    if longest is not None:
      new_flat = [tf.fill(tf.reshape(batch, [1]), s) if u else s
                  for s, u in zip(new_flat, unbatched)]
    return {"cell": new_flat, "output": output}, []

  start = {"cell": flat0, "output": zero_output}
  per_step = {"cell": [False] * len(flat0),
              "output": tf.nest.map_structure(lambda _: True, zero_output)}
  with _exact_when_eager(cell):
    acc, final = op.recurrent({}, start, inputs, cell_fn,
                              sequence_length=lengths,
                              accumulate_state=per_step,
                              xla_steps=_xla_steps(cell))
  return acc["output"], unpack(final["cell"])


_warned = set()

# Why an eager call whose step the op cannot trace runs eagerly.
_UNTRACEABLE = (
    "its step reads what only an eager step can use (an eager TensorArray or "
    "a Python list indexed by a step's tensor, say), and the op traces its "
    "steps; it runs eagerly, as TensorFlow runs it")

# The loops here run one step at a time, as the op's do: a step's random
# draw does not wait for the state, so steps running ahead (TensorFlow's
# default lets 32) would take a seeded stream's numbers in whatever order
# they were scheduled, and a seeded DropoutWrapper would not reproduce.
_ONE_BY_ONE = 1


def _warn_autodiff(function: str, cell: Any, reason: str):
  """The fallback's one log line, once per function, cell class and reason."""
  key = (function, type(cell).__name__, reason)
  if key in _warned:
    return
  _warned.add(key)
  logging.warning(
      "tf_recurrent.%s runs %s under ordinary autodiff, without the memory "
      "saving of keeping only the per-step states: %s", function,
      type(cell).__name__, reason)


def _autodiff(cell, inputs, lengths, state0, output_dtype, reason):
  """dynamic_rnn as TensorFlow runs it: a `tf.while_loop` over time whose
  gradient is TensorFlow's own, keeping every step's intermediates.

  For the cells the op cannot run with its recomputing gradient: a cell
  drawing stateful random numbers (tf_keras's `DropoutWrapper`), whose
  draws a recomputed step would not repeat, a cell whose state holds a
  TensorArray, and, eagerly, a cell the op cannot trace (then this loop
  runs eagerly, step by step, as TensorFlow's). Past `sequence_length[b]` the state is copied through and
  the outputs are zeros; a state leaf without a batch axis (or a
  TensorArray) advances while any example runs, as in TensorFlow.
  """
  _warn_autodiff("dynamic_rnn", cell, reason)
  flat_inputs = tf.nest.flatten(inputs)
  steps = flat_inputs[0].shape[0]
  if steps is None:
    steps = tf.shape(flat_inputs[0])[0]
  batch = _batch_size(inputs)
  zero_output = _zeros(_output_size(cell), batch, output_dtype)
  flat_zero = tf.nest.flatten(zero_output)
  input_arrays = [
      tf.TensorArray(x.dtype, size=steps, element_shape=x.shape[1:]).unstack(x)
      for x in flat_inputs]
  output_arrays = [tf.TensorArray(z.dtype, size=steps, element_shape=z.shape)
                   for z in flat_zero]
  # TensorFlow's bound: steps past the longest example change nothing but
  # the unbatched leaves, which stop with it (after at least one step).
  bound = steps if lengths is None else tf.minimum(
      steps, tf.maximum(1, tf.reduce_max(lengths)))

  def body(t, state, arrays):
    x = tf.nest.pack_sequence_as(inputs, [a.read(t) for a in input_arrays])
    output, new_state = _checked_call(cell, x, state, zero_output)
    ran = tf.less(t, bound)

    def carry(old, new):
      if isinstance(new, tf.TensorArray):
        return new
      new = tf.convert_to_tensor(new)
      if lengths is not None and new.shape.rank:
        return masks.select(tf.less(t, lengths), new, old)
      return tf.where(ran, new, old)

    new_state = tf.nest.map_structure(carry, state, new_state)
    running = ran if lengths is None else tf.less(t, lengths)
    rows = [masks.zero_where_off(running, o) if lengths is not None else o
            for o in tf.nest.flatten(output)]
    return t + 1, new_state, [a.write(t, r) for a, r in zip(arrays, rows)]

  _, final, arrays = tf.while_loop(
      lambda t, *_: tf.less(t, steps), body, (0, state0, output_arrays),
      maximum_iterations=steps, parallel_iterations=_ONE_BY_ONE)
  outputs = tf.nest.pack_sequence_as(zero_output,
                                     [a.stack() for a in arrays])
  return outputs, final


# raw_rnn.


def _raw(cell, loop_fn):
  """raw_rnn in its variable scope: count the steps, then run on the op."""
  time0 = tf.constant(0, tf.int32)
  finished, next_input, state0, emit0, loop_state0 = loop_fn(
      time0, None, None, None)
  next_input = structs.to_tensors(next_input, "next_input")
  state0 = structs.to_tensors(state0, "next_cell_state")
  finished = _check_finished(finished)
  flat_input = tf.nest.flatten(next_input)
  batch = (flat_input[0].shape[0] if flat_input[0].shape[0] is not None
           else tf.shape(flat_input[0])[0])
  if emit0 is None:
    emit0 = _zeros(_output_size(cell), batch,
                   tf.nest.flatten(state0)[0].dtype)
  else:
    # At time 0 emit_output gives the structure, dtypes and per-example
    # shapes of what is emitted (as in TensorFlow), not a batch of it.
    def zero_rows(e):
      size = (e.shape.as_list() if e.shape.is_fully_defined() else
              tf.shape(e, out_type=tf.int32))
      if isinstance(batch, int) and isinstance(size, list):
        return tf.zeros([batch] + size, e.dtype)
      return tf.zeros(tf.concat([tf.reshape(batch, [1]), size], 0), e.dtype)

    emit0 = tf.nest.map_structure(zero_rows,
                                  structs.to_tensors(emit0, "emit_output"))
  has_loop_state = loop_state0 is not None
  if has_loop_state:
    loop_state0 = _to_tensors(loop_state0, "loop_state")
  _build(cell, tf.nest.map_structure(lambda x: x.shape, next_input),
         lambda: _call(cell, next_input, state0))
  start = {"time": time0, "finished": finished, "input": next_input,
           "state": state0, "emit": emit0,
           "loop_state": loop_state0 if has_loop_state else ()}

  def step(s):
    output, cell_state = _call(cell, s["input"], s["state"])
    (next_finished, next_input, next_state, emit,
     next_loop_state) = loop_fn(s["time"] + 1, output, cell_state,
                                s["loop_state"] if has_loop_state else None)
    if emit is None:
      emit = output
    next_finished = _check_finished(next_finished)
    new = {"time": s["time"] + 1, "input": next_input, "state": next_state,
           "emit": emit,
           "loop_state": next_loop_state if has_loop_state else ()}
    for key, what in (("input", "next_input"), ("state", "next_cell_state"),
                      ("emit", "emit_output"),
                      ("loop_state", "next_loop_state")):
      try:
        tf.nest.assert_same_structure(start[key], new[key], check_types=False)
      except (ValueError, TypeError) as e:
        raise ValueError(
            f"loop_fn returned a {what} whose structure differs from its "
            f"first call's (time=0): {e}") from None
    if not has_loop_state and next_loop_state is not None:
      raise ValueError(
          "loop_fn returned a next_loop_state after returning None at "
          "time=0; return the initial loop_state at time=0.")
    new["input"] = tf.nest.map_structure(tf.convert_to_tensor, new["input"])
    new["loop_state"] = _to_tensors(new["loop_state"], "next_loop_state")
    done = s["finished"]
    new["state"] = masks.select_structure(done, s["state"], new["state"])
    new["emit"] = tf.nest.map_structure(
        lambda e: masks.zero_where_off(tf.logical_not(done), e), new["emit"])
    new["finished"] = tf.logical_or(done, next_finished)
    return new

  if _has_arrays(start["loop_state"]):
    return _raw_autodiff(cell, start, step, emit0, has_loop_state,
                         "its loop_state holds a TensorArray, which the op's "
                         "per-step states cannot keep")

  def cell_fn(theta, s, x):
    del theta, x
    return step(s), []

  if tf.executing_eagerly():
    # Whether the op can trace the step, asked before the counting loop
    # runs loop_fn eagerly: an eager TensorArray it reads is cleared after
    # each read, so only one loop may read it.
    try:
      probe.probe_step(cell_fn, None, {}, start, tf.range(1), None)
    except op.UntraceableStepError:
      return _raw_autodiff(cell, start, step, emit0, has_loop_state,
                           _UNTRACEABLE)
  # No maximum is given: count the steps on a forward-only loop first.
  counted = tf.while_loop(
      lambda s: tf.logical_not(tf.reduce_all(s["finished"])), lambda s: (
          step(s),), (tf.nest.map_structure(tf.stop_gradient, start),),
      parallel_iterations=_ONE_BY_ONE)
  num_steps = tf.stop_gradient(counted[0]["time"])
  per_step = tf.nest.map_structure(lambda _: False, start)
  per_step["emit"] = tf.nest.map_structure(lambda _: True, emit0)
  try:
    acc, final = op.recurrent({}, start, tf.range(num_steps), cell_fn,
                              accumulate_state=per_step)
  except op.UnrecomputableStepError as e:
    return _raw_autodiff(cell, start, step, emit0, has_loop_state, str(e))

  def to_array(rows):
    return tf.TensorArray(rows.dtype, size=num_steps,
                          element_shape=rows.shape[1:]).unstack(rows)

  emit_ta = tf.nest.map_structure(to_array, acc["emit"])
  final_loop_state = final["loop_state"] if has_loop_state else None
  if has_loop_state and not any(
      structs.is_differentiable(leaf.dtype)
      for leaf in tf.nest.flatten(final_loop_state)):
    # A loop_state without float leaves has no gradient to carry: take it
    # from the counting loop, a plain while loop that a TF1 Session fetching
    # only loop_state runs without the cell (as TensorFlow's raw_rnn loop).
    final_loop_state = counted[0]["loop_state"]
  return emit_ta, final["state"], final_loop_state


def _raw_autodiff(cell, start, step, emit0, has_loop_state, reason):
  """raw_rnn as TensorFlow runs it, a `tf.while_loop` differentiated by
  TensorFlow (see `_autodiff`): for a loop_state holding a TensorArray, or
  a cell drawing stateful random numbers."""
  _warn_autodiff("raw_rnn", cell, reason)
  arrays = [tf.TensorArray(e.dtype, size=0, dynamic_size=True,
                           element_shape=e.shape)
            for e in tf.nest.flatten(emit0)]

  def body(s, arrays):
    new = step(s)
    return new, [a.write(s["time"], e)
                 for a, e in zip(arrays, tf.nest.flatten(new["emit"]))]

  final, arrays = tf.while_loop(
      lambda s, _: tf.logical_not(tf.reduce_all(s["finished"])), body,
      (start, arrays), parallel_iterations=_ONE_BY_ONE)
  return (tf.nest.pack_sequence_as(emit0, arrays), final["state"],
          final["loop_state"] if has_loop_state else None)


def _check_finished(finished: Any) -> tf.Tensor:
  finished = tf.convert_to_tensor(finished)
  if finished.dtype != tf.bool or finished.shape.rank not in (None, 1):
    raise ValueError(
        "loop_fn must return finished as a [batch] bool vector; got "
        f"{structs.describe(finished)}.")
  return finished
