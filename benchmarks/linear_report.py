"""LINEAR.md: the linear recurrences' results, one section per run.

`bench_linear` writes linear.json (the training step) or linear_chunks.json
(`--sweep_chunk`), `char_lm_quality` char_lm.json; each then renders
LINEAR.md from every one of them present in its directory, so a run
replaces its own section and keeps the others'.
"""

import json
import os
import statistics
from typing import List, Optional

DEFAULT_DIR = os.path.dirname(os.path.abspath(__file__))
STEP, CHUNKS, CHAR_LM = "linear", "linear_chunks", "char_lm"
LSTM = "tf_recurrent.LSTM"
LINEAR = ["tf_recurrent.MinGRU", "tf_recurrent.MinLSTM", "tf_recurrent.RGLRU"]
FLOOR_SUFFIX = " floor (gates only)"
# A row for memory only: the harness around a layer that is one weight
# times its inputs (the inputs, the outputs, the loss and its gradient).
HARNESS = "harness (outputs = w x)"
# The issue's targets (issue 57).
SPEEDUP, FLOOR_RATIO, BEYOND_HARNESS, FLAT = 2.5, 1.4, 1.0, 1.2
TARGET_LENGTHS = (1024, 4096)


def write(out_dir: str, name: str, results: dict) -> None:
  """Writes `results` as `<name>.json` into `out_dir` (made if missing) and
  renders LINEAR.md there."""
  if "wall_seconds" in results:
    print(f"the run took {results['wall_seconds'] / 60:.1f} minutes",
          flush=True)
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
    json.dump(results, f, indent=1)
  render(out_dir)


def _load(out_dir: str, name: str) -> Optional[dict]:
  path = os.path.join(out_dir, f"{name}.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def render(out_dir: str) -> None:
  """LINEAR.md from the results in `out_dir`."""
  lines = ["# Linear recurrences: MinGRU, MinLSTM, RG-LRU", "",
           "Written by `python -m benchmarks.bench_linear` (training step; "
           "`--sweep_chunk`: chunk sizes) and `python -m "
           "benchmarks.char_lm_quality` (bits per character); each run "
           "replaces its own section. Figures are from one run each; the "
           "ratios are within a run."]
  for name, section in ((STEP, step_section), (CHUNKS, chunk_section),
                        (CHAR_LM, char_lm_section)):
    results = _load(out_dir, name)
    if results is not None:
      lines += [""] + section(results)
  with open(os.path.join(out_dir, "LINEAR.md"), "w") as f:
    f.write("\n".join(lines) + "\n")


def _fmt(value, pattern="{:.1f}", missing="-") -> str:
  return missing if value is None else pattern.format(value)


def _environment(results: dict) -> str:
  env = results["environment"]
  jax = f", JAX {env['jax']}" if "jax" in env else ""
  flags = f" ({env['cpu_flags']})" if env.get("cpu_flags") else ""
  took = (f", {results['wall_seconds'] / 60:.1f} minutes"
          if "wall_seconds" in results else "")
  return (f"`{results['command']}`{took} on {env['cpu']}{flags}, "
          f"TensorFlow {env['tensorflow']}, Keras {env['keras']}{jax}, "
          f"Python {env['python']}; at the start, {results['load']}")


def _find(rows, name, xla) -> Optional[dict]:
  return next((r for r in rows if r["name"] == name and r["xla"] == xla),
              None)


def _time(row: Optional[dict], length: int) -> Optional[float]:
  return None if row is None else row["us_per_step"].get(str(length))


def _ratio(a, b) -> Optional[float]:
  return None if a is None or b is None else a / b


def step_section(results: dict) -> List[str]:
  """The training step: times, ratios, memory, skipped rows, targets."""
  lengths, rows = results["lengths"], results["rows"]
  shape = results["shape"]
  chunk = results["chunk_size"]
  chunk = f"{chunk} ({results['auto_chunk']})" if chunk == "auto" else chunk
  lines = [
      "## Training step", "",
      f"{_environment(results)}. B={shape['B']}, D=H={shape['H']}, float32; "
      "one training step (forward, a loss over every step's output, the "
      "gradients of all weights). Time: median of "
      f"{results['rounds']} interleaved rounds, microseconds per time step; "
      "TF: without XLA, XLA: `jit_compile=True` (JAX: `jax.jit`). The "
      f"linear layers' chunk_size: {chunk}. A floor is its layer's gate "
      "projection and activations over the whole sequence and h_t = 0.5 a_t "
      "+ b_t (no recurrence), differentiated by TensorFlow.", "",
      "| implementation | mode | " + " | ".join(f"T={t}" for t in lengths) +
      " |", "|---|---|" + "---|" * len(lengths)]
  for r in rows:
    if r["name"] == HARNESS:  # Memory only.
      continue
    lines.append(f"| {r['name']} | {'XLA' if r['xla'] else 'TF'} | " +
                 " | ".join(_fmt(_time(r, t), "{:.1f}", "skipped")
                            for t in lengths) + " |")
  skipped = [(r, t, reason) for r in rows
             for t, reason in sorted(r["skipped"].items(),
                                     key=lambda e: int(e[0]))
             if not reason.startswith("skipped at T=")]
  if skipped:
    lines += ["", "Skipped (and every longer length of the row):", ""]
    lines += [f"- {r['name']}, {'XLA' if r['xla'] else 'TF'}, T={t}: "
              f"{reason}" for r, t, reason in skipped]
  lines += ["", "### Ratios", "",
            f"Speed-up: {LSTM}'s time over the layer's (same mode); floor: "
            "the layer's time over its floor's; flat: the layer's slowest "
            "time per step over its fastest, over the lengths timed.", "",
            "| layer | mode | " +
            " | ".join(f"speed-up T={t}" for t in lengths) + " | " +
            " | ".join(f"x floor T={t}" for t in lengths) + " | flat |",
            "|---|---|" + "---|" * (2 * len(lengths) + 1)]
  for r in rows:
    if r["name"] not in LINEAR:
      continue
    lstm = _find(rows, LSTM, r["xla"])
    floor = _find(rows, r["name"].split(".")[1] + FLOOR_SUFFIX, r["xla"])
    speed = [_ratio(_time(lstm, t), _time(r, t)) for t in lengths]
    floors = [_ratio(_time(r, t), _time(floor, t)) for t in lengths]
    lines.append(f"| {r['name']} | {'XLA' if r['xla'] else 'TF'} | " +
                 " | ".join(_fmt(v, "{:.2f}x") for v in speed) + " | " +
                 " | ".join(_fmt(v, "{:.2f}x") for v in floors) + " | " +
                 _fmt(_flatness(r), "{:.2f}") + " |")
  lines += memory_lines(results)
  lines += target_lines(results)
  return lines


def _flatness(row: dict) -> Optional[float]:
  times = [v for v in row["us_per_step"].values() if v is not None]
  return max(times) / min(times) if len(times) > 1 else None


def _beyond_harness(rows: List[dict], row: dict) -> Optional[float]:
  """A row's memory slope less the harness's (same mode), in states."""
  harness = _find(rows, HARNESS, row["xla"])
  values = [(r or {}).get("memory") or {} for r in (row, harness)]
  if any(v.get("vs_state") is None for v in values):
    return None
  return values[0]["vs_state"] - values[1]["vs_state"]


def memory_lines(results: dict) -> List[str]:
  rows = [r for r in results["rows"] if r.get("memory")]
  if not rows:
    return []
  lines = ["", "### Memory per step", "",
           "The peak RSS of one step at two lengths, each in a fresh "
           "process; the slope between them per step, and as a multiple of "
           f"one state [B, H] ({results['state_bytes']} bytes; an LSTM's "
           "state is two). Beyond the harness: the slope less that of "
           f"`{HARNESS}`, the same step around a layer that multiplies its "
           "inputs by one weight (what the inputs, the outputs and the "
           "loss's gradient keep).", "",
           "| implementation | mode | lengths | bytes per step | x state | "
           "beyond the harness | peak GB at the longer |",
           "|---|---|---|---|---|---|---|"]
  for r in rows:
    m = r["memory"]
    mode = "XLA" if r["xla"] else "TF"
    if "skipped" in m:
      lines.append(f"| {r['name']} | {mode} | {m['skipped']} | | | | |")
      continue
    vs = m["vs_state"]
    peak = m["peaks"][-1]
    beyond = None if r["name"] == HARNESS else _beyond_harness(
        results["rows"], r)
    lines.append(
        f"| {r['name']} | {mode} | {m['lengths'][0]}, {m['lengths'][1]} | "
        f"{_fmt(m['bytes_per_step'], '{:.0f}', 'failed')} | "
        f"{_fmt(vs, '{:.2f}', 'failed')} | "
        f"{_fmt(beyond, '{:.2f}')} | "
        f"{_fmt(None if peak is None else peak / 2**30, '{:.2f}')} |")
  return lines


def _verdict(values: List[Optional[float]], ok) -> str:
  if not values or None in values:
    return "not measured"
  return "met" if all(ok(v) for v in values) else "missed"


def target_lines(results: dict) -> List[str]:
  """The issue's targets, met or missed, with the figures."""
  rows = results["rows"]
  lengths = [t for t in TARGET_LENGTHS if t in results["lengths"]]
  lines = ["", "### Targets (issue 57)", ""]
  if not lengths:
    lengths = list(TARGET_LENGTHS)
    lines += [f"(T={', '.join(map(str, lengths))} not run: the time "
              "targets are not measured.)", ""]
  for name in LINEAR:
    for xla in (False, True):
      r = _find(rows, name, xla)
      if r is None:
        continue
      mode = "XLA" if xla else "TF"
      lstm = _find(rows, LSTM, xla)
      floor = _find(rows, name.split(".")[1] + FLOOR_SUFFIX, xla)
      speed = [_ratio(_time(lstm, t), _time(r, t)) for t in lengths]
      floors = [_ratio(_time(r, t), _time(floor, t)) for t in lengths]
      at = ", ".join(f"T={t}" for t in lengths)
      parts = [
          f"speed-up >= {SPEEDUP}x {LSTM} at {at}: "
          f"{_verdict(speed, lambda v: v >= SPEEDUP)} (" +
          ", ".join(_fmt(v, "{:.2f}x") for v in speed) + ")",
          f"within {FLOOR_RATIO}x the floor at {at}: "
          f"{_verdict(floors, lambda v: v <= FLOOR_RATIO)} (" +
          ", ".join(_fmt(v, "{:.2f}x") for v in floors) + ")"]
      flat = _flatness(r)
      timed = sorted(int(t) for t in r["us_per_step"])
      parts.append(
          f"per-step time flat within {FLAT - 1:.0%} over T=" +
          ",".join(map(str, timed)) + ": " +
          _verdict([flat], lambda v: v <= FLAT) + f" ({_fmt(flat, '{:.2f}')})")
      beyond = _beyond_harness(rows, r)
      parts.append(f"memory <= {BEYOND_HARNESS:.0f} state beyond the "
                   f"harness: {_verdict([beyond], lambda v: v <= BEYOND_HARNESS)}"
                   f" ({_fmt(beyond, '{:.2f}')})")
      lines.append(f"- {name}, {mode}: " + "; ".join(parts) + ".")
  return lines


def chunk_section(results: dict) -> List[str]:
  """The chunk-size sweep: time per step at each chunk size."""
  chunks = results["chunk_sizes"]
  auto = results["auto_chunk"]
  lines = [
      "## Chunk size", "",
      f"{_environment(results)}. B={results['shape']['B']}, "
      f"D=H={results['shape']['H']}; training steps as above "
      "(`tf_recurrent.linear_scan`: random a in (0, 1) and b given, the "
      "gradients of both), every chunk size's step in turn, median of "
      f"{results['rounds']} rounds, microseconds per time step. "
      f'chunk_size="auto" is {auto} steps.', "",
      "| scan | mode | T | " + " | ".join(f"chunk {c}" for c in chunks) +
      f" | best | auto ({auto}) / best |",
      "|---|---|---|" + "---|" * (len(chunks) + 2)]
  for r in results["rows"]:
    times = r["us_per_step"]
    best = min(chunks, key=lambda c: times[str(c)])
    auto_time = times.get(str(auto))
    lines.append(
        f"| {r['name']} | {'XLA' if r['xla'] else 'TF'} | {r['length']} | " +
        " | ".join(_fmt(times[str(c)]) for c in chunks) + f" | {best} | " +
        _fmt(_ratio(auto_time, times[str(best)]), "{:.2f}x") + " |")
  relative = {c: statistics.geometric_mean(
      [r["us_per_step"][str(c)] / min(r["us_per_step"].values())
       for r in results["rows"]]) for c in chunks}
  best = min(chunks, key=relative.get)
  lines += ["", "Over every row, each chunk size's time over the row's best "
            "(geometric mean): " + ", ".join(
                f"{c}: {relative[c]:.2f}x" for c in chunks) +
            f"; the best overall: {best}."]
  return lines


def char_lm_section(results: dict) -> List[str]:
  """Bits per character at equal steps and at equal wall time."""
  cells = results["cells"]
  lstm = next((c for c in cells if c["cell"] == "lstm"), None)
  steps, seconds = results["steps"], results["seconds"]
  lines = [
      "## Char LM: bits per character at equal parameters", "",
      f"{_environment(results)}. `tpu_examples/train_char_lm.py`'s model "
      f"(byte embedding, one recurrent layer, logits), T={results['seq_len']}"
      f", batch {results['batch']}, Adam {results['learning_rate']}, XLA "
      f"{'on' if results['jit_compile'] else 'off'}, on {results['corpus']}; "
      "every cell sees the same batches in the same order. Each cell's "
      f"hidden size matches the LSTM's {results['parameters_target']} "
      "parameters; its training calls take turns with the others' (the "
      "wall time is its own calls', the first, compiling one excluded). "
      f"Held-out bits per character on {results['eval_windows']} windows, "
      f"after {steps} steps and after {seconds:.0f} s of training.", "",
      "| cell | hidden | parameters | ms per step | bits/char after "
      f"{steps} steps | steps in {seconds:.0f} s | bits/char after "
      f"{seconds:.0f} s | vs LSTM, equal steps | vs LSTM, equal time |",
      "|---|---|---|---|---|---|---|---|---|"]
  for c in cells:
    def diff(key):
      if lstm is None or c is lstm:
        return "-"
      return f"{c[key] - lstm[key]:+.3f}"
    lines.append(
        f"| {c['cell']} | {c['hidden']} | {c['parameters']} | "
        f"{c['ms_per_step']:.1f} | {c['bpc_at_steps']:.3f} | "
        f"{c['steps_in_seconds']} | {c['bpc_at_seconds']:.3f} | "
        f"{diff('bpc_at_steps')} | {diff('bpc_at_seconds')} |")
  if lstm is not None:
    worse = [c["cell"] for c in cells
             if c is not lstm and c["bpc_at_seconds"] > lstm["bpc_at_seconds"]]
    lines += ["", "Target (bits per character at equal wall time no worse "
              "than the LSTM's): " + ("met by every cell." if not worse else
                                      f"missed by {', '.join(worse)}.")]
  return lines

