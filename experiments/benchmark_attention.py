r"""Attention benchmark: softmax (cuDNN, XLA), linear, HYLA through every dispatch implementation.

The CPU table of experiments/results/kernels.md (B=4, H=8, d=64, causal, float32, fwd+bwd):
  python experiments/benchmark_attention.py --seq_lens=256,512,1024,2048,4096 \
    --batch=4 --heads=8 --head_dim=64 --causal --dtype=float32 --repeats=5 \
    --out_dir=/tmp/bench_attention
GPU: --dtype=bfloat16 --seq_lens=1024,4096,16384 --parity_lens=256,1000 --cell_budget_s=15.
How a cell is timed, sized and refused: `hypernet_attention/measure/benchmark.py`. Prints one
line per cell, then a markdown table and the target ratios at --target_len; writes
results.json and attention_benchmark.png to --out_dir, and with --jsonl appends each row to
that file as soon as it is measured.

--parity_lens: first check values and gradients of every HYLA implementation against the
float64 reference at those lengths (`measure/parity.py`); a failure exits with status 1 before
anything is timed."""

import argparse
import functools
import json
import math
import os
import time

import jax

from hypernet_attention import errors
from hypernet_attention.measure import benchmark
from hypernet_attention.measure import parity
from hypernet_attention.runs import cli
from hypernet_attention.runs import machine
from hypernet_attention.runs import run_files
from hypernet_attention.train import memory

PARITY_FAILED_EXIT_CODE = 1


def _lengths(parser, flag: str, text: str, allow_empty: bool) -> list[int]:
  try:
    lens = [int(t) for t in text.split(",") if t.strip()]
  except ValueError:
    lens = [0]
  if (not lens and not allow_empty) or (lens and min(lens) < 1):
    parser.error(f"--{flag}={text!r}; allowed: comma-separated positive integers")
  return lens


def _check(parser: errors.ArgumentParser, args: argparse.Namespace) -> None:
  """Any bad argument is `parser.error` (one line, exit 2), before any work."""
  args.seq_lens = _lengths(parser, "seq_lens", args.seq_lens, allow_empty=args.parity_only)
  args.parity_lens = _lengths(parser, "parity_lens", args.parity_lens, allow_empty=True)
  if args.parity_only and not args.parity_lens:
    parser.error("--parity_only without --parity_lens; allowed: e.g. --parity_lens=256,1000")
  parser.check_positive(args, "batch", "heads", "head_dim", "repeats", "target_len", "calls")
  parser.check_positive(args, "max_temp_gb", "cell_budget_s", "deadline_s", what="number")
  run_files.check_output_dir(args.out_dir, "--out_dir")  # BadInput: one line, before work.
  if args.jsonl:  # Appended to: an existing file is kept.
    run_files.output_path(args.jsonl, "--jsonl", overwrite=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.jsonl)), exist_ok=True)
  args.implementations = [n for n in args.implementations.split(",") if n]
  unknown = [n for n in args.implementations if n not in benchmark.allowed_names()]
  if unknown or not args.implementations:
    parser.error(f"--implementations: unknown {unknown}; allowed: "
                 f"{','.join(benchmark.allowed_names())}")


def main():
  parser = errors.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seq_lens", default="256,512,1024,2048,4096")
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
  parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
  parser.add_argument("--repeats", type=int, default=5, help="measurements per cell")
  parser.add_argument("--calls", type=int, default=benchmark.DEFAULT_CALLS,
                      help="calls per measurement, inside one jitted loop")
  parser.add_argument("--implementations", default=",".join(benchmark.implementations()))
  parser.add_argument("--out_dir", default="/tmp/benchmark_attention")
  parser.add_argument("--jsonl", default=None, help="append each row here as it is measured")
  parser.add_argument("--max_temp_gb", type=float, default=6.0,
                      help="refuse (and stop the column) when the compiled temporaries exceed this")
  parser.add_argument("--cell_budget_s", type=float, default=math.inf,
                      help="seconds per timed function of a cell; a column whose next cell "
                      "is predicted over it stops")
  parser.add_argument("--deadline_s", type=float, default=math.inf,
                      help="no cell starts after this many seconds")
  parser.add_argument("--parity_lens", default="",
                      help="check every HYLA implementation against the reference first")
  parser.add_argument("--parity_only", action="store_true")
  parser.add_argument("--target_len", type=int, default=1024)
  args = parser.parse_args()
  _check(parser, args)
  deadline = time.perf_counter() + args.deadline_s

  backend = jax.default_backend()
  device = jax.devices()[0]
  meta = dict(device=f"{device.platform}:{device.device_kind}", backend=backend,
              jax=jax.__version__, batch=args.batch, heads=args.heads,
              head_dim=args.head_dim, dtype=args.dtype, causal=args.causal,
              repeats=args.repeats, calls=args.calls, max_temp_gb=args.max_temp_gb)
  if backend == "cpu":
    meta.update(machine.host())  # CPU timings and their ratios move with the host.
  print(json.dumps(meta))

  if args.parity_lens:
    rows = parity.run(args.parity_lens, args.dtype, batch=args.batch, heads=args.heads,
                      head_dim=args.head_dim,
                      on_row=functools.partial(benchmark.append_jsonl, args.jsonl, kind="parity"))
    # "unsupported": a kernel that refused this device or dtype (e.g. mosaic off Hopper);
    # "error": one that does not compile here, recorded (its timing rows say "error" too).
    # Only a wrong answer ("fail") stops the window.
    if any(r["status"] == "fail" for r in rows):
      print("parity failed: nothing timed.")
      raise SystemExit(PARITY_FAILED_EXIT_CODE)
    if args.parity_only:
      return

  have = memory.capacity(jax.devices())
  limits = benchmark.Limits(
      max_temp_bytes=args.max_temp_gb * 2**30,
      device_bytes=None if have is None else have.bytes / have.shared_by,
      device="" if have is None else have.described, cell_budget_s=args.cell_budget_s,
      deadline=deadline)
  rows = benchmark.run(
      args.seq_lens, args.implementations, batch=args.batch, heads=args.heads,
      head_dim=args.head_dim, dtype=args.dtype, causal=args.causal, repeats=args.repeats,
      calls=args.calls, limits=limits,
      on_row=functools.partial(benchmark.append_jsonl, args.jsonl, kind="attention"))
  print(benchmark.markdown_table(rows))
  meta["ratios_at_target_len"] = benchmark.ratios(rows, args.target_len)
  print(f"ratios at T={args.target_len}:", json.dumps(meta["ratios_at_target_len"], indent=1))
  json_path, png_path = benchmark.write_outputs(rows, args.out_dir, meta)
  print("wrote", json_path, png_path)


if __name__ == "__main__":
  cli.run_plain(main)
