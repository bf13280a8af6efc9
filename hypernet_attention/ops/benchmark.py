"""Times and sizes attention implementations over sequence lengths (experiments/results/kernels.md).

For each sequence length T and implementation this measures, after compilation:
forward and forward+backward wall time (median of repeats), the compiled executables'
temp memory (`memory_analysis().temp_size_in_bytes`: what XLA allocates besides inputs and
outputs), on GPU/TPU the device's peak bytes in use, and achieved TFLOP/s from analytic
FLOP counts. A column stops at the first T whose compiled temp memory exceeds the budget
(checked before running, so a CPU shared with others is never pushed into swap or the
OOM killer) or whose run fails with an out-of-memory error.

Implementations: softmax (`jax.nn.dot_product_attention`, cuDNN on GPU for bf16),
linear (linear attention, reference einsums), hyla_reference, hyla_blockwise, hyla_pallas,
and rmshead_linear_pallas (Table A1's "linear attention + RMSHead" on the Pallas kernel: HYLA's
normalization with a linear value network, which runs on the matrix units).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import time
from typing import Callable, Sequence

import jax
import jax.numpy as jnp

from hypernet_attention.ops import dispatch

IMPLEMENTATIONS = ("softmax", "linear", "hyla_reference", "hyla_blockwise", "hyla_pallas",
                   "rmshead_linear_pallas")


def host_cpu() -> dict:
  """The CPU a table was made on: model, cores this process may use, AVX-512, XLA_FLAGS.

  CPU timings (and their ratios) move with all four: a table must say which it came from.
  """
  model, avx512 = "unknown", False
  if os.path.exists("/proc/cpuinfo"):
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown":
          model = value.strip()
        elif key.strip() == "flags":
          avx512 = avx512 or "avx512f" in value.split()
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return dict(cpu_model=model, usable_cores=cores, avx512=avx512,
              xla_flags=os.environ.get("XLA_FLAGS", ""))


@dataclasses.dataclass(frozen=True)
class Shape:
  batch: int
  heads: int
  head_dim: int
  seq_len: int
  causal: bool
  dtype: str

  @property
  def pairs(self) -> int:
    """(query, key) pairs computed per batch element and head."""
    t = self.seq_len
    return t * (t + 1) // 2 if self.causal else t * t


def flops(name: str, shape: Shape) -> tuple[float, float]:
  """Analytic (forward, forward+backward) FLOPs; no recomputation counted.

  Per visible pair and head: scores 2D; softmax/linear add a*v (2V); HYLA adds the hidden
  z = sum_h a v (2V per head) and y = sum_k a z (2V per head). The backward doubles every
  product (one gradient per operand): dq, dk (4D), and 4V (linear) or 8V (MLP).
  """
  d = v = shape.head_dim
  linear_value = name in ("softmax", "linear", "rmshead_linear_pallas")
  per_pair = (2 * d + 2 * v, 4 * d + 4 * v) if linear_value else (2 * d + 4 * v, 4 * d + 8 * v)
  scale = shape.batch * shape.heads * shape.pairs
  fwd, bwd = per_pair[0] * scale, per_pair[1] * scale
  return float(fwd), float(fwd + bwd)


def attention_fn(name: str, causal: bool, interpret: bool = False) -> Callable:
  """(q, k, v) -> out for one benchmark column."""
  if name == "softmax":
    return lambda q, k, v: dispatch.attention(
        q, k, v, is_causal=causal, normalization="softmax", value_network="linear")
  if name == "linear":
    return lambda q, k, v: dispatch.attention(
        q, k, v, is_causal=causal, normalization="linear", value_network="linear",
        implementation="reference")
  if name.endswith("pallas"):
    from hypernet_attention.ops import pallas_kernel  # pylint: disable=g-import-not-at-top
    value_network = "linear" if name == "rmshead_linear_pallas" else "mlp"
    return lambda q, k, v: pallas_kernel.attention(
        q, k, v, is_causal=causal, value_network=value_network, interpret=interpret)
  implementation = name.removeprefix("hyla_")
  return lambda q, k, v: dispatch.attention(
      q, k, v, is_causal=causal, normalization="rms_head", value_network="mlp",
      activation="relu", implementation=implementation)


def median_time(fn, args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))  # warm-up
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def _is_oom(err: Exception) -> bool:
  text = str(err).lower()
  return "resource_exhausted" in text or "out of memory" in text or "oom" in text


def measure(name: str, shape: Shape, repeats: int, max_temp_bytes: float,
            interpret: bool = False) -> dict:
  """One table cell: times in ms, memory in bytes; `status` says why a cell is empty."""
  keys = jax.random.split(jax.random.PRNGKey(shape.seq_len), 3)
  dims = (shape.batch, shape.seq_len, shape.heads, shape.head_dim)
  q, k, v = (jax.random.normal(kk, dims, jnp.dtype(shape.dtype)) for kk in keys)
  fn = attention_fn(name, shape.causal, interpret)
  loss = lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32))
  fwd_bwd = jax.grad(loss, (0, 1, 2))
  row = dict(implementation=name, **dataclasses.asdict(shape))
  try:
    compiled = {}
    for kind, f in (("fwd", fn), ("fwd_bwd", fwd_bwd)):
      compiled[kind] = jax.jit(f).lower(q, k, v).compile()
      analysis = compiled[kind].memory_analysis()
      row[f"{kind}_temp_bytes"] = None if analysis is None else analysis.temp_size_in_bytes
    if max(row["fwd_temp_bytes"] or 0, row["fwd_bwd_temp_bytes"] or 0) > max_temp_bytes:
      row["status"] = "over_memory_budget"
      return row
    flop_counts = flops(name, shape)
    for (kind, exe), flop in zip(compiled.items(), flop_counts):
      seconds = median_time(exe, (q, k, v), repeats)
      row[f"{kind}_ms"] = 1e3 * seconds
      row[f"{kind}_tflops"] = flop / seconds / 1e12
    device = jax.devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats:
      row["device_peak_bytes"] = stats.get("peak_bytes_in_use")
    row["status"] = "ok"
  except Exception as err:  # pylint: disable=broad-except
    if not _is_oom(err):
      raise
    row["status"] = "out_of_memory"
  return row


def run(seq_lens: Sequence[int], implementations: Sequence[str], *, batch: int, heads: int,
        head_dim: int, dtype: str, causal: bool, repeats: int, max_temp_bytes: float,
        interpret: bool = False, log: Callable[[str], None] = print) -> list[dict]:
  rows, stopped = [], set()
  for seq_len in seq_lens:
    for name in implementations:
      if name not in IMPLEMENTATIONS:
        raise ValueError(f"Unknown implementation {name!r}; allowed: {', '.join(IMPLEMENTATIONS)}.")
      shape = Shape(batch, heads, head_dim, seq_len, causal, dtype)
      if name in stopped:
        rows.append(dict(implementation=name, **dataclasses.asdict(shape), status="stopped"))
        continue
      row = measure(name, shape, repeats, max_temp_bytes, interpret)
      if row["status"] != "ok":
        stopped.add(name)
      rows.append(row)
      log(format_row(row))
  return rows


def format_row(row: dict) -> str:
  mib = lambda b: "-" if b is None else f"{b / 2**20:9.1f}"
  ms = lambda x: "-" if x is None else f"{x:9.1f}"
  return (f"T={row['seq_len']:6d} {row['implementation']:15s} fwd {ms(row.get('fwd_ms'))} ms"
          f"  fwd+bwd {ms(row.get('fwd_bwd_ms'))} ms  temp fwd {mib(row.get('fwd_temp_bytes'))}"
          f" MiB  fwd+bwd {mib(row.get('fwd_bwd_temp_bytes'))} MiB  {row['status']}")


def markdown_table(rows: list[dict]) -> str:
  lines = ["| T | implementation | fwd ms | fwd+bwd ms | fwd temp MiB | fwd+bwd temp MiB |"
           " fwd+bwd TFLOP/s | status |", "|---|---|---|---|---|---|---|---|"]
  fmt = lambda x, f: "-" if x is None else format(x, f)
  for r in rows:
    temp = lambda k: None if r.get(k) is None else r[k] / 2**20  # noqa: B023
    lines.append(
        f"| {r['seq_len']} | {r['implementation']} | {fmt(r.get('fwd_ms'), '.1f')} | "
        f"{fmt(r.get('fwd_bwd_ms'), '.1f')} | {fmt(temp('fwd_temp_bytes'), '.1f')} | "
        f"{fmt(temp('fwd_bwd_temp_bytes'), '.1f')} | {fmt(r.get('fwd_bwd_tflops'), '.3f')} | "
        f"{r['status']} |")
  return "\n".join(lines)


def ratios(rows: list[dict], seq_len: int) -> dict:
  """The issue's targets at one T: blockwise vs softmax and vs the HYLA reference."""
  cell = {r["implementation"]: r for r in rows if r["seq_len"] == seq_len and r["status"] == "ok"}
  out = {}
  blk = cell.get("hyla_blockwise")
  if blk is None:
    return out
  for other in ("softmax", "hyla_reference"):
    if other in cell:
      out[f"time_blockwise_over_{other}"] = blk["fwd_bwd_ms"] / cell[other]["fwd_bwd_ms"]
      out[f"temp_blockwise_over_{other}"] = (
          blk["fwd_bwd_temp_bytes"] / max(cell[other]["fwd_bwd_temp_bytes"], 1))
  return out


def write_outputs(rows: list[dict], out_dir: str, meta: dict) -> tuple[str, str]:
  """Writes results.json and a log-log PNG (time and temp memory vs T)."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  os.makedirs(out_dir, exist_ok=True)
  json_path = os.path.join(out_dir, "results.json")
  with open(json_path, "w") as f:
    json.dump(dict(meta=meta, rows=rows), f, indent=1)
  fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
  for name in dict.fromkeys(r["implementation"] for r in rows):
    ok = [r for r in rows if r["implementation"] == name and r["status"] == "ok"]
    if not ok:
      continue
    t = [r["seq_len"] for r in ok]
    axes[0].plot(t, [r["fwd_bwd_ms"] for r in ok], "o-", label=f"{name} fwd+bwd")
    axes[0].plot(t, [r["fwd_ms"] for r in ok], "x:", color=axes[0].lines[-1].get_color(),
                 label=f"{name} fwd")
    axes[1].plot(t, [r["fwd_bwd_temp_bytes"] / 2**20 for r in ok], "o-", label=name)
  for ax, ylabel in zip(axes, ("time (ms, median)", "compiled temp memory, fwd+bwd (MiB)")):
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length T")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
  axes[0].legend(fontsize=6)
  axes[1].legend(fontsize=7)
  fig.suptitle(f"{meta.get('device')}: B={meta['batch']} H={meta['heads']} d={meta['head_dim']}"
               f" {meta['dtype']} causal={meta['causal']}", fontsize=9)
  fig.tight_layout()
  png_path = os.path.join(out_dir, "attention_benchmark.png")
  fig.savefig(png_path, dpi=120)
  plt.close(fig)
  return json_path, png_path
