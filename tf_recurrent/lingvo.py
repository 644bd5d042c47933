"""`tf_recurrent.lingvo`, the public path of `tf_recurrent.compat.lingvo`:
Lingvo's `recurrent.Recurrent` (`from tf_recurrent import lingvo as
recurrent`)."""

from tf_recurrent.compat.lingvo import Recurrent

__all__ = ["Recurrent"]
