"""Each step of the generic loops as one XLA cluster, where XLA is not on.

Outside XLA (Keras 3's default `compile()`, TF1 graphs, Lingvo) the TF
executor runs one step of `cell_fn`, and in the reverse loop its recompute
and VJP, as dozens of small ops dispatched one at a time. At the sizes
recurrent models train at, many of those ops do microseconds of work and cost
as much again to dispatch. Compiled as one XLA cluster (a
`tf.function(jit_compile=True)` called from the uncompiled while loop), a step
is one call: fused elementwise work, one dispatch. The loops, their
accumulators and the custom gradient stay as they are.

A step runs as a cluster only when that computes what the plain step
computes. With `xla_steps="auto"` (the op's default) the step's traced graph
is checked once per trace, and the step runs plain, with one log line naming
the reason, when it holds:

* an op without an XLA kernel for this device and its dtypes
  (`tf.py_function`, strings, a complex `tf.cumsum`), or whose output shape
  depends on its values (`tf.unique`, `tf.boolean_mask`);
* a random draw: XLA's generator gives other numbers than TensorFlow's
  kernels for the same seed, so a step with `step_seed()` dropout would not
  draw the masks it draws unclustered;
* a run-time assertion (XLA drops them) or a TensorList/TensorArray value;
* control flow (`tf.cond`, `tf.while_loop`): a compiled cond differentiated
  under a second, persistent tape yields intermediates of other shapes than
  it was traced with;
* too few ops to pay for the launch: a cluster call costs about as much as
  ten dispatched ops, plus ten per variable it reads (`_OPS_PER_LAUNCH_COST`).
  A cheap step (an Elman cell's forward) runs faster plain; the recompute
  and VJP of a richer cell (an LSTM's, a layer-norm LSTM's) run as a
  cluster.

Under an outer `jit_compile=True` (or `use_tpu`) the whole loop is one XLA
program already and nothing changes. Graphs traced for a SavedModel get no
clusters: a server may run without XLA.

A cluster is compiled once per structure, not once per trace. XLA keys its
compiled programs by function name and argument shapes, and every trace
names its functions anew: Keras's `fit`, `evaluate` and `predict`, each
layer of a stack of equal layers, every retrace compiled the same step
again (0.1-0.4 s on a 2-core CPU for a small cell's step). Steps whose
traced graphs are equal but for node names (ops, attributes, constants,
every static shape) share one function, named by that structure, called
with each trace's own captured tensors and variables.
"""

import atexit
import collections
import functools
import hashlib
import threading
from typing import Any, Callable, List, Optional, Union

from absl import logging
import tensorflow as tf
from tensorflow.core.framework import function_pb2
from tensorflow.python.eager import context
from tensorflow.python.eager.polymorphic_function import atomic_function
from tensorflow.python.framework import kernels
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.saved_model import save_context

XlaSteps = Union[str, bool]

# Ops XLA compiles into something else than TensorFlow runs: assertions are
# dropped, prints are not printed.
_CHANGED_BY_XLA = frozenset({"Assert", "Print", "PrintV2", "CheckNumerics",
                             "CheckNumericsV2"})
# Ops XLA compiles only with a bound on their output's size.
_DYNAMIC_SHAPES = frozenset({"Where", "Unique", "UniqueV2", "UniqueWithCounts",
                             "UniqueWithCountsV2", "ListDiff"})
# Control flow: differentiated under a second (persistent) tape, a compiled
# cond returns intermediates of other shapes than the traced ones.
_CONTROL_FLOW = frozenset({"If", "StatelessIf", "While", "StatelessWhile",
                           "Case", "StatelessCase"})
_UNCOMPILABLE_DTYPES = {tf.string.as_datatype_enum: "strings",
                        tf.variant.as_datatype_enum:
                            "a TensorList or TensorArray value"}
# A traced function's arguments, and the call ops a cluster compiles through
# (the called functions' bodies are checked as library functions).
_STRUCTURAL = frozenset({"Placeholder", "NoOp", "PartitionedCall",
                         "StatefulPartitionedCall"})

# What a cluster call costs, in ops of a plain step: measured (2-core CPU,
# a while loop of single steps) 16 us a launch plus 7-8 us per resource
# variable it reads, against 1.5-2 us per op the TF executor dispatches.
# Steps with fewer ops than this many per launch-and-variable ran slower as
# clusters: an Elman step (4 ops forward, 15 backward, one variable) 3x
# slower at B=2, H=4 and no faster at B=32, H=256; a user's layer-norm
# LSTM step's forward (65 ops, 9 variables) 7% slower at B=2, H=4 and 2-4%
# faster at B=32, H=256; its gradient (213 ops) 1.4x / 1.25x faster.
_OPS_PER_LAUNCH_COST = 10
# Ops that cost the executor (next to) nothing.
_FREE = frozenset({"Placeholder", "Const", "Identity", "NoOp"})

_reported = set()

# Shared clusters, by structure digest; the least recently used go first.
# Each holds only its FunctionDef (no graph, no captured tensor).
_SHARED_CLUSTERS_KEPT = 256
_shared_clusters: "collections.OrderedDict[str, Any]" = (
    collections.OrderedDict())
_shared_clusters_lock = threading.Lock()  # Traces may run in threads.
# Released while TensorFlow's modules still stand: TensorFlow 2.16's
# AtomicFunction cannot release itself once they are torn down at exit.
atexit.register(_shared_clusters.clear)


def check_setting(xla_steps: Any) -> XlaSteps:
  """Validates the op's `xla_steps` argument: "auto", True or False."""
  if xla_steps == "auto" or isinstance(xla_steps, bool):
    return xla_steps
  raise ValueError(
      f'xla_steps must be "auto", True or False; got {xla_steps!r}.')


def wrap(step_fn: Callable[..., Any], setting: XlaSteps, use_xla: bool,
         what: str) -> Callable[..., Any]:
  """`step_fn`, to be called in a loop body: as one XLA cluster or plain.

  Args:
    step_fn: A function of tensors (and structures of them, with None).
    setting: The op's `xla_steps`: True compiles the step whatever it holds,
      False never, "auto" when the traced step passes the checks above.
    use_xla: Whether the loop itself is compiled by XLA.
    what: The step's name in the log line ("forward step", ...).

  Returns:
    A function with `step_fn`'s signature. Its first call traces the cluster
    (and decides); call it once per loop body.
  """
  if use_xla or setting is False or save_context.in_save_context():
    return step_fn

  @functools.wraps(step_fn)
  def scoped_step(*args):
    # A function graph starts at the root name scope, where names with a
    # leading underscore (a Keras cell class `_MyCell`'s layer name) are
    # invalid: nest the step in a scope of its own.
    with tf.name_scope(what.replace(" ", "_")):
      return step_fn(*args)

  def call(*args):
    cluster = tf.function(scoped_step, jit_compile=True, autograph=False)
    concrete = cluster.get_concrete_function(*args)
    graph_def = concrete.graph.as_graph_def(add_shapes=True)
    if setting == "auto":
      reasons = _blockers(graph_def)
      if reasons:
        _report(what, reasons)
        return step_fn(*args)
    shared = _shared_cluster(concrete, graph_def, scoped_step.__name__)
    if shared is None:
      return concrete(*args)
    # What a ConcreteFunction's call does for the variables it reads: tapes
    # and variable watchers (a custom gradient's) see them read.
    for variable in concrete.variables:
      resource_variable_ops.variable_accessed(variable)
    return shared.call_with_captures(args, {}, concrete.captured_inputs)

  return call


def _shared_cluster(concrete, graph_def, kind: str) -> Optional[Any]:
  """The function shared by every cluster whose traced graph is
  `concrete`'s but for node names, named `kind` and the structure's digest;
  None when it cannot be shared: it calls functions of its own trace, or
  orders itself after ops outside it."""
  inference = concrete.inference_fn
  if graph_def.library.function or inference.call_options.control_captures:
    return None
  digest = _structure_digest(graph_def, concrete)
  with _shared_clusters_lock:
    shared = _shared_clusters.get(digest)
    if shared is None:
      definition = function_pb2.FunctionDef()
      definition.CopyFrom(inference.cached_definition)
      definition.signature.name = f"{kind}_{digest[:32]}"
      runtime = context.context()
      if not runtime.has_function(definition.signature.name):
        runtime.add_function_def(definition)
      shared = atomic_function.AtomicFunction(
          definition.signature.name, runtime, inference.function_type,
          call_options=atomic_function.CallOptions(
              collective_manager_ids_used=list(
                  inference.call_options.collective_manager_ids_used),
              is_stateful=inference.call_options.is_stateful))
      _shared_clusters[digest] = shared
      while len(_shared_clusters) > _SHARED_CLUSTERS_KEPT:
        _shared_clusters.popitem(last=False)
    _shared_clusters.move_to_end(digest)
  return shared


def _structure_digest(graph_def, concrete) -> str:
  """A digest of what the traced step computes, blind to node names (a
  trace's name scopes and uniquified layer names): the graph with nodes
  renamed by position (static shapes included), its inputs and outputs, and
  the function's argument and result structure. Renames `graph_def`'s nodes
  in place (the caller's checks have read it by then)."""
  canonical = {node.name: f"n{i}" for i, node in enumerate(graph_def.node)}

  def rename(reference: str) -> str:
    control = reference.startswith("^")
    name, _, port = reference.lstrip("^").partition(":")
    return ("^" if control else "") + canonical[name] + (
        f":{port}" if port else "")

  for node in graph_def.node:
    node.name = canonical[node.name]
    node.input[:] = [rename(r) for r in node.input]
    # A placeholder's name for the tensor it captures: no part of the math.
    node.attr.pop("_user_specified_name", None)
    if "_class" in node.attr:  # Colocation, by node name.
      node.attr["_class"].list.s[:] = [
          b"loc:@" + canonical.get(s[5:].decode(), s[5:].decode()).encode()
          for s in node.attr["_class"].list.s]
  digest = hashlib.sha256(graph_def.SerializeToString(deterministic=True))
  ends = [rename(t.name)
          for t in concrete.graph.inputs + concrete.graph.outputs]
  digest.update(
      repr((ends, str(concrete.inference_fn.function_type))).encode())
  return digest.hexdigest()


def _report(what: str, reasons: List[str]):
  key = (what, tuple(reasons))
  if key not in _reported:
    _reported.add(key)
    logging.info(
        "tf_recurrent: the %s runs as plain TensorFlow ops, not one XLA "
        "cluster, because it %s (xla_steps=True forces the cluster).", what,
        "; ".join(reasons))


def _blockers(graph_def) -> List[str]:
  """Why the step traced as `graph_def` must not run as a cluster (empty
  when it may)."""
  functions = {f.signature.name for f in graph_def.library.function}
  nodes = list(graph_def.node)
  for function in graph_def.library.function:
    nodes += function.node_def
  reasons = []

  def add(reason):
    if reason not in reasons:
      reasons.append(reason)

  device_type = _xla_device_type()
  variables = sum(
      1 for node in graph_def.node if node.op == "Placeholder" and
      node.attr["dtype"].type == tf.resource.as_datatype_enum)
  ops = sum(1 for node in nodes if node.op not in _FREE)
  if ops < _OPS_PER_LAUNCH_COST * (1 + variables):
    add(f"holds {ops} ops and reads {variables} variables: too few ops to "
        "pay for an XLA launch")
  for node in nodes:
    for attr in node.attr.values():
      for dtype in [attr.type, *attr.list.type]:
        if dtype in _UNCOMPILABLE_DTYPES:
          add(f"holds {_UNCOMPILABLE_DTYPES[dtype]} ({node.op})")
    if node.op in functions or node.op in _STRUCTURAL:
      continue
    if _draws_random(node.op):
      add(f"draws random numbers ({node.op}; XLA's generator draws other "
          "numbers than TensorFlow's for the same seed)")
    elif node.op in _CONTROL_FLOW:
      add(f"holds control flow ({node.op}; compiled, its gradient under a "
          "second tape has intermediates of other shapes than traced)")
    elif node.op in _CHANGED_BY_XLA:
      add(f"holds {node.op} (XLA drops it)")
    elif node.op in _DYNAMIC_SHAPES:
      add(f"holds {node.op}, whose output shape depends on its values")
    elif not _has_kernel(node, device_type):
      add(f"holds {node.op}, which has no {device_type} kernel for its "
          "dtypes")
  return reasons


def _draws_random(op_type: str) -> bool:
  return ("Random" in op_type or "TruncatedNormal" in op_type or
          "Multinomial" in op_type or op_type.startswith(("Stateful", "Rng")))


def _xla_device_type() -> str:
  return "XLA_GPU_JIT" if tf.config.list_logical_devices("GPU") else (
      "XLA_CPU_JIT")


def _has_kernel(node, device_type: str) -> bool:
  """Whether XLA has a kernel for the op of `node` (a NodeDef) and the
  dtypes its attributes give."""
  def accepts(constraints):
    return all(t in allowed for name, allowed in constraints
               for t in [node.attr[name].type, *node.attr[name].list.type]
               if t)

  return any(map(accepts, _xla_kernel_constraints(node.op, device_type)))


@functools.lru_cache(maxsize=None)
def _xla_kernel_constraints(op_type: str, device_type: str):
  """The dtype constraints of each XLA kernel registered for `op_type` on
  `device_type`: ((attr name, allowed dtypes), ...) per kernel.

  Kept per op type: TensorFlow answers each question by filtering its whole
  kernel registry (tens of thousands of kernels), which, asked for every
  node of every traced step, took 7% of the CPU time of tracing the op.
  """
  _register_xla_kernels()
  return tuple(
      tuple((c.name, frozenset(c.allowed_values.list.type))
            for c in k.constraint)
      for k in kernels.get_registered_kernels_for_op(op_type).kernel
      if k.device_type == device_type)


def _register_xla_kernels():
  """TensorFlow registers XLA's op kernels on the first compile: run one."""
  if getattr(_register_xla_kernels, "done", False):
    return
  double = tf.function(lambda x: 2.0 * x, jit_compile=True, autograph=False)
  with tf.init_scope():
    if tf.executing_eagerly():
      double(tf.ones([1]))
    else:  # TF1: eager execution is off for the whole process.
      with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        session.run(double(tf.ones([1])))
  _register_xla_kernels.done = True
