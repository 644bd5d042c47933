"""`tf_recurrent.serving`, the public path of `tf_recurrent.export.serving`:
streaming SavedModels of recurrent Keras models."""

from tf_recurrent.export.serving import export
from tf_recurrent.export.serving import StreamingModule

__all__ = ["StreamingModule", "export"]
