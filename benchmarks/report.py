"""Turns bench_lstm's results into RESULTS.md (tables, targets) and a plot."""

import os
from typing import Dict, List, Optional

KERAS = "keras.layers.LSTM"
KERAS_GRU = "keras.layers.GRU"
FASTEST = "tf_recurrent.LSTM"
LEAN = "tf_recurrent.LSTM(recompute=True)"
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
  header = ("| implementation | " + " | ".join(f"T={t}" for t in lengths) +
            " | " + " | ".join(f"vs Keras T={t}" for t in lengths) + " |")
  lines = [header, "|" + "---|" * (1 + 2 * len(lengths))]
  for row in rows:
    # Each row against the Keras layer of its own cell (and policy).
    keras = _row(results["rows"], (KERAS_GRU if "GRU" in row["name"]
                                   else KERAS) + (
                                       MIXED if row["name"].endswith(MIXED)
                                       else ""), xla)
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
  """Each target of the performance issue (#15), met or missed, by how much.

  "x faster" is the peer's time over ours.
  """
  rows = results["rows"]
  lengths = results["lengths"]
  out = []

  def verdict(ok):
    return "met" if ok else "MISSED"

  def faster(ours, peer, t, want, label):
    a, b = _time(ours, t), _time(peer, t)
    if a and b:
      out.append(f"- T={t}: {label}: {b / a:.2f}x faster (target >= "
                 f"{want:g}x): {verdict(b / a >= want)}.")

  fast_tf, fast_xla = _row(rows, FASTEST, False), _row(rows, FASTEST, True)
  keras_tf, keras_xla = _row(rows, KERAS, False), _row(rows, KERAS, True)
  jax = _row(rows, "jax lax.scan", True)
  floor = next((r for r in rows if r["name"].startswith(FLOOR_PREFIX)), None)
  for t, want in ((250, 2.0), (2000, 5.0)):
    if t in lengths:
      faster(fast_xla, keras_xla, t, want,
             f"{FASTEST} vs {KERAS}, both XLA")
  best = {"name": FASTEST, "us_per_step": {
      t: min(v for v in (_time(fast_tf, t), _time(fast_xla, t)) if v)
      for t in lengths if _time(fast_tf, t) or _time(fast_xla, t)}}
  for t in (250, 1000):
    if t in lengths:
      faster(fast_xla, jax, t, 1.25, f"{FASTEST} (XLA) vs JAX lax.scan")
      faster(best, jax, t, 1.25, f"{FASTEST} (its faster mode) vs JAX "
             "lax.scan")
  for t in lengths:
    faster(fast_tf, keras_tf, t, 1.2, f"{FASTEST} vs {KERAS}, both without "
           "XLA")
  for t in lengths:
    a, f = _time(fast_xla, t), _time(floor, t)
    if a and f:
      out.append(f"- T={t}: {FASTEST} (XLA) is {a / f:.2f}x the compute "
                 f"floor of all six GEMMs (target <= 1.35x): "
                 f"{verdict(a / f <= 1.35)}.")
  for name, limits in ((FASTEST, {False: 3.5, True: 3.5}),
                       (LEAN, {False: 2.5, True: 2.0})):
    for xla in (True, False):
      row = _row(rows, name, xla)
      ratio = row.get("memory_vs_state") if row else None
      if ratio is not None:
        out.append(f"- Memory, {name} ({'XLA' if xla else 'TF'}): "
                   f"{ratio:.2f}x the state per step (target <= "
                   f"{limits[xla]:g}x): {verdict(ratio <= limits[xla])}.")
  for xla in (False, True):
    mode = "XLA" if xla else "TF"
    for ours_name, peer_name in ((FASTEST + MIXED, KERAS + MIXED),
                                 ("tf_recurrent.GRU", KERAS_GRU)):
      ours, peer = _row(rows, ours_name, xla), _row(rows, peer_name, xla)
      for t in lengths:
        a, b = _time(ours, t), _time(peer, t)
        if a and b:
          out.append(f"- {mode}, T={t}: {ours_name} {a:.0f} us/step vs "
                     f"{peer_name} {b:.0f}: {b / a:.2f}x faster.")
      a, b = (r.get("memory_vs_state") if r else None for r in (ours, peer))
      if a is not None and b is not None:
        out.append(f"- {mode}, memory: {ours_name} {a:.2f}x its state per "
                   f"step vs {peer_name} {b:.2f}x.")
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
      "# LSTM and GRU training step: tf_recurrent vs Keras, tf.scan, autodiff, "
      "JAX",
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
      f"{2 * shape['B'] * shape['memory_H'] * 4} bytes per step; a GRU's "
      "state is h alone, B*H*4)", "",
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


