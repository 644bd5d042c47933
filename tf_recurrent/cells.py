"""`tf_recurrent.cells`, the public path of `tf_recurrent.op.cells`: LSTM,
GRU and SimpleRNN steps with hand-written gradients for `recurrent`."""

from tf_recurrent.op.cells import gru_gate_grads
from tf_recurrent.op.cells import gru_grad
from tf_recurrent.op.cells import gru_step
from tf_recurrent.op.cells import lstm_gate_grads
from tf_recurrent.op.cells import lstm_grad
from tf_recurrent.op.cells import lstm_state
from tf_recurrent.op.cells import lstm_step
from tf_recurrent.op.cells import masked
from tf_recurrent.op.cells import project_inputs
from tf_recurrent.op.cells import recomputing
from tf_recurrent.op.cells import simple_rnn_grad
from tf_recurrent.op.cells import simple_rnn_step

__all__ = ["project_inputs", "lstm_state", "lstm_gate_grads",
           "gru_gate_grads", "lstm_step", "lstm_grad", "gru_step", "gru_grad",
           "simple_rnn_step", "simple_rnn_grad", "recomputing", "masked"]
