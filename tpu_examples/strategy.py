"""What every tpu_examples job shares: strategy, input split, train loop.

* `make_strategy`: `tpu` (TPUStrategy via TPUClusterResolver), `multi_worker`
  (MultiWorkerMirroredStrategy from TF_CONFIG), `mirrored` (local devices)
  or `default`. A missing TPU or TF_CONFIG is one clear `SetupError`.
* `distribute_steps`: the global batch of step i is made by a stateless
  function of i, and replica r of R gets rows [r*B/R, (r+1)*B/R): the same
  examples whatever the number of replicas and workers, and a restarted job
  sees exactly the batches it has not trained on yet.
* `Trainer`: several steps per call (a loop around `strategy.run`), the
  forward/backward compiled by XLA, the loss averaged over the global batch,
  checkpoints (`tf.train.CheckpointManager`, resumable after a kill),
  TensorBoard scalars, and progress lines with steps/sec.
"""

import json
import os
import sys
import time
from typing import Callable, Dict, List, Optional

from absl import flags
from absl import logging
import tensorflow as tf
from tensorflow.core.framework import summary_pb2

FLAGS = flags.FLAGS
# The flags every job has; each job sets its own defaults (set_job_defaults).
flags.DEFINE_integer("seq_len", 100, "Sequence length T.")
flags.DEFINE_integer("hidden", 64, "LSTM units.")
flags.DEFINE_integer("batch", 64, "Global batch size (over all replicas).")
flags.DEFINE_integer("steps", 2500, "Training steps in all.")
flags.DEFINE_float("learning_rate", 3e-3, "Adam learning rate.")
flags.DEFINE_integer("log_every", 100, "Steps between progress lines.")
flags.DEFINE_integer("seed", 0, "Random seed.")
flags.DEFINE_enum("strategy", "default",
                  ["tpu", "multi_worker", "mirrored", "default"],
                  "tf.distribute strategy to train under.")
flags.DEFINE_string("tpu", "", "TPU name or grpc:// address for "
                    "--strategy=tpu (empty: the local TPU VM).")
flags.DEFINE_integer("steps_per_call", 20,
                     "Training steps run per call of the compiled loop.")
flags.DEFINE_bool("jit_compile", True, "Compile the step with XLA.")
flags.DEFINE_string("model_dir", "", "Checkpoints and TensorBoard logs; "
                    "empty: no checkpoints or logs.")
flags.DEFINE_integer("checkpoint_every", 200, "Steps between checkpoints.")
flags.DEFINE_string("export_dir", "", "Where to export a SavedModel; empty: "
                    "no export.")


# TensorBoard's scalar plugin reads summaries tagged like this; writing them
# with tf.summary.write needs no tensorboard package in the job.
_SCALAR_METADATA = summary_pb2.SummaryMetadata(
    plugin_data=summary_pb2.SummaryMetadata.PluginData(
        plugin_name="scalars")).SerializeToString()


def set_job_defaults(**defaults) -> None:
  """Sets a job's defaults for the shared flags (before they are parsed).

  Example:

  >>> set_job_defaults(steps=2500)
  >>> FLAGS["steps"].default
  2500
  """
  for name, value in defaults.items():
    FLAGS.set_default(name, value)


class SetupError(RuntimeError):
  """The requested strategy cannot be built on this machine."""


def make_strategy(name: str, tpu: str = "") -> tf.distribute.Strategy:
  """Builds the strategy named by `--strategy`.

  Args:
    name: "tpu", "multi_worker", "mirrored" or "default".
    tpu: For "tpu", the TPU's name or grpc:// address ("" for a TPU VM).

  Returns:
    The strategy.

  Raises:
    SetupError: If no TPU answers, or TF_CONFIG is missing for multi_worker.

  Example:

  >>> make_strategy("default").num_replicas_in_sync
  1
  """
  if name == "tpu":
    try:
      resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
      tf.config.experimental_connect_to_cluster(resolver)
      tf.tpu.experimental.initialize_tpu_system(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as e:
      first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""
      raise SetupError(
          f"--strategy=tpu: no TPU found{f' ({first_line})' if first_line else ''}"
          ". Run on a Cloud TPU VM, pass --tpu=<name or grpc://host:8470>, "
          "or pick --strategy=default, mirrored or multi_worker.") from None
    return tf.distribute.TPUStrategy(resolver)
  if name == "multi_worker":
    if not os.environ.get("TF_CONFIG"):
      raise SetupError(
          "--strategy=multi_worker needs TF_CONFIG describing the cluster "
          "and this worker's task, e.g. {\"cluster\": {\"worker\": "
          "[\"localhost:12345\", \"localhost:12346\"]}, \"task\": {\"type\": "
          "\"worker\", \"index\": 0}}.")
    return tf.distribute.MultiWorkerMirroredStrategy()
  if name == "mirrored":
    return tf.distribute.MirroredStrategy()
  return tf.distribute.get_strategy()


def strategy_from_flags() -> tf.distribute.Strategy:
  """`make_strategy` for --strategy/--tpu; exits with one line if it fails."""
  try:
    return make_strategy(FLAGS.strategy, FLAGS.tpu)
  except SetupError as e:
    sys.exit(f"error: {e}")


def uses_tpu(strategy: tf.distribute.Strategy) -> bool:
  """Whether `strategy` runs on TPUs (the op then builds for XLA)."""
  return isinstance(strategy, (tf.distribute.TPUStrategy,
                               tf.distribute.experimental.TPUStrategy))


def xla_supported(strategy: tf.distribute.Strategy) -> bool:
  """Whether the replica step may be compiled with `jit_compile=True`.

  XLA compiles for one device. MirroredStrategy over several CPU devices
  (logical devices carved from one CPU) keeps replica r's variables on
  CPU:r, which an XLA CPU computation cannot reach
  (https://www.tensorflow.org/xla/known_issues); on GPUs and TPUs each
  replica's computation is compiled for its own device.
  """
  if not isinstance(strategy, tf.distribute.MirroredStrategy):
    return True
  devices = strategy.extended.worker_devices
  return len(devices) == 1 or not all("CPU" in d.upper() for d in devices)


def is_chief() -> bool:
  """True for the worker that keeps checkpoints and writes logs."""
  config = json.loads(os.environ.get("TF_CONFIG", "{}"))
  task = config.get("task")
  if not task:
    return True
  if "chief" in config.get("cluster", {}):
    return task.get("type") == "chief"
  return task.get("type") == "worker" and task.get("index", 0) == 0


def distribute_steps(strategy: tf.distribute.Strategy,
                     global_batch_fn: Callable[[tf.Tensor], tf.Tensor],
                     global_batch_size: int, first_step: int = 0):
  """An iterator of per-replica batches: step i's rows split over replicas.

  Args:
    strategy: The strategy.
    global_batch_fn: A stateless function of the step index (int64 scalar)
      returning a structure of `[global_batch_size, ...]` tensors.
    global_batch_size: Rows in a global batch; divisible by the replicas.
    first_step: The step to start from (a resumed job's next step).

  Returns:
    An iterator for `strategy.run`.

  Raises:
    ValueError: If the global batch does not split evenly over replicas.
  """
  replicas = strategy.num_replicas_in_sync
  if global_batch_size % replicas:
    raise ValueError(
        f"The global batch {global_batch_size} does not split evenly over "
        f"{replicas} replicas.")
  per_replica = global_batch_size // replicas

  def dataset_fn(context: tf.distribute.InputContext):
    local = replicas // context.num_input_pipelines
    first_replica = context.input_pipeline_id * local

    def replica_slices(step):
      batch = global_batch_fn(step)
      # Elements go round-robin to this worker's replicas, in order.
      return tf.data.Dataset.range(local).map(
          lambda r: tf.nest.map_structure(
              lambda x: x[(first_replica + tf.cast(r, tf.int32)) *
                          per_replica:][:per_replica], batch))

    return (tf.data.Dataset.range(first_step, 2**62)
            .flat_map(replica_slices)
            .prefetch(tf.data.AUTOTUNE))

  return iter(strategy.distribute_datasets_from_function(dataset_fn))


class Trainer:
  """Trains `variables` on a per-example loss under a strategy.

  Example (one CPU, two steps per call):

  >>> w = tf.Variable(1.0)
  >>> trainer = Trainer(
  ...     tf.distribute.get_strategy(), [w],
  ...     lambda batch, training: tf.square(w * batch - 2.0),
  ...     tf.keras.optimizers.SGD(0.1), global_batch_size=4,
  ...     steps_per_call=2, jit_compile=True)
  >>> batches = distribute_steps(tf.distribute.get_strategy(),
  ...                            lambda step: tf.ones([4]), 4)
  >>> float(trainer.train(batches)) < 1.0
  True
  """

  def __init__(self,
               strategy: tf.distribute.Strategy,
               variables: List[tf.Variable],
               per_example_loss: Callable[[object, bool], tf.Tensor],
               optimizer,
               global_batch_size: int,
               steps_per_call: int,
               jit_compile: bool,
               clip_norm: Optional[float] = None):
    """Builds the compiled train loop.

    Args:
      strategy: The strategy the variables were created under.
      variables: The trainable variables.
      per_example_loss: `(per_replica_batch, training) -> [batch]` losses.
      optimizer: A Keras optimizer created under the strategy's scope.
      global_batch_size: Examples per step over all replicas; the loss is
        their mean, so each replica divides its sum by this.
      steps_per_call: Steps per call of `train`.
      jit_compile: Compile the forward/backward with XLA (ignored where
        `xla_supported` says it cannot work).
      clip_norm: Optional bound on the global norm of the global batch's
        gradient. (A Keras optimizer's own `clipnorm` clips each replica's
        share before the all-reduce, so results would depend on the number
        of replicas.)
    """
    self.strategy = strategy
    self.variables = variables
    self.optimizer = optimizer
    self.global_batch_size = global_batch_size
    self.steps_per_call = steps_per_call
    if not getattr(optimizer, "built", True):
      # Slots made now, not on the first traced step (where creating
      # variables under a strategy takes a lifted-initializer path).
      with strategy.scope():
        optimizer.build(variables)
    self.clip_norm = clip_norm
    self.jit_compile = jit_compile and xla_supported(strategy)
    if jit_compile and not self.jit_compile:
      logging.warning("XLA is off for MirroredStrategy over CPU devices "
                      "(see strategy.xla_supported).")

    def loss_and_grads(batch):
      with tf.GradientTape() as tape:
        per_example = per_example_loss(batch, True)
        # `tf.nn.compute_average_loss`'s sum over the global batch, without
        # its checks of the (Python int) batch size: assertion ops, which
        # XLA drops with a warning per compilation.
        loss = tf.math.divide_no_nan(
            tf.reduce_sum(per_example),
            tf.cast(global_batch_size, per_example.dtype))
      return loss, tape.gradient(loss, variables)

    # On TPUs strategy.run compiles the whole replica step; elsewhere XLA
    # compiles the forward/backward, and the update (which all-reduces the
    # gradients across replicas) runs outside it.
    self.loss_and_grads = tf.function(loss_and_grads,
                                      jit_compile=self.jit_compile or None)

    def train_loop(iterator):
      total = tf.constant(0.0)
      for _ in tf.range(steps_per_call):
        losses = strategy.run(self.replica_step, args=(next(iterator),))
        total += strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)
      return total / steps_per_call

    self._train_loop = tf.function(train_loop)

  def replica_step(self, batch) -> tf.Tensor:
    """One step on one replica's batch: what TPUStrategy compiles whole."""
    loss, grads = self.loss_and_grads(batch)
    if self.clip_norm:
      context = tf.distribute.get_replica_context()
      dense = [tf.convert_to_tensor(g) for g in grads]  # Embeddings' slices.
      total = context.all_reduce(tf.distribute.ReduceOp.SUM, dense)
      total, _ = tf.clip_by_global_norm(total, self.clip_norm)
      # The optimizer sums the replicas' gradients again: hand it a share.
      grads = [g / self.strategy.num_replicas_in_sync for g in total]
    self.optimizer.apply_gradients(zip(grads, self.variables))
    return loss

  def train(self, iterator) -> tf.Tensor:
    """Runs `steps_per_call` steps; returns their mean loss."""
    return self._train_loop(iterator)

  def gradients(self, iterator):
    """The loss and summed gradients of one global batch, without updating."""
    return self._gradients(iterator)

  @tf.function
  def _gradients(self, iterator):
    # Traced once per Trainer, like the train loop, not once per call.
    loss, grads = self.strategy.run(self.loss_and_grads,
                                    args=(next(iterator),))
    total = lambda x: self.strategy.reduce(tf.distribute.ReduceOp.SUM, x,
                                           axis=None)
    return total(loss), [total(g) for g in grads]


class Progress:
  """Checkpoints, TensorBoard scalars and progress lines for a train loop.

  Example:

  >>> step = tf.Variable(0, dtype=tf.int64)
  >>> progress = Progress("", tf.train.Checkpoint(step=step), step,
  ...                     checkpoint_every=10, print_fn=lambda line: None)
  >>> progress.start_step
  0
  """

  def __init__(self, model_dir: str, checkpoint: tf.train.Checkpoint,
               step: tf.Variable, checkpoint_every: int,
               print_fn: Optional[Callable[[str], None]] = None):
    """Restores the latest checkpoint in `model_dir`, if any.

    Args:
      model_dir: Where checkpoints and logs go ("" for neither).
      checkpoint: What to save; must track `step`.
      step: The int64 step counter variable.
      checkpoint_every: Steps between checkpoints.
      print_fn: Where progress lines go (default: stdout, flushed per line,
        so a supervisor reading a pipe sees each line as it happens).
    """
    self.step = step
    self.checkpoint_every = checkpoint_every
    self.print = print_fn or (lambda line: print(line, flush=True))
    self.manager = None
    self.writer = None
    if model_dir:
      # Every worker saves (saving is collective under multi-worker); only
      # the chief's copy is kept in model_dir.
      directory = model_dir if is_chief() else os.path.join(
          model_dir, f"worker_{_task_index()}")
      self.manager = tf.train.CheckpointManager(checkpoint, directory,
                                                max_to_keep=3)
      if self.manager.latest_checkpoint:
        checkpoint.restore(self.manager.latest_checkpoint)
        self.print(f"resumed from step {int(step.numpy())} "
                   f"({self.manager.latest_checkpoint})")
      if is_chief():
        self.writer = tf.summary.create_file_writer(
            os.path.join(model_dir, "logs"))
    self.start_step = int(step.numpy())
    self._last_save = self.start_step
    self._window = (time.time(), self.start_step)

  def report(self, scalars: Dict[str, float]) -> None:
    """Prints a progress line and writes `scalars` to TensorBoard."""
    now, step = time.time(), int(self.step.numpy())
    rate = (step - self._window[1]) / max(now - self._window[0], 1e-9)
    self._window = (now, step)
    text = "  ".join(f"{k} {v:.4f}" for k, v in scalars.items())
    self.print(f"step {step:6d}  {text}  {rate:.1f} steps/s")
    if self.writer is not None:
      with self.writer.as_default(step=step):
        for k, v in {**scalars, "steps_per_sec": rate}.items():
          tf.summary.write(k, tf.constant(v, tf.float32), step=step,
                           metadata=_SCALAR_METADATA)
      self.writer.flush()

  def maybe_save(self, force: bool = False) -> Optional[str]:
    """Saves a checkpoint every `checkpoint_every` steps (or when forced)."""
    step = int(self.step.numpy())
    if self.manager is None or step == self._last_save or not (
        force or step - self._last_save >= self.checkpoint_every):
      return None
    self._last_save = step
    path = self.manager.save(checkpoint_number=step)
    self.print(f"saved checkpoint at step {step}")
    return path


def _task_index() -> int:
  return json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get(
      "index", 0)
