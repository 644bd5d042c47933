"""`tf_recurrent.tflite`, the public path of TFLite export: `convert`,
`op_names`, `without_cell_clip` (`tf_recurrent.export.tflite`) and the
convertible loops the layers' inference calls run
(`tf_recurrent.engine.inference`)."""

from tf_recurrent.engine.inference import lstm_function
from tf_recurrent.engine.inference import no_tape_records
from tf_recurrent.engine.inference import run_cell
from tf_recurrent.engine.inference import takes_inference_path
from tf_recurrent.export.tflite import convert
from tf_recurrent.export.tflite import op_names
from tf_recurrent.export.tflite import without_cell_clip

__all__ = ["convert", "op_names", "without_cell_clip", "lstm_function",
           "run_cell", "no_tape_records", "takes_inference_path"]
