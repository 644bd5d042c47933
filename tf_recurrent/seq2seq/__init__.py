"""`tf_recurrent.seq2seq`: TF Addons' `tfa.seq2seq` for Keras 3.

Attention mechanisms and `AttentionWrapper`, samplers, `BasicDecoder`,
`BeamSearchDecoder` (its `gather_tree` in plain TensorFlow ops, XLA-
compilable), `dynamic_decode`, `tile_batch` and `sequence_loss`, with
Addons' names, signatures, defaults and semantics. A teacher-forced `AttentionWrapper`
trains on the op through `tf_recurrent.RNN(AttentionWrapper(...))` (only
the state kept per step); `dynamic_decode` runs inference in a
`tf.while_loop`.

Example:

>>> import keras
>>> import tensorflow as tf
>>> import tf_recurrent
>>> from tf_recurrent import seq2seq
>>> mechanism = seq2seq.BahdanauAttention(8, memory=tf.ones([2, 6, 5]))
>>> cell = seq2seq.AttentionWrapper(keras.layers.LSTMCell(8), mechanism,
...                                 attention_layer_size=8)
>>> tf_recurrent.RNN(cell, return_sequences=True)(tf.ones([2, 4, 3])).shape
TensorShape([2, 4, 8])
"""

from tf_recurrent.seq2seq.attention import AttentionMechanism
from tf_recurrent.seq2seq.attention import BahdanauAttention
from tf_recurrent.seq2seq.attention import BahdanauMonotonicAttention
from tf_recurrent.seq2seq.attention import hardmax
from tf_recurrent.seq2seq.attention import LuongAttention
from tf_recurrent.seq2seq.attention import LuongMonotonicAttention
from tf_recurrent.seq2seq.attention import monotonic_attention
from tf_recurrent.seq2seq.attention import safe_cumprod
from tf_recurrent.seq2seq.attention_wrapper import AttentionWrapper
from tf_recurrent.seq2seq.attention_wrapper import AttentionWrapperState
from tf_recurrent.seq2seq.basic_decoder import BasicDecoder
from tf_recurrent.seq2seq.basic_decoder import BasicDecoderOutput
from tf_recurrent.seq2seq.beam_search_decoder import BeamSearchDecoder
from tf_recurrent.seq2seq.beam_search_decoder import BeamSearchDecoderMixin
from tf_recurrent.seq2seq.beam_search_decoder import BeamSearchDecoderOutput
from tf_recurrent.seq2seq.beam_search_decoder import BeamSearchDecoderState
from tf_recurrent.seq2seq.beam_search_decoder import FinalBeamSearchDecoderOutput
from tf_recurrent.seq2seq.beam_search_decoder import gather_tree_from_array
from tf_recurrent.seq2seq.beam_search_ops import gather_tree
from tf_recurrent.seq2seq.decoder import BaseDecoder
from tf_recurrent.seq2seq.decoder import Decoder
from tf_recurrent.seq2seq.decoder import dynamic_decode
from tf_recurrent.seq2seq.helpers import tile_batch
from tf_recurrent.seq2seq.loss import sequence_loss
from tf_recurrent.seq2seq.loss import SequenceLoss
from tf_recurrent.seq2seq.sampler import CustomSampler
from tf_recurrent.seq2seq.sampler import GreedyEmbeddingSampler
from tf_recurrent.seq2seq.sampler import InferenceSampler
from tf_recurrent.seq2seq.sampler import Sampler
from tf_recurrent.seq2seq.sampler import SampleEmbeddingSampler
from tf_recurrent.seq2seq.sampler import ScheduledEmbeddingTrainingSampler
from tf_recurrent.seq2seq.sampler import ScheduledOutputTrainingSampler
from tf_recurrent.seq2seq.sampler import TrainingSampler

__all__ = [
    "AttentionMechanism", "AttentionWrapper", "AttentionWrapperState",
    "BahdanauAttention", "BahdanauMonotonicAttention", "BaseDecoder",
    "BasicDecoder", "BasicDecoderOutput", "BeamSearchDecoder",
    "BeamSearchDecoderMixin", "BeamSearchDecoderOutput",
    "BeamSearchDecoderState", "CustomSampler", "Decoder",
    "FinalBeamSearchDecoderOutput", "GreedyEmbeddingSampler",
    "InferenceSampler", "LuongAttention", "LuongMonotonicAttention",
    "SampleEmbeddingSampler", "Sampler", "ScheduledEmbeddingTrainingSampler",
    "ScheduledOutputTrainingSampler", "SequenceLoss", "TrainingSampler",
    "dynamic_decode", "gather_tree", "gather_tree_from_array", "hardmax",
    "monotonic_attention", "safe_cumprod", "sequence_loss", "tile_batch",
]
