"""The benchmark script runs end to end at tiny sizes (no timing asserted)."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parent.parent


def test_benchmark_smoke(tmp_path):
  proc = subprocess.run(
      [sys.executable, "-m", "benchmarks.bench_lstm", "--lengths=6,12",
       "--batch=2", "--input=3", "--hidden=4", "--memory_hidden=4",
       "--memory_lengths=6,12", "--repeats=1",
       "--only=tf_recurrent.LSTM,keras.layers.LSTM",
       f"--out_dir={tmp_path}"],
      capture_output=True, text=True, timeout=600, cwd=ROOT, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  results = json.loads((tmp_path / "results.json").read_text())
  names = {(r["name"], r["xla"]) for r in results["rows"]}
  assert names == {(n, x) for n in ("tf_recurrent.LSTM", "keras.layers.LSTM")
                   for x in (False, True)}
  for row in results["rows"]:
    assert all(v > 0 for v in row["us_per_step"].values())
    assert row["memory_bytes_per_step"] is not None
  report = (tmp_path / "RESULTS.md").read_text()
  assert "| tf_recurrent.LSTM |" in report and "## Targets" in report
  assert (tmp_path / "results.png").stat().st_size > 10_000
