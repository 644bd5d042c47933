"""`BasicDecoder`: a cell, a sampler and an optional output layer, stepped
by `dynamic_decode` (TF Addons' `tfa.seq2seq.BasicDecoder`)."""

import collections
from typing import Optional

import keras
import tensorflow as tf

from tf_recurrent.seq2seq import decoder
from tf_recurrent.seq2seq import sampler as sampler_py


class BasicDecoderOutput(
    collections.namedtuple("BasicDecoderOutput", ("rnn_output", "sample_id"))):
  """A `BasicDecoder`'s per-step outputs: the (projected) cell output and
  the sampler's ids.

  Example:

  >>> BasicDecoderOutput(rnn_output=1, sample_id=2).sample_id
  2
  """


class BasicDecoder(decoder.BaseDecoder):
  """Steps `cell` on inputs chosen by `sampler`; calling it decodes.

  `decoder(inputs, initial_state=..., **sampler kwargs)` runs
  `dynamic_decode` and returns `(BasicDecoderOutput, final state, lengths)`.

  Args:
    cell: A Keras cell (or `AttentionWrapper`).
    sampler: A `Sampler`.
    output_layer: Optional layer applied to the cell's output (e.g. the
      vocabulary projection) before sampling.
    **kwargs: `BaseDecoder`'s arguments (`maximum_iterations`,
      `impute_finished`, `output_time_major`, ...) and Keras's.

  Example:

  >>> decoder = BasicDecoder(keras.layers.SimpleRNNCell(4),
  ...                        sampler_py.TrainingSampler())
  >>> outputs, state, lengths = decoder(tf.ones([2, 3, 5]),
  ...                                   initial_state=[tf.zeros([2, 4])])
  >>> outputs.rnn_output.shape, outputs.sample_id.shape
  (TensorShape([2, 3, 4]), TensorShape([2, 3]))
  """

  def __init__(self, cell: keras.layers.Layer, sampler: sampler_py.Sampler,
               output_layer: Optional[keras.layers.Layer] = None, **kwargs):
    if not ("state_size" in dir(cell) and callable(cell)):
      raise TypeError("The argument 'cell' must be an RNN cell (a layer with "
                      f"state_size and call(inputs, states)); got {cell!r}.")
    if not isinstance(sampler, sampler_py.Sampler):
      raise TypeError(f"sampler must be a Sampler; got {sampler!r}.")
    super().__init__(**kwargs)
    self.cell = cell
    self.sampler = sampler
    self.output_layer = output_layer

  def initialize(self, inputs, initial_state=None, **kwargs):
    self._cell_dtype = tf.nest.flatten(initial_state)[0].dtype
    return self.sampler.initialize(inputs, **kwargs) + (initial_state,)

  @property
  def batch_size(self):
    return self.sampler.batch_size

  def _rnn_output_size(self):
    size = tf.TensorShape(self.cell.output_size)
    if self.output_layer is None:
      return size
    shape = self.output_layer.compute_output_shape(
        tuple([None] + size.as_list()))
    return tf.TensorShape(shape[1:])

  @property
  def output_size(self):
    return BasicDecoderOutput(rnn_output=self._rnn_output_size(),
                              sample_id=self.sampler.sample_ids_shape)

  @property
  def output_dtype(self):
    dtype = self._cell_dtype
    return BasicDecoderOutput(
        tf.nest.map_structure(lambda _: dtype, self._rnn_output_size()),
        self.sampler.sample_ids_dtype)

  def step(self, time, inputs, state, training=None):
    kwargs = ({"training": training}
              if getattr(self.cell, "_call_has_training_arg", False) else {})
    cell_outputs, cell_state = self.cell(inputs, state, **kwargs)
    cell_state = tf.nest.pack_sequence_as(state, tf.nest.flatten(cell_state))
    if self.output_layer is not None:
      cell_outputs = self.output_layer(cell_outputs)
    sample_ids = self.sampler.sample(time=time, outputs=cell_outputs,
                                     state=cell_state)
    finished, next_inputs, next_state = self.sampler.next_inputs(
        time=time, outputs=cell_outputs, state=cell_state,
        sample_ids=sample_ids)
    return (BasicDecoderOutput(cell_outputs, sample_ids), next_state,
            next_inputs, finished)
