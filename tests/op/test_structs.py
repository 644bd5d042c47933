"""Structure helpers: leaf paths and messages that name the leaf at fault."""

import collections

import pytest
import tensorflow as tf

from tf_recurrent.op import structs

Point = collections.namedtuple("Point", "x y")


def test_leaf_paths_follow_nest_order():
  struct = {"b": Point(1, [2, 3]), "a": (4,)}
  assert structs.leaf_paths(struct, "s") == [
      "s['a'][0]", "s['b'].x", "s['b'].y[0]", "s['b'].y[1]"]
  assert len(tf.nest.flatten(struct)) == 4


def test_same_structure_accepts_other_sequence_types():
  structs.check_same_structure((1, [2]), [1, (2,)], "state0", "state1")


def test_dict_keys_must_match():
  with pytest.raises(ValueError, match=r"missing leaves \[\"\['a'\]\"\]; "
                     r"unexpected leaves \[\"\['b'\]\"\]"):
    structs.check_same_structure({"a": 1}, {"b": 1}, "state0", "state1")


def test_leaf_mismatch_names_path_and_dtypes():
  with pytest.raises(ValueError, match=r"state0\.y has dtype int32, expected "
                     "float32"):
    structs.check_leaves_match(
        Point(tf.zeros([2]), tf.zeros([])), Point(tf.zeros([2]),
                                                  tf.constant(1)),
        "state0", "state1")


def test_every_mismatching_leaf_is_listed_with_the_remedy():
  expected = {"a": tf.zeros([2]), "b": tf.zeros([]), "c": tf.zeros([3])}
  actual = {"a": tf.zeros([2], tf.float64), "b": tf.zeros([]),
            "c": tf.zeros([4])}
  with pytest.raises(ValueError) as error:
    structs.check_leaves_match(expected, actual, "state0", "state1")
  message = str(error.value)
  assert message.startswith("state1 differs from state0 in 2 leaves: ")
  assert "state0['a'] has dtype float64, expected float32" in message
  assert "state0['c'] has shape (4,), expected (3,)" in message
  assert "state0['b']" not in message
  assert message.endswith("Return one tensor per leaf of state0, of its dtype "
                          "(tf.cast) and a compatible static shape.")


def test_none_allowed_only_when_asked():
  structs.check_leaves_match([tf.zeros([1])], [None], "theta", "dtheta",
                             allow_none=True)
  with pytest.raises(ValueError, match=r"theta\[0\] should be a tensor"):
    structs.check_leaves_match([tf.zeros([1])], [None], "theta", "dtheta")


def test_to_tensors_reads_variables_and_names_bad_leaves():
  v = tf.Variable([1.0])
  out = structs.to_tensors({"v": v, "n": 3}, "theta")
  assert isinstance(out["v"], tf.Tensor) and out["n"].dtype == tf.int32
  with pytest.raises(TypeError, match=r"theta\['bad'\] must be a tensor"):
    structs.to_tensors({"bad": object()}, "theta")
