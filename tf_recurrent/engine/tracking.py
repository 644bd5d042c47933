"""`tf.train.Checkpoint` tracking of the layers a Keras 3 layer keeps in a list.

Keras 3 wraps a list attribute of a layer in its own `TrackedList`: Keras
follows it (the layer's weights, `.keras` and `.weights.h5` files), but
TensorFlow's checkpoints do not, as they follow a `tf.Module`'s lists, so
`tf.train.Checkpoint` silently skips every layer and variable held only
there (a restore leaves them at their initial values; keras-team/keras
has the same loss in `StackedRNNCells`). `track_list` adds the list as the
checkpoint dependency TensorFlow would have made of it, under the
attribute's name (`name/0/...`, `name/1/...`: the paths of TF Addons' and
tf.keras's checkpoints), and leaves the attribute itself to Keras.
"""

import keras
import tensorflow as tf


def track_list(owner: keras.layers.Layer, name: str) -> None:
  """Makes `tf.train.Checkpoint` follow the list `owner.<name>`.

  Call it after assigning the list; the checkpoint keeps the items as they
  are at the call (the list must not change afterwards). A later call
  replaces the dependency. `None` tracks nothing.

  Args:
    owner: The layer holding the list.
    name: The attribute's name, the items' path in checkpoints.

  Example:

  >>> class Stack(keras.layers.Layer):
  ...   def __init__(self):
  ...     super().__init__()
  ...     self.denses = [keras.layers.Dense(2), keras.layers.Dense(3)]
  ...     track_list(self, "denses")
  >>> stack = Stack()
  >>> for dense in stack.denses:
  ...   dense.build((None, 4))
  >>> import os, tempfile
  >>> path = tf.train.Checkpoint(stack=stack).write(
  ...     os.path.join(tempfile.mkdtemp(), "stack"))
  >>> sorted(name for name, _ in tf.train.list_variables(path)
  ...        if name.startswith("stack/"))[:2]
  ['stack/denses/0/_kernel/.ATTRIBUTES/VARIABLE_VALUE', 'stack/denses/0/bias/.ATTRIBUTES/VARIABLE_VALUE']
  """
  items = getattr(owner, name)
  if items is None:
    return
  # TensorFlow's own tracking of `self.<name> = [...]` on a tf.Module: a
  # ListWrapper over the items, a dependency named `name`. Its result is
  # not stored: the attribute stays Keras's list.
  tf.__internal__.tracking.sticky_attribute_assignment(
      trackable=owner, name=name, value=list(items))
