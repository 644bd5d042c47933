"""Export: TFLite conversion (`tflite.py`) and streaming SavedModels
(`serving.py`). The public paths are `tf_recurrent.tflite` and
`tf_recurrent.serving` (and the top-level `StreamingModule`,
`export_saved_model`).
"""
