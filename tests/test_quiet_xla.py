"""No assertion op where XLA would drop it: a compiled function's graph
holds no `Assert` (XLA ignores them, logging `assert_op.cc:39] Ignoring
Assert operator ...` per compilation), while the TF graphs keep the op's
run-time checks of lengths."""

import tensorflow as tf

import tf_recurrent
from tpu_examples import train_adding

SMALL = dict(hidden=8, seed=3, learning_rate=1e-2, global_batch=8)


def op_types(concrete) -> list:
  """Every op type of a concrete function, its while bodies and the
  functions it calls (the graph's function library) included."""
  graph_def = concrete.graph.as_graph_def()
  return [n.op for n in graph_def.node] + [
      n.op for f in graph_def.library.function for n in f.node_def]


def cell_fn(theta, state, x):
  return {"h": tf.tanh(x @ theta["w"] + state["h"])}, []


def recurrent_with_tensor_lengths(jit_compile):
  theta = {"w": tf.Variable(tf.ones([3, 4]))}

  @tf.function(jit_compile=jit_compile)
  def loss_and_grad(x, lengths, max_input_length):
    with tf.GradientTape() as tape:
      acc, _ = tf_recurrent.recurrent(
          theta, {"h": tf.zeros([2, 4])}, {"x": x, "y": x}, lambda t, s, i:
          cell_fn(t, s, i["x"] + i["y"]), sequence_length=lengths,
          max_input_length=max_input_length)
      loss = tf.reduce_sum(acc["h"])
    return loss, tape.gradient(loss, theta["w"])

  return loss_and_grad.get_concrete_function(
      tf.TensorSpec([5, 2, 3]), tf.TensorSpec([2], tf.int32),
      tf.TensorSpec([], tf.int32))


def test_the_op_checks_tensor_lengths_at_run_time_outside_xla():
  assert "Assert" in op_types(recurrent_with_tensor_lengths(False))


def test_the_op_emits_no_assert_under_jit_compile():
  assert "Assert" not in op_types(recurrent_with_tensor_lengths(True))


def test_the_main_jobs_compiled_step_emits_no_assert():
  """`python -m tpu_examples.train_adding` compiles its forward/backward
  with XLA: nothing in it may be an assertion XLA ignores."""
  _, _, _, trainer = train_adding.build(tf.distribute.get_strategy(),
                                        **SMALL, jit_compile=True)
  assert trainer.jit_compile
  batch = train_adding.adding_batch(0, 0, 8, 12)
  concrete = trainer.loss_and_grads.get_concrete_function(batch)
  assert "Assert" not in op_types(concrete)
