"""The engine: one function, `run`, runs a Keras cell over a sequence.

Below the Keras layers and the functional APIs, above the chunked loops
and the op. `dispatch.py` chooses the loop (its `run`'s docstring has the
table); `built_in.py` holds the cells the chunked loops run and calls
them; `generic.py` runs any other Keras cell on the op; `inference.py`
holds the loops TFLite converts; `tracking.py` has `tf.train.Checkpoint`
follow the layers a Keras 3 layer keeps in a list.
"""

from tf_recurrent.engine.dispatch import run

__all__ = ["run"]
