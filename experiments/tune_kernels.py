r"""Tile configurations of HYLA's GPU kernels (Mosaic, blockwise), timed beside cuDNN.

  python experiments/tune_kernels.py --seq_len=4096 --batch=4 --heads=8 --head_dim=64 \
      --configs=mosaic:64x8x8:kernel:paired,mosaic:64x8x8:kernel:paired:ds_two_warpgroups
  python experiments/tune_kernels.py --configs=blockwise:256x256,blockwise:128x128
  python experiments/tune_kernels.py --interpret --seq_len=64 --batch=1 --dtype=float32 ...

--configs entries, each timed forward and forward+backward (causal):
  mosaic:BQxBKxBV:DQ     `mosaic_kernel.attention` with the forward's Blocks(BQ, BK, BV) and
                         the backward's dQ/dK path DQ (`mosaic_kernel_bwd.DQ_PATHS`: kernel
                         | xla); the suffixes :paired and :ds_two_warpgroups set those Blocks
                         flags (the default tiles are mosaic:64x8x8:kernel:paired)
  blockwise:BQxBK        XLA's blockwise HYLA with tiles BQ x BK
Softmax through cuDNN (XLA's softmax off a GPU) is always the first row. Each row is timed over
--calls calls inside one jitted loop (`measure/benchmark.call_loop`: sub-millisecond baselines are
not inflated by a dispatch per call), median of --repeats, and is printed and appended to --out as
one JSON line as soon as it exists; a table of the rows, in the order timed, ends the run. A
configuration the kernel refuses (tiles over Hopper's shared memory, Mosaic's swizzles) or that does
not compile is a row with its one-line reason (status refused, error, or unsupported where this jax
cannot interpret Mosaic), not the end of the sweep.
Needs a GPU, or --interpret (tiny sizes; Mosaic needs jax >= 0.11), or, timing nothing, --ptxas:
each Mosaic kernel's registers, spills, occupancy and instructions per pair, compiled for an H100
on any machine (`measure/ptxas.py`; jax's CUDA plugin)."""

import dataclasses
import json
import time

import jax
import jax.numpy as jnp

from hypernet_attention import errors
from hypernet_attention.measure import benchmark
from hypernet_attention.measure import mosaic_rungs
from hypernet_attention.measure import ptxas
from hypernet_attention.ops import blockwise
from hypernet_attention.ops import mosaic_kernel
from hypernet_attention.ops import mosaic_kernel_bwd
from hypernet_attention.runs import cli
from hypernet_attention.runs import run_files
from hypernet_attention.train import profiling

# The kernels' schedule flags (`mosaic_kernel.Blocks` fields; ds_two_warpgroups: the
# backward's), as --configs suffixes.
SCHEDULES = ("paired", "ds_two_warpgroups")


class Unsupported(Exception):
  """This jax cannot run the configuration here (Mosaic's interpreter needs jax >= 0.11)."""


def parse_config(entry: str) -> dict:
  """One --configs entry as a row's identity; ValueError in one line if malformed."""
  parts = entry.split(":")
  if parts[0] == "mosaic" and len(parts) >= 3 and parts[2] not in mosaic_kernel_bwd.DQ_PATHS:
    raise ValueError(f"--configs entry {entry!r}: DQ {parts[2]!r}; allowed: "
                     f"{', '.join(mosaic_kernel_bwd.DQ_PATHS)}")
  # 0: malformed. isdecimal, not isdigit: int() refuses digits such as '²' that isdigit passes.
  tiles = [int(x) if x.isdecimal() else 0 for x in (parts[1] if len(parts) > 1 else "").split("x")]
  flags = parts[3:]
  if (min(tiles) > 0 and parts[0] == "mosaic" and len(parts) >= 3 and len(tiles) == 3
      and set(flags) <= set(SCHEDULES) and len(set(flags)) == len(flags)):
    return dict(name="mosaic", block_q=tiles[0], block_k=tiles[1], block_v=tiles[2],
                dq=parts[2], **{flag: flag in flags for flag in SCHEDULES})
  if min(tiles) > 0 and parts[0] == "blockwise" and len(parts) == 2 and len(tiles) == 2:
    return dict(name="blockwise", block_q=tiles[0], block_k=tiles[1])
  raise ValueError(f"--configs entry {entry!r}; allowed: mosaic:BQxBKxBV:DQ[:paired]"
                   "[:ds_two_warpgroups] (e.g. mosaic:64x8x4:kernel) or blockwise:BQxBK, tiles "
                   "positive integers")


def kernel_fn(config: dict, interpret: bool):
  """(q, k, v) -> causal HYLA output through the configured kernel."""
  if config["name"] == "blockwise":
    return lambda q, k, v: blockwise.attention(
        q, k, v, is_causal=True, block_q=config["block_q"], block_k=config["block_k"])
  params, why_not = mosaic_rungs.interpret_params() if interpret else (None, None)
  if why_not:
    raise Unsupported(why_not)
  blocks = mosaic_kernel.Blocks(config["block_q"], config["block_k"], config["block_v"],
                                **{flag: config[flag] for flag in SCHEDULES})
  return lambda q, k, v: mosaic_kernel.attention(
      q, k, v, is_causal=True, blocks=blocks, dq=config["dq"], interpret=params)


def _tiles(config: dict) -> str:
  """A row's tiles as its tables print them: BQxBKxBV (+ paired) or BQxBK."""
  tiles = "x".join(str(config[k]) for k in ("block_q", "block_k", "block_v") if k in config)
  return " ".join([tiles or "-", *(flag for flag in SCHEDULES if config.get(flag))])


def _emit(row: dict, out: str) -> None:
  print(json.dumps(row), flush=True)
  benchmark.append_jsonl(out, row)


# Program names by the kernels' entries (`hyla_*` in mosaic_kernel*.py); the matmul kernel's two
# compiles are dQ, then dK (the order backward() launches them).
PROGRAMS = {"hyla_forward": ("forward",), "hyla_ds": ("dS",), "hyla_dv": ("dV",),
            "hyla_dq_dk": ("dQ", "dK")}


def _ptxas_rows(configs: list[dict], args, version: str) -> int:
  """--ptxas: one row per Mosaic kernel of each config (a backward once per distinct dq and dS
  warpgroups) and a table: registers, spills, CTAs per SM and warps per scheduler
  (`ptxas.occupancy`), and from its hot loop's static PTX (`ptxas.hot_loop`), per (q, k) pair over
  all V columns, the instructions one warpgroup (128 threads) issues and their FMA share."""
  ptxas.device()  # no CUDA plugin: one line, before any work
  shape = benchmark.Shape(args.batch, args.heads, args.head_dim, args.seq_len, True, args.dtype)
  print("| tiles | program | registers | spill stores / loads (B) | shared memory (B) | "
        "CTAs/SM | warps per scheduler | instructions per pair | FMA share |")
  print("|---|---|---|---|---|---|---|---|---|")
  count, backward_done = 0, set()
  for config in (c for c in configs if c["name"] == "mosaic"):
    fn = kernel_fn(config, interpret=False)
    grad = jax.grad(lambda *a, fn=fn: jnp.sum(fn(*a).astype(jnp.float32)), (0, 1, 2))
    passes = [("forward", fn)]
    backward = (config["dq"], config["ds_two_warpgroups"])  # what the backward's kernels take
    if backward not in backward_done:
      passes.append(("backward", grad))
      backward_done.add(backward)
    for pass_name, f in passes:
      names = {entry: list(programs) for entry, programs in PROGRAMS.items()}
      for found in ptxas.kernels(f, *shape.specs()):
        name = names[found.pop("kernel")].pop(0)
        # (pairs, value columns) one pass of its hot loop covers: the forward's key tile, the dS
        # kernel's value column, the dV kernel's query tile; the matmuls have no per-pair loop.
        work = {"forward": (config["block_q"] * config["block_k"], config["block_v"]),
                "dS": (64 * 8, 1), "dV": (64 * 8, 4)}.get(name)
        if work:  # thread instructions x 128 threads, per pair, times the passes over V
          found["instructions_per_pair"] = round(
              found["loop_instructions"] * 128 * args.head_dim / work[1] / work[0], 1)
          found["fma_share"] = round(found["loop_fma"] / found["loop_instructions"], 3)
        fits = ptxas.occupancy(found["registers"], found["smem_bytes"], found["threads"] // 32)
        _emit(dict(config, **{"pass": pass_name}, kernel=name, **found, ctas_per_sm=fits.ctas,
                   warps_per_scheduler=fits.warps_per_scheduler, **dataclasses.asdict(shape),
                   device="compile-only H100", ptxas=version, jax=jax.__version__), args.out)
        print(f"| {_tiles(config)} | {name} | {found['registers']} | {found['spill_stores']} / "
              f"{found['spill_loads']} | {found['smem_bytes']:,} | {fits.ctas} | "
              f"{fits.warps_per_scheduler:g} | {found.get('instructions_per_pair', '-')} | "
              f"{found.get('fma_share', '-')} |")
        count += 1
  print(f"tune_kernels --ptxas: {count} kernels compiled", flush=True)
  return 0


def main():
  parser = errors.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seq_len", type=int, default=4096)
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
  parser.add_argument("--configs", default="mosaic:64x8x8:kernel:paired,blockwise:256x256")
  parser.add_argument("--calls", type=int, default=20, help="calls per jitted loop")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--interpret", action="store_true",
                      help="run the kernels in Pallas interpret mode (CPU; tiny sizes only)")
  parser.add_argument("--out", default="", help="JSON lines, one per row, as they finish")
  parser.add_argument("--profile", action="store_true", help="also trace each timed row's "
                      "fwd+bwd and record its kernels' ms per call (kernels_ms, the top 8)")
  parser.add_argument("--ptxas", action="store_true", help="time nothing: each Mosaic "
                      "config's kernels compiled for an H100 without a GPU, their registers "
                      "and spills as ptxas reports them (measure/ptxas.py)")
  args = parser.parse_args()
  if args.ptxas:
    ptxas_version = ptxas.prepare()  # before anything asks JAX for its backends
  try:
    configs = [parse_config(c) for c in args.configs.split(",") if c]
  except ValueError as err:
    parser.error(str(err))
  parser.check_positive(args, "seq_len", "batch", "heads", "head_dim", "calls", "repeats")
  if args.out:  # Appended to as rows finish: a file in the way is named before any work.
    run_files.output_path(args.out, "--out", overwrite=True)
  if args.ptxas:
    return _ptxas_rows(configs, args, ptxas_version)
  if jax.default_backend() != "gpu" and not args.interpret:
    parser.error(f"JAX's backend is {jax.default_backend()}: the kernels need a GPU; allowed "
                 "off a GPU: --interpret (tiny sizes)")
  shape = benchmark.Shape(args.batch, args.heads, args.head_dim, args.seq_len, True, args.dtype)
  qkv = benchmark.inputs(shape)
  meta = dict(dataclasses.asdict(shape), device=jax.devices()[0].device_kind,
              interpret=args.interpret)
  rows = []

  def record(config, make_fn):
    start = time.perf_counter()
    try:
      fn = make_fn()
      fwd, both = (benchmark.median_ms(f, qkv, args.calls, args.repeats)
                   for f in (fn, benchmark.fwd_bwd(fn)))
      row = dict(config, fwd_ms=fwd, fwd_bwd_ms=both, status="ok")
      if args.profile:
        kernels = profiling.kernel_ms(benchmark.fwd_bwd(fn), qkv, args.calls)
        row["kernels_ms"] = {k: round(ms, 4) for k, ms in list(kernels.items())[:8]}
    except Exception as err:  # pylint: disable=broad-except
      first = (str(err).strip().splitlines() or [""])[0][:200]
      status = ("refused" if isinstance(err, ValueError) else
                "unsupported" if isinstance(err, Unsupported) else "error")
      row = dict(config, status=status, message=f"{type(err).__name__}: {first}")
    row.update(meta, seconds=round(time.perf_counter() - start, 1))
    rows.append(row)
    _emit(row, args.out)

  record(dict(name="softmax"), lambda: benchmark.attention_fn("softmax", causal=True))
  for config in configs:
    record(config, lambda config=config: kernel_fn(config, args.interpret))
  base = rows[0].get("fwd_bwd_ms")
  print(f"\nT={args.seq_len} B={args.batch} H={args.heads} d={args.head_dim} {args.dtype} "
        f"causal on {meta['device']}; x = fwd+bwd time over softmax's")
  print("| kernel | tiles | dq | fwd ms | fwd+bwd ms | x softmax |")
  print("|---|---|---|---|---|---|")
  for r in rows:
    tiles = _tiles(r)
    how = r.get("dq") or "-"
    if r["status"] != "ok":
      print(f"| {r['name']} | {tiles} | {how} | {r['status']}: {r['message'][:70]} | | |")
      continue
    ratio = f"{r['fwd_bwd_ms'] / base:.2f}" if base else "-"
    print(f"| {r['name']} | {tiles} | {how} | {r['fwd_ms']:.3f} | {r['fwd_bwd_ms']:.3f} | "
          f"{ratio} |")
  for r in rows:
    if r.get("kernels_ms"):
      print(f"{r['name']} fwd+bwd kernels, ms per call: " +
            ", ".join(f"{k} {ms:.3f}" for k, ms in r["kernels_ms"].items()))
  done = sum(r["status"] == "ok" for r in rows)
  print(f"tune_kernels: {done} of {len(rows)} rows timed", flush=True)


if __name__ == "__main__":
  cli.run_plain(main)
