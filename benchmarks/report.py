"""Turns bench_lstm's results into RESULTS.md (tables, targets) and a plot."""

import os
from typing import Dict, List, Optional

KERAS = "keras.layers.LSTM"
FASTEST = "tf_recurrent.LSTM"
MIXED = " (mixed_bfloat16)"
FLOOR_PREFIX = "compute floor"


def _row(rows, name, xla) -> Optional[dict]:
  for row in rows:
    if row["name"] == name and row["xla"] == xla:
      return row
  return None


def _time(row, length) -> Optional[float]:
  if row is None:
    return None
  value = row["us_per_step"].get(length, row["us_per_step"].get(str(length)))
  return value


def _fmt(value, pattern="{:.0f}") -> str:
  return "skipped" if value is None else pattern.format(value)


def time_table(results: dict, xla: bool) -> List[str]:
  lengths = results["lengths"]
  rows = [r for r in results["rows"] if r["xla"] == xla]
  keras = _row(results["rows"], KERAS, xla)
  header = ("| implementation | " + " | ".join(f"T={t}" for t in lengths) +
            " | " + " | ".join(f"vs Keras T={t}" for t in lengths) + " |")
  lines = [header, "|" + "---|" * (1 + 2 * len(lengths))]
  for row in rows:
    times = [_time(row, t) for t in lengths]
    ratios = []
    for t, value in zip(lengths, times):
      base = _time(keras, t)
      ratios.append(None if value is None or base is None else value / base)
    lines.append(f"| {row['name']} | " + " | ".join(_fmt(v) for v in times) +
                 " | " + " | ".join(_fmt(r, "{:.2f}x") for r in ratios) + " |")
  return lines


def memory_table(results: dict) -> List[str]:
  lines = ["| implementation | mode | bytes per step | x state bytes | "
           "x state, malloc's mmap threshold pinned |",
           "|---|---|---|---|---|"]
  for row in results["rows"]:
    if "memory_bytes_per_step" not in row:
      continue
    slope = row["memory_bytes_per_step"]
    pinned = row.get("memory_vs_state_pinned_malloc")
    lines.append(
        f"| {row['name']} | {'XLA' if row['xla'] else 'TF'} | "
        f"{_fmt(slope)} | {_fmt(row.get('memory_vs_state'), '{:.2f}x')} | "
        f"{'' if pinned is None else f'{pinned:.2f}x'} |")
  return lines


def targets(results: dict) -> List[str]:
  """Each target of the benchmark issue, met or missed and by how much."""
  rows = results["rows"]
  lengths = results["lengths"]
  lo, hi = (250, 2000) if {250, 2000} <= set(lengths) else (lengths[0],
                                                           lengths[-1])
  out = []

  def verdict(ok):
    return "met" if ok else "MISSED"

  for xla in (False, True):
    for row in rows:
      if not row["name"].startswith("tf_recurrent") or row["xla"] != xla:
        continue
      a, b = _time(row, lo), _time(row, hi)
      if a and b:
        out.append(f"- {row['name']} ({'XLA' if xla else 'TF'}): time per "
                   f"step at T={hi} is {b / a:.2f}x that at T={lo} (target "
                   f"<= 1.25x): {verdict(b / a <= 1.25)}.")
  fast_xla = _row(rows, FASTEST, True)
  keras_xla = _row(rows, KERAS, True)
  for t, want in ((lo, 2.0), (hi, 5.0)):
    a, b = _time(fast_xla, t), _time(keras_xla, t)
    if a and b:
      out.append(f"- Under XLA, {FASTEST} is {b / a:.2f}x faster than Keras "
                 f"at T={t} (target >= {want:g}x): {verdict(b / a >= want)}.")
  fast = [r for r in (_row(rows, FASTEST, False), fast_xla) if r]
  floor = next((r for r in rows if r["name"].startswith(FLOOR_PREFIX)), None)
  peers = [(_row(rows, KERAS, False), "keras.layers.LSTM without XLA"),
           (_row(rows, "jax lax.scan", True), "JAX lax.scan")]
  for t in lengths:
    best = min((_time(r, t) for r in fast if _time(r, t)), default=None)
    if best is None:
      continue
    for peer, label in peers:
      p = _time(peer, t)
      if p:
        out.append(f"- T={t}: {FASTEST} (best mode) {best:.0f} us/step vs "
                   f"{label} {p:.0f}: {best / p:.2f}x "
                   f"(target <= 1x): {verdict(best <= p)}.")
    f = _time(floor, t)
    if f:
      out.append(f"- T={t}: {FASTEST} is {best / f:.2f}x the compute floor "
                 f"(target <= 1.6x): {verdict(best / f <= 1.6)}.")
  for xla in (False, True):
    ours, peer = _row(rows, FASTEST + MIXED, xla), _row(rows, KERAS + MIXED, xla)
    mode = "XLA" if xla else "TF"
    for t in lengths:
      a, b = _time(ours, t), _time(peer, t)
      if a and b:
        out.append(f"- mixed_bfloat16, {mode}, T={t}: {FASTEST} {a:.0f} "
                   f"us/step vs Keras under the same policy {b:.0f}: "
                   f"{a / b:.2f}x the time.")
    a, b = (r.get("memory_vs_state") if r else None for r in (ours, peer))
    if a is not None and b is not None:
      out.append(f"- mixed_bfloat16, {mode}, memory: {FASTEST} {a:.2f}x the "
                 f"float32 state per step vs Keras {b:.2f}x.")
  for row in rows:
    ratio = row.get("memory_vs_state")
    if row["name"].startswith("tf_recurrent") and ratio is not None:
      pinned = row.get("memory_vs_state_pinned_malloc")
      out.append(f"- Memory, {row['name']} ({'XLA' if row['xla'] else 'TF'})"
                 f": {ratio:.2f}x the state per step (target <= 2.5x): "
                 f"{verdict(ratio <= 2.5)}" + (
                     "" if pinned is None else
                     f" ({pinned:.2f}x with malloc's mmap threshold pinned)")
                 + ".")
  return out


def plot(results: dict, path: str) -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 3, figsize=(19, 6))
  for ax, xla in zip(axes[:2], (False, True)):
    for row in results["rows"]:
      if row["xla"] != xla and not (xla and row["name"].startswith(
          ("jax", FLOOR_PREFIX))):
        continue
      if not xla and row["name"].startswith(("jax", FLOOR_PREFIX)):
        continue
      points = [(t, _time(row, t)) for t in results["lengths"]]
      points = [(t, v) for t, v in points if v is not None]
      if points:
        ax.plot(*zip(*points), marker="o", label=row["name"])
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("T (time steps)")
    ax.set_ylabel("us per time step (training step)")
    ax.set_title("with XLA (jit_compile=True)" if xla else "TF executor")
    ax.legend(fontsize=7)
  mem = [r for r in results["rows"] if r.get("memory_vs_state") is not None]
  labels = [f"{r['name']} ({'XLA' if r['xla'] else 'TF'})" for r in mem]
  axes[2].barh(labels, [r["memory_vs_state"] for r in mem])
  axes[2].axvline(1.0, color="k", linewidth=0.8)
  axes[2].set_xlabel("memory per extra step / state bytes per step")
  axes[2].set_title("memory slope")
  axes[2].tick_params(axis="y", labelsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=90)


def write(results: dict, out_dir: str) -> None:
  env = results["environment"]
  shape = results["shape"]
  lines = [
      "# LSTM training step: tf_recurrent vs Keras, tf.scan, autodiff, JAX",
      "",
      f"One run of `python -m benchmarks.bench_lstm` on {env['cpu']}, "
      f"TensorFlow {env['tensorflow']}"
      + (f", JAX {env['jax']}" if "jax" in env else "") + ". "
      f"B={shape['B']}, D={shape['D']}, H={shape['H']}, float32. Time is the "
      "best of several repetitions of a full training step (forward, loss "
      "over every step, gradients of all weights) after a warm-up, divided "
      "by T, in microseconds.",
      "",
      results.get("note", ""),
      "",
      "Where the time goes (each piece of a tf_recurrent.LSTM step timed "
      "alone): [PROFILE.md](PROFILE.md), from `python -m "
      "benchmarks.profile_lstm`. Final-state-only training with "
      "checkpointing: [CHECKPOINT.md](CHECKPOINT.md).",
      "",
      "![results](results.png)",
      "",
      "## Without XLA (TF executor)", ""] + time_table(results, False) + [
      "", "## With XLA (jit_compile=True; JAX and the floor are always "
      "compiled)", ""] + time_table(results, True) + [
      "", f"## Memory per extra time step (H={shape['memory_H']}, peak RSS "
      f"at T={shape['memory_lengths'][0]} and T={shape['memory_lengths'][1]}"
      f", each in its own process; state = 2*B*H*4 = "
      f"{2 * shape['B'] * shape['memory_H'] * 4} bytes per step)", "",
      "Without XLA every tensor is a glibc malloc block, and glibc raises its "
      "mmap threshold each time a large block is freed, so later large "
      "tensors land on a heap that the per-step rows of TensorLists have "
      "fragmented. The last column measures the TF-mode rows again with "
      "`MALLOC_MMAP_THRESHOLD_=16384` (large blocks always mmapped): the "
      "difference is fragmentation, not tensors alive at the peak.", ""
  ] + memory_table(results) + ["", "## Targets", ""] + targets(results)
  with open(os.path.join(out_dir, "RESULTS.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  plot(results, os.path.join(out_dir, "results.png"))


