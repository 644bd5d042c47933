"""`tf_recurrent.contrib`, the public path of `tf_recurrent.compat.contrib`:
`tf.contrib.recurrent`'s names (`from tf_recurrent import contrib as
recurrent`)."""

from tf_recurrent.compat.contrib import bidirectional_functional_rnn
from tf_recurrent.compat.contrib import functional_rnn
from tf_recurrent.compat.contrib import Recurrent

__all__ = ["Recurrent", "functional_rnn", "bidirectional_functional_rnn"]
