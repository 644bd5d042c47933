# Copyright 2017 The TensorFlow Authors. All Rights Reserved.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ==============================================================================
"""TF Addons' tensorflow_addons/seq2seq/tests/beam_search_ops_test.py,
ported case by case to tf_recurrent.seq2seq (numbers unchanged), then
gather_tree under XLA (below the ported cases).

Addons ran each case twice (`run_custom_and_py_ops`: its compiled kernel
and its Python fallback); here `gather_tree` has one implementation, plain
TensorFlow ops. Its `test_bad_parent_values_on_gpu` ran on a GPU only
(`with_device(["gpu"])`); the ops here raise on any device, so it runs on
the GPU when there is one, else on the CPU.
"""

import itertools
import re

import numpy as np
import pytest
import tensorflow as tf

from tf_recurrent.seq2seq import gather_tree


@pytest.fixture(autouse=True)
def set_seeds():
    """Addons' autouse fixture: numpy and TF seeded per test."""
    np.random.seed(0)
    tf.random.set_seed(0)


def _transpose_batch_time(x):
    return np.transpose(x, [1, 0, 2]).astype(np.int32)


def test_gather_tree_one():
    # (max_time = 4, batch_size = 1, beams = 3)
    end_token = 10
    step_ids = _transpose_batch_time([[[1, 2, 3], [4, 5, 6], [7, 8, 9], [-1, -1, -1]]])
    parent_ids = _transpose_batch_time(
        [[[0, 0, 0], [0, 1, 1], [2, 1, 2], [-1, -1, -1]]]
    )
    max_sequence_lengths = [3]
    expected_result = _transpose_batch_time(
        [[[2, 2, 2], [6, 5, 6], [7, 8, 9], [10, 10, 10]]]
    )
    beams = gather_tree(
        step_ids=step_ids,
        parent_ids=parent_ids,
        max_sequence_lengths=max_sequence_lengths,
        end_token=end_token,
    )
    np.testing.assert_equal(expected_result, beams.numpy())


def test_bad_parent_values_on_cpu():
    # (batch_size = 1, max_time = 4, beams = 3)
    # bad parent in beam 1 time 1
    end_token = 10
    step_ids = _transpose_batch_time([[[1, 2, 3], [4, 5, 6], [7, 8, 9], [-1, -1, -1]]])
    parent_ids = _transpose_batch_time(
        [[[0, 0, 0], [0, -1, 1], [2, 1, 2], [-1, -1, -1]]]
    )
    max_sequence_lengths = [3]

    with tf.device("/cpu:0"):
        with pytest.raises(tf.errors.InvalidArgumentError, match="parent id"):
            _ = gather_tree(
                step_ids=step_ids,
                parent_ids=parent_ids,
                max_sequence_lengths=max_sequence_lengths,
                end_token=end_token,
            )


def test_bad_parent_values_on_gpu():
    # (max_time = 4, batch_size = 1, beams = 3)
    # bad parent in beam 1 time 1; appears as a negative index at time 0
    end_token = 10
    step_ids = _transpose_batch_time([[[1, 2, 3], [4, 5, 6], [7, 8, 9], [-1, -1, -1]]])
    parent_ids = _transpose_batch_time(
        [[[0, 0, 0], [0, -1, 1], [2, 1, 2], [-1, -1, -1]]]
    )
    max_sequence_lengths = [3]

    device = "/gpu:0" if tf.config.list_logical_devices("GPU") else "/cpu:0"
    with tf.device(device):
        with pytest.raises(tf.errors.InvalidArgumentError, match="parent id"):
            _ = gather_tree(
                step_ids=step_ids,
                parent_ids=parent_ids,
                max_sequence_lengths=max_sequence_lengths,
                end_token=end_token,
            )


def test_gather_tree_batch():
    batch_size = 10
    beam_width = 15
    max_time = 8
    max_sequence_lengths = [0, 1, 2, 4, 7, 8, 9, 10, 11, 0]
    end_token = 5

    step_ids = np.random.randint(
        0, high=end_token + 1, size=(max_time, batch_size, beam_width)
    )
    parent_ids = np.random.randint(
        0, high=beam_width - 1, size=(max_time, batch_size, beam_width)
    )

    beams = gather_tree(
        step_ids=step_ids.astype(np.int32),
        parent_ids=parent_ids.astype(np.int32),
        max_sequence_lengths=max_sequence_lengths,
        end_token=end_token,
    )
    beams = beams.numpy()

    assert (max_time, batch_size, beam_width) == beams.shape
    for b in range(batch_size):
        # Past max_sequence_lengths[b], we emit all end tokens.
        b_value = beams[max_sequence_lengths[b] :, b, :]
        np.testing.assert_allclose(b_value, end_token * np.ones_like(b_value))
    for batch, beam in itertools.product(range(batch_size), range(beam_width)):
        v = np.squeeze(beams[:, batch, beam])
        if end_token in v:
            found_bad = np.where(v == -1)[0]
            assert 0 == len(found_bad)
            found = np.where(v == end_token)[0]
            found = found[0]  # First occurrence of end_token.
            # If an end_token is found, everything before it should be a
            # valid id and everything after it should be end_token.
            if found > 0:
                np.testing.assert_equal(
                    v[: found - 1] >= 0, np.ones_like(v[: found - 1], dtype=bool)
                )
            np.testing.assert_allclose(
                v[found + 1 :], end_token * np.ones_like(v[found + 1 :])
            )


# Not in Addons: gather_tree against the CPU kernel's loops, transcribed
# (custom_ops/seq2seq/cc/kernels/beam_search_ops.cc), and under XLA, where
# nothing can raise, against the GPU kernel's (beam_search_ops_gpu.cu.cc):
# -1 from an invalid parent id back to step 0, no end_token filling there.


def _kernel(step_ids, parent_ids, max_sequence_lengths, end_token, gpu):
    max_time, batch_size, beam_width = step_ids.shape
    beams = np.full_like(step_ids, end_token)
    for batch, beam in itertools.product(range(batch_size), range(beam_width)):
        max_seq_len_b = min(max_time, max_sequence_lengths[batch])
        if max_seq_len_b <= 0:
            continue
        beams[max_seq_len_b - 1, batch, beam] = step_ids[max_seq_len_b - 1, batch, beam]
        parent = parent_ids[max_seq_len_b - 1, batch, beam]
        found_bad = False
        for level in range(max_seq_len_b - 2, -1, -1):
            # The kernels test `parent > beam_width`, reading past the beams
            # at beam_width; gather_tree treats that id as invalid too.
            if parent < 0 or parent >= beam_width:
                if not gpu:
                    raise ValueError("Saw invalid parent id")
                beams[level, batch, beam] = -1
                parent = -1
                found_bad = True
            else:
                beams[level, batch, beam] = step_ids[level, batch, parent]
                parent = parent_ids[level, batch, parent]
        if not found_bad:
            finished = False
            for time in range(max_seq_len_b):
                if finished:
                    beams[time, batch, beam] = end_token
                elif beams[time, batch, beam] == end_token:
                    finished = True
    return beams


def _random_case(rng, invalid, shape=None):
    if shape is None:
        shape = rng.integers(1, 7, size=3)
    max_time, batch_size, beam_width = shape
    end_token = 4
    step_ids = rng.integers(0, end_token + 1, shape)
    low, high = (-1, beam_width + 1) if invalid else (0, beam_width)
    parent_ids = rng.integers(low, high, shape)
    lengths = rng.integers(-1, max_time + 3, (batch_size,))
    return (step_ids.astype(np.int32), parent_ids.astype(np.int32),
            lengths.astype(np.int32), end_token)


@pytest.fixture(scope="module")
def xla_gather_tree():
    return tf.function(gather_tree, jit_compile=True)


def test_gather_tree_matches_the_cpu_kernel():
    rng = np.random.default_rng(1)
    raised = 0
    for case in range(40):
        args = _random_case(rng, invalid=case % 2 == 1)
        try:
            expected = _kernel(*args, gpu=False)
        except ValueError:
            raised += 1
            with pytest.raises(tf.errors.InvalidArgumentError,
                               match="invalid parent id"):
                gather_tree(*args)
            continue
        np.testing.assert_equal(gather_tree(*args).numpy(), expected)
    assert 0 < raised < 20


def test_gather_tree_names_the_bad_parent():
    step_ids = _transpose_batch_time([[[1, 2, 3], [4, 5, 6], [7, 8, 9], [-1, -1, -1]]])
    parent_ids = _transpose_batch_time(
        [[[0, 0, 0], [0, -1, 1], [2, 1, 2], [-1, -1, -1]]])
    # Beam 1 at time 2 points to beam 1 at time 1, whose parent id is -1.
    with pytest.raises(
        tf.errors.InvalidArgumentError,
        match=re.escape("invalid parent id -1 at (time, batch, beam) == "
                        "(0, 0, 1); parent_ids must be in [0, beam_width) "
                        "== [0, 3)")):
        gather_tree(step_ids, parent_ids, [3], 10)
    # In a graph: an assertion, with the same numbers.
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"invalid parent id\] \[-1\] .* \[0 0 1\]"):
        tf.function(gather_tree)(step_ids, parent_ids, [3], 10)


def test_gather_tree_shape_errors():
    ids = np.zeros([3, 2, 4], np.int32)
    with pytest.raises(ValueError, match="step_ids must be a 3-tensor"):
        gather_tree(ids[0], ids[0], [3, 3], 1)
    with pytest.raises(ValueError, match="parent_ids.shape"):
        gather_tree(ids, ids[:, :, :3], [3, 3], 1)
    with pytest.raises(ValueError, match="max_sequence_lengths"):
        gather_tree(ids, ids, [3, 3, 3], 1)
    with pytest.raises(ValueError, match="end_token must be a scalar"):
        gather_tree(ids, ids, [3, 3], [1])


def test_gather_tree_under_xla(xla_gather_tree):
    rng = np.random.default_rng(2)
    bad = 0
    for case in range(20):
        # One shape: one compilation.
        args = _random_case(rng, invalid=case % 2 == 1, shape=(6, 3, 4))
        expected = _kernel(*args, gpu=True)
        bad += (expected == -1).any()
        np.testing.assert_equal(xla_gather_tree(*args).numpy(), expected)
    assert 0 < bad < 20
    # Addons' bad parent case: the GPU kernel's -1s, no error.
    step_ids = _transpose_batch_time(
        [[[1, 2, 3], [4, 5, 6], [7, 8, 9], [-1, -1, -1]]] * 3)
    parent_ids = _transpose_batch_time(
        [[[0, 0, 0], [0, -1, 1], [2, 1, 2], [-1, -1, -1]]] * 3)
    step_ids = np.pad(step_ids, ((0, 2), (0, 0), (0, 1)))
    parent_ids = np.pad(parent_ids, ((0, 2), (0, 0), (0, 1)))
    got = xla_gather_tree(step_ids, parent_ids, [3, 3, 3], 10).numpy()
    np.testing.assert_equal(
        got[:4, 0, :3], [[2, -1, 2], [6, 5, 6], [7, 8, 9], [10, 10, 10]])
