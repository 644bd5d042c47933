"""Migrations: `tf.contrib.recurrent` (`contrib.py`), Lingvo's
`recurrent.Recurrent` (`lingvo.py`) and TF1's `dynamic_rnn` family
(`dynamic.py`), on the op and the engine. The public paths are
`tf_recurrent.contrib`, `tf_recurrent.lingvo` and the top-level
`dynamic_rnn`, `bidirectional_dynamic_rnn`, `raw_rnn`.
"""
