"""tf_recurrent: recurrent models in TensorFlow 2 whose backward pass keeps only
per-step states.

Example:

>>> import tensorflow as tf
>>> import tf_recurrent
>>> def cell_fn(theta, state, x):
...   return {"h": tf.tanh(x @ theta["w"] + state["h"])}, []
>>> acc, final = tf_recurrent.recurrent(
...     theta={"w": tf.ones([3, 4])}, state0={"h": tf.zeros([2, 4])},
...     inputs=tf.ones([5, 2, 3]), cell_fn=cell_fn)
>>> acc["h"].shape
TensorShape([5, 2, 4])
"""

from tf_recurrent import cells  # pylint: disable=unused-import  # tf_recurrent.cells
from tf_recurrent import contrib
from tf_recurrent import lingvo
from tf_recurrent import seq2seq
from tf_recurrent import serving  # pylint: disable=unused-import  # tf_recurrent.serving
from tf_recurrent import tflite
from tf_recurrent.compat.dynamic import bidirectional_dynamic_rnn
from tf_recurrent.compat.dynamic import dynamic_rnn
from tf_recurrent.compat.dynamic import raw_rnn
from tf_recurrent.export.serving import export as export_saved_model
from tf_recurrent.export.serving import StreamingModule
from tf_recurrent.layers.griffin import GriffinBlock
from tf_recurrent.layers.griffin import GriffinBlockCell
from tf_recurrent.layers.layer_norm import LayerNormLSTM
from tf_recurrent.layers.layer_norm import LayerNormLSTMCell
from tf_recurrent.layers.layer_norm import LayerNormSimpleRNN
from tf_recurrent.layers.layer_norm import LayerNormSimpleRNNCell
from tf_recurrent.layers.linear import MinGRU
from tf_recurrent.layers.linear import MinGRUCell
from tf_recurrent.layers.linear import MinLSTM
from tf_recurrent.layers.linear import MinLSTMCell
from tf_recurrent.layers.linear import RGLRU
from tf_recurrent.layers.linear import RGLRUCell
from tf_recurrent.layers.linear import RGLRUDecay
from tf_recurrent.layers.peephole import PeepholeLSTM
from tf_recurrent.layers.peephole import PeepholeLSTMCell
from tf_recurrent.layers.projection import ProjectedLSTM
from tf_recurrent.layers.projection import ProjectedLSTMCell
from tf_recurrent.layers.rnn import ConvLSTM1D
from tf_recurrent.layers.rnn import ConvLSTM2D
from tf_recurrent.layers.rnn import ConvLSTM3D
from tf_recurrent.layers.rnn import GRU
from tf_recurrent.layers.rnn import LSTM
from tf_recurrent.layers.rnn import RNN
from tf_recurrent.layers.rnn import SimpleRNN
from tf_recurrent.layers.zoneout import ZoneoutGRU
from tf_recurrent.layers.zoneout import ZoneoutGRUCell
from tf_recurrent.layers.zoneout import ZoneoutLSTM
from tf_recurrent.layers.zoneout import ZoneoutLSTMCell
from tf_recurrent.linear.scan import linear_scan
from tf_recurrent.op.bidirectional import bidirectional
from tf_recurrent.op.op import Recurrent
from tf_recurrent.op.op import recurrent
from tf_recurrent.op.seeds import step_seed

__all__ = ["recurrent", "Recurrent", "bidirectional", "step_seed", "RNN", "LSTM", "GRU",
           "SimpleRNN", "ConvLSTM1D", "ConvLSTM2D", "ConvLSTM3D", "PeepholeLSTM", "PeepholeLSTMCell",
           "LayerNormLSTM", "LayerNormLSTMCell", "LayerNormSimpleRNN",
           "LayerNormSimpleRNNCell", "ProjectedLSTM", "ProjectedLSTMCell",
           "ZoneoutLSTM", "ZoneoutLSTMCell", "ZoneoutGRU", "ZoneoutGRUCell",
           "StreamingModule", "export_saved_model",
           "lingvo", "contrib", "dynamic_rnn", "bidirectional_dynamic_rnn",
           "raw_rnn", "tflite", "seq2seq", "linear_scan", "MinGRU", "MinGRUCell",
           "MinLSTM", "MinLSTMCell", "RGLRU", "RGLRUCell", "RGLRUDecay",
           "GriffinBlock", "GriffinBlockCell"]
__version__ = "0.1.0"
