r"""Trains the adding-problem LSTM as a Keras model and exports it for serving.

The SavedModel has a whole-sequence signature (`serving_default`), an
`initial_state` signature and a one-step `step` signature for token-by-token
serving (see `tf_recurrent.export_saved_model`). The script prints the
`saved_model_cli run` command that serves a sample batch it writes beside the
model.

Example:

    python -m tpu_examples.export_saved_model --export_dir=/tmp/adding_model
"""

import os

from absl import app
from absl import flags
import keras
import numpy as np

import tf_recurrent
from tpu_examples import strategy as strategy_lib
from tpu_examples import train_adding

FLAGS = flags.FLAGS
flags.DEFINE_integer("train_steps", 400, "Training steps before export.")
flags.DEFINE_integer("export_seq_len", 50, "Sequence length to train on.")


def trained_model(steps: int, seq_len: int, hidden: int = 32) -> keras.Model:
  """A Keras LSTM regressor on the adding problem, trained for `steps`."""
  model = keras.Sequential([
      keras.Input((None, 2)),
      tf_recurrent.LSTM(hidden),
      keras.layers.Dense(1),
  ])
  model.compile(keras.optimizers.Adam(3e-3), "mse", jit_compile=True)
  for step in range(steps):
    x, y = train_adding.adding_batch(0, step, 64, seq_len)
    model.train_on_batch(x.numpy(), y.numpy())
  return model


def main(argv):
  del argv
  model = trained_model(FLAGS.train_steps, FLAGS.export_seq_len)
  x, y = train_adding.adding_batch(1, 0, 4, FLAGS.export_seq_len)
  batch_major = x.numpy()
  mse = float(np.mean((model.predict(batch_major, verbose=0) - y) ** 2))
  tf_recurrent.export_saved_model(model, FLAGS.export_dir)
  sample = os.path.join(FLAGS.export_dir, "sample_inputs.npy")
  np.save(sample, batch_major)
  print(f"exported to {FLAGS.export_dir} (sample MSE {mse:.4f}); serve it with:")
  print(f"  saved_model_cli run --dir {FLAGS.export_dir} --tag_set serve "
        f"--signature_def serving_default --inputs inputs={sample}")


if __name__ == "__main__":
  strategy_lib.set_job_defaults(export_dir="/tmp/tf_recurrent_adding")
  app.run(main)
