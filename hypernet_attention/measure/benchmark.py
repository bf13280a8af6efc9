"""Times and sizes attention implementations over sequence lengths (experiments/results/kernels.md).

For each sequence length T and implementation this measures, after compilation: forward and
forward+backward time per call, the compiled programs' memory (XLA's `memory_analysis()`), on
GPU/TPU the device's peak bytes in use, achieved TFLOP/s from analytic FLOP counts and the ratio to
softmax attention (cuDNN on GPU, XLA elsewhere; the row names which) measured in the same process.

Timing (`call_loop`): one measurement runs `calls` (>= 20 by default) dependent calls inside one
jitted loop and waits once, so a sub-millisecond kernel is not timed as its dispatch; what the loop
adds is measured per T as `*_loop_overhead_ms`. The rows give the median and the minimum over
`repeats` measurements, in ms per call, overhead included.

Memory (issue: a benchmark must refuse before it allocates): before any array exists, the inputs'
and results' bytes (abstract shapes) are compared with the device, then the compiled loop's memory
analysis with the temporaries budget and the device; a cell that cannot fit is refused with what
would fit. Only then are the inputs drawn. A column stops at its first refused or failed T, and a
cell predicted (from the column's previous T) to overrun its time budget is skipped instead of run.

Implementations (`implementations()`): softmax_cudnn (`jax.nn.dot_product_attention`,
implementation='cudnn'; GPU, bf16/fp16), softmax_xla (the same with implementation='xla'),
linear (linear attention, reference einsums), hyla_<name> for every implementation in
`presets.IMPLEMENTATIONS` but `auto` (read at call time: a kernel added there is measured
here without an edit), and rmshead_linear_blockwise (Table A1's "linear attention + RMSHead": HYLA's
normalization with a linear value network, in blockwise's tiles). `softmax` is also
accepted: the path a model takes (`dispatch`'s choice: cuDNN on GPU where it applies)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import time
from typing import Callable, Optional, Sequence

import jax
from jax import lax
import jax.numpy as jnp

from hypernet_attention import errors
from hypernet_attention import presets
from hypernet_attention.ops import dispatch

BASELINES = ("softmax_cudnn", "softmax_xla")  # The ratio's denominator: the first that ran.
DEFAULT_CALLS = 20  # Calls per measurement, inside one jitted loop.
# A call predicted to take this long may run fewer times per loop (down to MIN_CALLS) to fit
# its time budget: the dispatch the loop amortizes (tens of microseconds) is then under 1% of
# one call. Shorter calls always run all `calls`, or are skipped.
LONG_CALL_MS = 10.0
MIN_CALLS = 3
_HYLA = dict(normalization="rms_head", value_network="mlp", activation="relu")
# The columns other than cuDNN/XLA softmax and HYLA: dispatch.attention's keywords.
_COLUMNS = {
    "softmax": dict(normalization="softmax", value_network="linear"),
    "linear": dict(normalization="linear", value_network="linear", implementation="reference"),
    "rmshead_linear_blockwise": dict(normalization="rms_head", value_network="linear",
                                     implementation="blockwise")}


def implementations() -> tuple[str, ...]:
  """Every benchmark column, HYLA's read from `presets.IMPLEMENTATIONS` now."""
  hyla = tuple(f"hyla_{n}" for n in presets.IMPLEMENTATIONS if n != "auto")
  return (*BASELINES, "linear", *hyla, "rmshead_linear_blockwise")


def allowed_names() -> tuple[str, ...]:
  return (*implementations(), "softmax")


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

  def specs(self) -> tuple[jax.ShapeDtypeStruct, ...]:
    """q, k, v as abstract arrays (B, T, H, D): what compiles without allocating."""
    dims = (self.batch, self.seq_len, self.heads, self.head_dim)
    return tuple(jax.ShapeDtypeStruct(dims, jnp.dtype(self.dtype)) for _ in range(3))


def flops(name: str, shape: Shape) -> tuple[float, float]:
  """Analytic (forward, forward+backward) FLOPs; no recomputation counted.

  Per visible pair and head: scores 2D; softmax/linear add a*v (2V); HYLA adds the hidden
  z = sum_h a v (2V per head) and y = sum_k a z (2V per head). The backward doubles every
  product (one gradient per operand): dq, dk (4D), and 4V (linear) or 8V (MLP)."""
  d = v = shape.head_dim
  linear_value = not name.startswith("hyla_")
  per_pair = (2 * d + 2 * v, 4 * d + 4 * v) if linear_value else (2 * d + 4 * v, 4 * d + 8 * v)
  scale = shape.batch * shape.heads * shape.pairs
  fwd, bwd = per_pair[0] * scale, per_pair[1] * scale
  return float(fwd), float(fwd + bwd)


def attention_fn(name: str, causal: bool) -> Callable:
  """(q, k, v) -> out for one benchmark column (`allowed_names()`)."""
  if name in ("softmax_cudnn", "softmax_xla"):
    implementation = name.removeprefix("softmax_")
    return lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, is_causal=causal, implementation=implementation)
  if name in _COLUMNS:
    return lambda q, k, v: dispatch.attention(q, k, v, is_causal=causal, **_COLUMNS[name])
  implementation = name.removeprefix("hyla_")
  if not name.startswith("hyla_") or implementation not in presets.IMPLEMENTATIONS:
    raise ValueError(f"implementation {name!r}; allowed: {', '.join(allowed_names())}")
  return lambda q, k, v: dispatch.attention(
      q, k, v, is_causal=causal, implementation=implementation, **_HYLA)


def unsupported(name: str, shape: Shape, backend: str) -> Optional[str]:
  """Why `name` cannot run this shape here, or None. Checked before any work."""
  if name == "softmax_cudnn":
    if backend != "gpu":
      return f"cuDNN runs on NVIDIA GPUs; this backend is {backend}"
    if shape.dtype not in ("bfloat16", "float16"):
      return f"cuDNN's flash attention takes bfloat16/float16, not {shape.dtype}"
  return None


def fwd_bwd(fn: Callable) -> Callable:
  """(q, k, v) -> (sum out, d(sum out)/d(q, k, v)): forward+backward as a train step runs it.

  The value is returned: the tiled kernels' custom VJPs keep only the inputs as residuals,
  so under `jax.grad` alone XLA drops their forward (kernels.md's correction)."""
  return jax.value_and_grad(lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32)), (0, 1, 2))


def fwd_and_fwd_bwd(name: str, causal: bool) -> dict[str, Callable]:
  """The two timed functions of a column: the output, and `fwd_bwd` of it."""
  fn = attention_fn(name, causal)
  return {"fwd": fn, "fwd_bwd": fwd_bwd(fn)}


def call_loop(fn: Callable, calls: int) -> Callable:
  """A jitted program that runs `fn` `calls` times in one loop and returns the last result.

  Each call depends on the one before: the inputs ride in the loop's carry, and before each call one
  element of each input is added 0 x (one element of each of the previous call's results). XLA
  cannot hoist the call out of the loop (its inputs are loop-variant), merge two calls, or drop part
  of a result (all of it is carried), and it does not fold a float multiply by 0 (NaN semantics).
  The update is in place: a few scalars per call, not a pass over the inputs. (An
  `optimization_barrier` on loop-invariant inputs is not enough: XLA:CPU hoisted the whole attention
  out of such a loop.) The trip count is static (no host round-trip per iteration on GPU)."""
  def looped(*args):
    result_shape = jax.eval_shape(fn, *args)
    first = jax.tree.map(lambda s: lax.full(s.shape, 0, s.dtype), result_shape)

    def body(_, carry):
      inputs, previous = carry
      picked = sum(leaf[(0,) * leaf.ndim].astype(jnp.float32) for leaf in jax.tree.leaves(previous))
      zero = jnp.where(jnp.isfinite(picked), picked, 0.0) * 0.0
      corner = lambda x: (0,) * x.ndim
      inputs = tuple(x.at[corner(x)].add(zero.astype(x.dtype)) for x in inputs)
      return inputs, fn(*inputs)

    return lax.fori_loop(0, calls, body, (args, first))[1]

  return jax.jit(looped)


@dataclasses.dataclass(frozen=True)
class Limits:
  """What a cell may use. `device_bytes`/`device`: the memory all of one cell's arrays share
  (None: unknown, not checked); `cell_budget_s`: seconds per timed function (warm-up and
  repeats); `deadline`: a `time.perf_counter()` after which no cell starts."""
  max_temp_bytes: float = math.inf
  device_bytes: Optional[float] = None
  device: str = ""
  cell_budget_s: float = math.inf
  deadline: float = math.inf


def _refusal(shape: Shape, what: str, need: float, have: float, limit: str, name: str,
             described: str = "") -> dict:
  """A refusal row's fields, with what to pass instead: a smaller batch where one is predicted to
  fit (memory grows at least in proportion to it), else shorter sequences; never a batch below 1."""
  budget = ("--max_temp_gb" if limit == "temp"
            else "the device" + (f" ({described})" if described else ""))
  batch = math.floor(shape.batch * have / need)
  advice = (f"--batch={batch} at most, or shorter --seq_lens" if batch >= 1 else
            "shorter --seq_lens (memory grows with T, up to T^2 for the reference) at --batch=1"
            + (", or a larger --max_temp_gb" if limit == "temp"
               else ", or a device with more memory"))
  return dict(status="over_memory_budget" if limit == "temp" else "over_device_memory",
              message=f"T={shape.seq_len} {name}: {what} {need / 2**30:.2f} GiB > "
              f"{have / 2**30:.2f} GiB of {budget}; allowed: {advice}")


def check_abstract_memory(name: str, shape: Shape, limits: Limits) -> Optional[dict]:
  """The inputs and the forward+backward results alone, from shapes (nothing compiled or
  allocated): a refusal row's fields, or None."""
  if limits.device_bytes is None:
    return None
  specs = shape.specs()
  results = jax.eval_shape(fwd_and_fwd_bwd(name, shape.causal)["fwd_bwd"], *specs)
  need = sum(s.size * s.dtype.itemsize for s in (*specs, *jax.tree.leaves(results)))
  if need > limits.device_bytes:
    return _refusal(shape, "inputs and gradients alone", need, limits.device_bytes,
                    "device", name, limits.device)
  return None


def check_compiled_memory(compiled, kind: str, name: str, shape: Shape,
                          limits: Limits) -> tuple[dict, Optional[dict]]:
  """XLA's memory analysis of one compiled loop: ({kind}_temp_bytes, {kind}_bytes) and a
  refusal row's fields or None."""
  stats = compiled.memory_analysis()
  if stats is None:
    return {f"{kind}_temp_bytes": None, f"{kind}_bytes": None}, None
  temp = int(stats.temp_size_in_bytes)
  total = int(stats.argument_size_in_bytes + stats.output_size_in_bytes
              - stats.alias_size_in_bytes) + temp
  sizes = {f"{kind}_temp_bytes": temp, f"{kind}_bytes": total}
  if temp > limits.max_temp_bytes:
    return sizes, _refusal(shape, f"{kind}'s temporaries", temp, limits.max_temp_bytes,
                           "temp", name)
  if limits.device_bytes is not None and total > limits.device_bytes:
    return sizes, _refusal(shape, f"{kind} (inputs, results, temporaries)", total,
                           limits.device_bytes, "device", name, limits.device)
  return sizes, None


def time_loop(compiled, args, calls: int, repeats: int, budget_s: float) -> dict:
  """Per-call ms of a compiled `call_loop`: warm-up, then up to `repeats` measurements
  while the budget lasts (a warm-up over budget: no measurement, its time returned)."""
  start = time.perf_counter()
  jax.block_until_ready(compiled(*args))
  warm_s = time.perf_counter() - start
  samples, spent = [], warm_s
  for _ in range(repeats):
    if spent + warm_s > budget_s:
      break
    start = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    samples.append(time.perf_counter() - start)
    spent += samples[-1]
  return dict(warmup_ms=1e3 * warm_s / calls, samples_ms=[1e3 * s / calls for s in samples])


def median_ms(fn: Callable, args, calls: int, repeats: int) -> float:
  """Median ms per call of `fn` in a compiled `call_loop`, `repeats` times, no budget."""
  exe = call_loop(fn, calls).lower(*args).compile()
  return statistics.median(time_loop(exe, args, calls, repeats, math.inf)["samples_ms"])


def inputs(shape: Shape) -> tuple[jax.Array, ...]:
  """Fresh normal q, k, v of `shape`, seeded by its T."""
  keys = jax.random.split(jax.random.PRNGKey(shape.seq_len), 3)
  return tuple(jax.random.normal(key, s.shape, s.dtype) for key, s in zip(keys, shape.specs()))


def calls_within(calls: int, estimate_ms: dict, budget_s: float) -> int:
  """Calls per loop so that a warm-up and one measurement of the slowest function fit the
  budget: `calls`, fewer for long calls (`LONG_CALL_MS`), or 0 (skip the cell)."""
  slowest = max(estimate_ms.values(), default=0.0)
  if slowest * calls * 2 / 1e3 <= budget_s:
    return calls
  fit = math.floor(budget_s * 1e3 / (2 * slowest))
  return fit if slowest >= LONG_CALL_MS and fit >= MIN_CALLS else 0


def measure(name: str, shape: Shape, repeats: int, limits: Limits = Limits(),
            calls: int = DEFAULT_CALLS, estimate_ms: Optional[dict] = None) -> dict:
  """One table cell: times in ms per call, memory in bytes; `status` says why a cell is empty.
  `estimate_ms`: {kind: predicted ms per call} (from the column's previous T): a cell predicted over
  `limits.cell_budget_s` runs fewer calls if they are long (`calls_within`), else is not run."""
  row = dict(implementation=name, **dataclasses.asdict(shape), calls=calls, repeats=repeats)
  reason = unsupported(name, shape, jax.default_backend())
  if reason:
    return {**row, "status": "unsupported", "message": reason}
  budget_s = min(limits.cell_budget_s, limits.deadline - time.perf_counter())
  fitted = calls_within(calls, estimate_ms or {}, budget_s)
  if not fitted:
    slowest = max(estimate_ms.values())
    return {**row, "status": "over_time_budget", "estimate_ms": slowest,
            "message": f"predicted {slowest:.3g} ms per call x {calls} calls x 2 runs > "
            f"{budget_s:.0f} s budget"}
  calls = row["calls"] = fitted
  functions = fwd_and_fwd_bwd(name, shape.causal)
  flop_counts = dict(zip(functions, flops(name, shape)))
  try:
    refused = check_abstract_memory(name, shape, limits)
    if refused:
      return {**row, **refused}
    compiled = {}
    for kind, fn in functions.items():
      start = time.perf_counter()
      compiled[kind] = call_loop(fn, calls).lower(*shape.specs()).compile()
      row[f"{kind}_compile_s"] = time.perf_counter() - start
      sizes, refused = check_compiled_memory(compiled[kind], kind, name, shape, limits)
      row.update(sizes)
      if refused:
        return {**row, **refused}
    args = inputs(shape)  # The first allocation, once everything fits.
    for kind, exe in compiled.items():
      budget_s = min(limits.cell_budget_s, limits.deadline - time.perf_counter())
      timed = time_loop(exe, args, calls, repeats, budget_s)
      row[f"{kind}_warmup_ms"] = timed["warmup_ms"]
      if not timed["samples_ms"]:
        return {**row, "status": "over_time_budget",
                "message": f"{kind}: one run of {calls} calls took "
                f"{timed['warmup_ms'] * calls / 1e3:.1f} s of a {budget_s:.0f} s budget"}
      row[f"{kind}_ms"] = statistics.median(timed["samples_ms"])
      row[f"{kind}_min_ms"] = min(timed["samples_ms"])
      row[f"{kind}_samples"] = len(timed["samples_ms"])
      row[f"{kind}_tflops"] = flop_counts[kind] / row[f"{kind}_ms"] / 1e9
    device = jax.devices()[0]
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats:
      row["device_peak_bytes"] = stats.get("peak_bytes_in_use")
    row["status"] = "ok"
  except Exception as err:  # pylint: disable=broad-except
    # A kernel that refuses this device or dtype in one line (BadInput) is "unsupported",
    # as is a shape cuDNN refuses when the call is lowered. Any other failure is an "error"
    # row, named, and the table goes on: one kernel that does not compile on a device must
    # not cost the window the others.
    if any(s in str(err).lower() for s in ("resource_exhausted", "out of memory", "oom")):
      row["status"] = "out_of_memory"
    elif name.startswith("softmax_") or isinstance(err, errors.BadInput):
      row["status"] = "unsupported"
    else:
      row["status"] = "error"
    row["message"] = f"{type(err).__name__}: " + str(err).strip().splitlines()[0][:300]
  return row


def loop_overhead_ms(shape: Shape, calls: int, repeats: int, limits: Limits) -> Optional[dict]:
  """{kind: ms per call} of `call_loop` around calls that do nothing (return their inputs,
  shaped as the results): what the dependency between calls costs (a few scalar kernels
  per call), to read beside sub-millisecond rows. None where the inputs would not fit."""
  if check_abstract_memory("softmax_xla", shape, limits):
    return None
  idle = {"fwd": lambda q, k, v: q, "fwd_bwd": lambda q, k, v: (q, k, v)}
  args = inputs(shape)
  return {kind: median_ms(fn, args, calls, repeats) for kind, fn in idle.items()}


def append_jsonl(path: Optional[str], row: dict, **fields) -> None:
  """`fields` and `row` appended to `path` (JSON lines) as soon as the row exists, so a run cut
  short keeps it."""
  if path:
    with open(path, "a") as f:
      f.write(json.dumps({**fields, **row}) + "\n")


def add_ratios(rows: list[dict]) -> None:
  """Each ok row's time over the baseline's at its T (`BASELINES`, first that ran)."""
  for row in rows:
    same_t = {r["implementation"]: r for r in rows
              if r["seq_len"] == row["seq_len"] and r["status"] == "ok"}
    base = next((same_t[b] for b in BASELINES if b in same_t), None)
    if base is None or row["status"] != "ok":
      continue
    row["baseline"] = base["implementation"]
    for kind in ("fwd", "fwd_bwd"):
      row[f"{kind}_vs_baseline"] = row[f"{kind}_ms"] / base[f"{kind}_ms"]


def _scaled(previous: Optional[dict], shape: Shape) -> Optional[dict]:
  """The column's previous ok row's ms per call, scaled by pairs (attention's work)."""
  if previous is None:
    return None
  scale = shape.pairs / dataclasses.replace(shape, seq_len=previous["seq_len"]).pairs
  return {k: previous[f"{k}_ms"] * scale for k in ("fwd", "fwd_bwd")}


def run(seq_lens: Sequence[int], names: Sequence[str], *, batch: int, heads: int,
        head_dim: int, dtype: str, causal: bool, repeats: int, calls: int = DEFAULT_CALLS,
        limits: Limits = Limits(), log: Callable[[str], None] = print,
        on_row: Callable[[dict], None] = lambda row: None) -> list[dict]:
  """Every cell, T by T (all columns at the shortest T first), baselines first at each T.
  `on_row` gets each row as soon as it is measured (with its ratio to the baseline)."""
  unknown = [n for n in names if n not in allowed_names()]
  if unknown:
    raise ValueError(f"implementations {unknown}; allowed: {', '.join(allowed_names())}")
  # The ratio's baselines first: cuDNN softmax on GPU, XLA softmax always (cuDNN may not
  # support the dtype; then the ratio is to XLA's, and says so).
  wanted = (["softmax_cudnn"] if jax.default_backend() == "gpu" else []) + ["softmax_xla"]
  names = wanted + [n for n in names if n not in wanted]
  rows, stopped, last_ok = [], {}, {}
  for seq_len in seq_lens:
    shape = Shape(batch, heads, head_dim, seq_len, causal, dtype)
    overhead = (loop_overhead_ms(shape, calls, repeats, limits)
                if time.perf_counter() < limits.deadline else None)
    for name in names:
      if time.perf_counter() > limits.deadline:
        row = dict(implementation=name, **dataclasses.asdict(shape), status="deadline")
      elif name in stopped:
        row = dict(implementation=name, **dataclasses.asdict(shape), status="stopped",
                   message=f"after {stopped[name]}")
      else:
        row = measure(name, shape, repeats, limits, calls, _scaled(last_ok.get(name), shape))
        for kind, ms in (overhead or {}).items():
          row[f"{kind}_loop_overhead_ms"] = ms
        if row["status"] == "ok":
          last_ok[name] = row
        else:
          stopped[name] = f"{row['status']} at T={seq_len}"
      rows.append(row)
      add_ratios(rows)
      on_row(row)
      log(markdown_row(row) + (f" {row['message']}" if row.get("message") else ""))
  return rows


def markdown_row(r: dict) -> str:
  """One row of `markdown_table` (what `run` logs per cell, with its message if any)."""
  fmt = lambda x, f: "-" if x is None else format(x, f)
  temp = None if r.get("fwd_bwd_temp_bytes") is None else r["fwd_bwd_temp_bytes"] / 2**20
  ms = lambda k: f"{fmt(r.get(k + '_ms'), '.3f')} ({fmt(r.get(k + '_min_ms'), '.3f')})"
  ratio = (f"{r['fwd_bwd_vs_baseline']:.2f} ({r['baseline']})"
           if "fwd_bwd_vs_baseline" in r else "-")
  return (f"| {r['seq_len']} | {r['implementation']} | {ms('fwd')} | {ms('fwd_bwd')} | "
          f"{fmt(temp, '.1f')} | {fmt(r.get('fwd_bwd_tflops'), '.3f')} | {ratio} | "
          f"{r['status']} |")


def markdown_table(rows: list[dict]) -> str:
  return "\n".join(["| T | implementation | fwd ms (min) | fwd+bwd ms (min) | fwd+bwd temp MiB | "
                    "fwd+bwd TFLOP/s | fwd+bwd / baseline | status |",
                    "|---|---|---|---|---|---|---|---|", *map(markdown_row, rows)])


def ratios(rows: list[dict], seq_len: int) -> dict:
  """The issue's targets at one T: blockwise vs the baseline and vs the HYLA reference."""
  cell = {r["implementation"]: r for r in rows if r["seq_len"] == seq_len and r["status"] == "ok"}
  out, blk = {}, cell.get("hyla_blockwise")
  if blk is None:
    return out
  for other in (blk.get("baseline"), "hyla_reference"):
    if other in cell:
      out[f"time_blockwise_over_{other}"] = blk["fwd_bwd_ms"] / cell[other]["fwd_bwd_ms"]
      out[f"temp_blockwise_over_{other}"] = (
          (blk["fwd_bwd_temp_bytes"] or 0) / max(cell[other]["fwd_bwd_temp_bytes"] or 0, 1))
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
    if all(r.get("fwd_bwd_temp_bytes") is not None for r in ok):
      axes[1].plot(t, [r["fwd_bwd_temp_bytes"] / 2**20 for r in ok], "o-", label=name)
  for ax, ylabel in zip(axes, ("time per call (ms, median)",
                               "compiled temp memory, fwd+bwd loop (MiB)")):
    ax.set_xscale("log", base=2)
    ax.set(yscale="log", xlabel="sequence length T", ylabel=ylabel)
    ax.grid(True, which="both", alpha=0.3)
  if axes[0].lines:
    axes[0].legend(fontsize=6)
    axes[1].legend(fontsize=7)
  fig.suptitle(f"{meta.get('device')}: B={meta['batch']} H={meta['heads']} d={meta['head_dim']}"
               f" {meta['dtype']} causal={meta['causal']}", fontsize=9)
  fig.tight_layout()
  png_path = os.path.join(out_dir, "attention_benchmark.png")
  fig.savefig(png_path, dpi=120)
  plt.close(fig)
  return json_path, png_path
