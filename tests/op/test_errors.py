"""Bad input is rejected before any loop runs, naming the part at fault."""

import numpy as np
import pytest
import tensorflow as tf

import tf_recurrent


def cell(theta, state, x):
  return {"h": state["h"] + x}, []


STATE = {"h": tf.zeros([2])}
INPUTS = tf.ones([3, 2])


def test_non_callable_cell_fn():
  with pytest.raises(TypeError, match="cell_fn must be callable; got int"):
    tf_recurrent.recurrent({}, STATE, INPUTS, 3)


def test_non_callable_cell_grad():
  with pytest.raises(TypeError, match="cell_grad must be callable"):
    tf_recurrent.recurrent({}, STATE, INPUTS, cell, cell_grad="grad")


def test_inputs_disagree_on_length():
  with pytest.raises(ValueError, match=r"inputs\['a'\] has 3 and "
                     r"inputs\['b'\] has 4"):
    tf_recurrent.recurrent({}, STATE, {"a": INPUTS, "b": tf.ones([4, 2])},
                           lambda t, s, x: cell(t, s, x["a"]))


def test_scalar_input_leaf():
  with pytest.raises(ValueError, match=r"inputs\[1\] is a scalar"):
    tf_recurrent.recurrent({}, STATE, [INPUTS, tf.constant(1.0)],
                           lambda t, s, x: cell(t, s, x[0]))


def test_empty_inputs():
  with pytest.raises(ValueError, match="inputs must hold at least one tensor"):
    tf_recurrent.recurrent({}, STATE, [], cell)


def test_unconvertible_leaf():
  with pytest.raises(TypeError, match=r"theta\['w'\] must be a tensor"):
    tf_recurrent.recurrent({"w": object()}, STATE, INPUTS, cell)


def test_state_structure_mismatch():
  with pytest.raises(ValueError, match=r"state1 cell_fn returned does not "
                     r"match the structure of state0: missing leaves \['h'\]"
                     r"|missing leaves \[\"\['h'\]\"\]"):
    tf_recurrent.recurrent({}, STATE, INPUTS,
                           lambda t, s, x: ({"g": s["h"]}, []))


def test_state_dtype_mismatch():
  with pytest.raises(ValueError, match=r"state0\['h'\] has dtype float64, "
                     "expected float32"):
    tf_recurrent.recurrent({}, STATE, INPUTS, lambda t, s, x: (
        {"h": tf.cast(s["h"], tf.float64)}, []))


def test_state_shape_mismatch():
  with pytest.raises(ValueError, match=r"state0\['h'\] has shape \(2, 2\), "
                     r"expected \(2,\)"):
    tf_recurrent.recurrent({}, STATE, INPUTS, lambda t, s, x: (
        {"h": tf.stack([s["h"], x])}, []))


def test_cell_fn_must_return_a_pair():
  with pytest.raises(ValueError, match=r"cell_fn must return a pair"):
    tf_recurrent.recurrent({}, STATE, INPUTS, lambda t, s, x: {"h": s["h"]})


def test_extras_mismatch():
  with pytest.raises(ValueError, match=r"extras cell_fn returned.*extras\['e'\]"
                     r" has dtype float32, expected int32"):
    tf_recurrent.recurrent(
        {}, STATE, INPUTS, lambda t, s, x: ({"h": s["h"]}, {"e": x}),
        extras={"e": tf.zeros([2], tf.int32)})


@pytest.mark.parametrize("with_grad", [False, True])
def test_extras_leaf_that_is_not_a_tensor(with_grad):
  def cell(theta, state, x):
    return {"h": state["h"] + x}, {"a": None, "b": state["h"], "c": 1.5}

  def grad(theta, state, x, extras, dstate1):
    return {}, dstate1, dstate1["h"]

  with pytest.raises(ValueError, match=r"extras\['a'\] is None; "
                     r"extras\['c'\] is 1.5\. Return a tensor"):
    tf_recurrent.recurrent({}, {"h": tf.zeros([2])}, tf.ones([3, 2]), cell,
                           grad if with_grad else None)


def test_cell_grad_wrong_structure():
  def grad(theta, state0, x, extras, dstate1):
    return {}, {"h": dstate1["h"], "c": dstate1["h"]}, x

  with pytest.raises(ValueError, match=r"dstate0 cell_grad returned does not "
                     r"match the structure of state0: unexpected leaves"):
    tf_recurrent.recurrent({}, STATE, INPUTS, cell, cell_grad=grad)


def test_cell_grad_wrong_arity():
  with pytest.raises(ValueError, match="cell_grad must return a triple"):
    tf_recurrent.recurrent({}, STATE, INPUTS, cell,
                           cell_grad=lambda *a: ({}, a[-1]))


@pytest.mark.parametrize("length", [-1, 4])
def test_max_input_length_out_of_range(length):
  with pytest.raises(ValueError, match=r"max_input_length must be in \[0, "
                     rf"T=3\]; got {length}"):
    tf_recurrent.recurrent({}, STATE, INPUTS, cell, max_input_length=length)


def test_stateful_random_op_rejected_under_default_gradient():
  def noisy(theta, state, x):
    return {"h": state["h"] + tf.nn.dropout(x, 0.5)}, []

  with pytest.raises(ValueError, match="stateful random ops.*step_seed"):
    tf_recurrent.recurrent({}, STATE, INPUTS, noisy)


def test_custom_grad_with_closed_over_tensor_rejected():
  scale = tf.constant(2.0)

  def scaled(theta, state, x):
    return {"h": state["h"] * scale + x}, []

  def grad(theta, state0, x, extras, dstate1):
    return {}, {"h": dstate1["h"] * scale}, dstate1["h"]

  with pytest.raises(ValueError, match="closes over tensors.*Pass them in "
                     "theta"):
    tf_recurrent.recurrent({}, STATE, INPUTS, scaled, cell_grad=grad)


def test_custom_grad_with_closed_over_variable_rejected():
  w = tf.Variable(2.0, name="closure_w")

  def scaled(theta, state, x):
    return {"h": state["h"] * w + x}, []

  with pytest.raises(ValueError, match=r"reads trainable variables "
                     r"\['closure_w:0'\]"):
    tf_recurrent.recurrent({}, STATE, INPUTS, scaled,
                           cell_grad=lambda *a: ({}, a[-1], a[-1]["h"]))


def test_bad_seed():
  with pytest.raises(ValueError, match="seed must be an int32 or int64"):
    tf_recurrent.recurrent({}, STATE, INPUTS, cell, seed=[1.0, 2.0])


def test_variable_assignment_rejected_under_default_gradient():
  counter = tf.Variable(0.0)

  def counting(theta, state, x):
    counter.assign_add(1.0)
    return {"h": state["h"] + x}, []

  with pytest.raises(ValueError, match="assigns to variables"):
    tf_recurrent.recurrent({}, STATE, INPUTS, counting)


# The loop options. Batch of 2 (state [2]), T=3: inputs [3, 2].

@pytest.mark.parametrize("lengths,message", [
    ([[1, 2]], r"sequence_length must be a \[batch\] vector of integers"),
    ([1.0, 2.0], r"sequence_length must be a \[batch\] vector of integers"),
    ([1, 2, 3], r"sequence_length has 3 entries but state0\['h'\] has batch "
                r"size 2"),
    ([-1, 2], r"sequence_length must be >= 0; got \[-1, 2\]"),
    ([1, 4], r"sequence_length must be <= T=3; got \[1, 4\]"),
])
def test_bad_sequence_length(lengths, message):
  with pytest.raises(ValueError, match=message):
    tf_recurrent.recurrent({}, STATE, INPUTS, cell, sequence_length=lengths)


def test_sequence_length_needs_a_batch_axis_on_inputs():
  with pytest.raises(ValueError, match=r"With sequence_length, inputs\['x0'\] "
                     r"must have shape \[T, batch, ...\]"):
    tf_recurrent.recurrent({}, STATE, {"x": INPUTS, "x0": tf.ones([3])},
                           lambda t, s, x: cell(t, s, x["x"]),
                           sequence_length=[1, 2])


def run_with_values_known_at_run_time(graph, build, specs, values):
  """`build(*tensors)` with its arguments fed only when the graph runs.

  graph: "function" (a tf.function with an input signature) or "tf1" (a
  `tf.compat.v1` graph, placeholders and a Session, as Lingvo runs).
  """
  if graph == "function":
    return tf.function(build, input_signature=specs)(*values)
  with tf.Graph().as_default():
    placeholders = [tf.compat.v1.placeholder(s.dtype, s.shape) for s in specs]
    result = build(*placeholders)
    with tf.compat.v1.Session() as session:
      return session.run(result, dict(zip(placeholders, values)))


RUN_TIME_CHECKS = [
    # (keyword, value fed, message); T=3, batch 2.
    ("max_input_length", 5, "max_input_length exceeds T, the number of steps "
     "of the inputs"),
    ("max_input_length", -1, "max_input_length must be >= 0"),
    ("sequence_length", [4, 0], "sequence_length exceeds T, the number of "
     "steps of the inputs"),
    ("sequence_length", [-1, 0], "sequence_length must be >= 0"),
]


@pytest.mark.parametrize("graph", ["function", "tf1"])
@pytest.mark.parametrize("keyword,value,message", RUN_TIME_CHECKS)
def test_values_known_at_run_time_are_checked(graph, keyword, value, message):
  spec = tf.TensorSpec([2] if keyword == "sequence_length" else [], tf.int32)

  def build(argument):
    return tf_recurrent.recurrent({}, {"h": tf.zeros([2])}, tf.ones([3, 2]),
                                  cell, **{keyword: argument})[1]

  good = [3, 0] if keyword == "sequence_length" else 3
  final = run_with_values_known_at_run_time(graph, build, [spec], [good])
  np.testing.assert_allclose(final["h"], [3, 0] if keyword ==
                             "sequence_length" else [3, 3])
  with pytest.raises(tf.errors.InvalidArgumentError, match=message):
    run_with_values_known_at_run_time(graph, build, [spec], [value])


@pytest.mark.parametrize("graph", ["function", "tf1"])
def test_inputs_disagreeing_on_t_at_run_time(graph):
  specs = [tf.TensorSpec([None, 2], tf.float32)] * 2

  def build(x, y):
    return tf_recurrent.recurrent(
        {}, {"h": tf.zeros([2])}, {"x": x, "y": y},
        lambda t, s, inp: ({"h": s["h"] + inp["x"] + inp["y"]}, []))[1]

  with pytest.raises(tf.errors.InvalidArgumentError,
                     match="inputs disagree on the number of steps T"):
    run_with_values_known_at_run_time(graph, build, specs,
                                      [np.ones([3, 2]), np.ones([4, 2])])


@pytest.mark.parametrize("every", [0, -2, 1.5, "log", True])
def test_bad_checkpoint_every(every):
  with pytest.raises(ValueError, match=r"checkpoint_every must be None, an "
                     r"int >= 1 or \"sqrt\"; got"):
    tf_recurrent.recurrent({}, STATE, INPUTS, cell, checkpoint_every=every)


@pytest.mark.parametrize("result,message", [
    (lambda s: s["h"] > 0, r"stop_fn must return a scalar bool .* got "
                           r"bool\[2\]"),
    (lambda s: tf.reduce_sum(s["h"]), r"stop_fn must return a scalar bool .*"
                                      r"got float32\[\]"),
    (lambda s: "yes", r"stop_fn must return a scalar bool"),
])
def test_bad_stop_fn(result, message):
  with pytest.raises(ValueError, match=message):
    tf_recurrent.recurrent({}, STATE, INPUTS, cell,
                           stop_fn=lambda t, theta, s: result(s))


def test_non_callable_stop_fn():
  with pytest.raises(TypeError, match="stop_fn must be callable or None"):
    tf_recurrent.recurrent({}, STATE, INPUTS, cell, stop_fn=True)


def test_batch_major_needs_rank_two():
  with pytest.raises(ValueError, match=r"With time_major=False, inputs must "
                     r"have shape \[batch, T, ...\]"):
    tf_recurrent.recurrent({}, STATE, tf.ones([3]), cell, time_major=False)


@pytest.mark.parametrize("accumulate_state,message", [
    ({"h": 1}, r"accumulate_state\['h'\] must be a bool"),
    ({"g": True}, r"accumulate_state does not match the structure of state0"),
    ([True, False], r"accumulate_state does not match the structure of "
     r"state0"),
])
def test_accumulate_state_not_bools_like_state0(accumulate_state, message):
  with pytest.raises(ValueError, match=message):
    tf_recurrent.recurrent({}, STATE, INPUTS, cell,
                           accumulate_state=accumulate_state)
