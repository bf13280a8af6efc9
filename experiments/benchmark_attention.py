r"""Attention benchmark: softmax, linear, HYLA reference / blockwise / Pallas over T.

The CPU table of experiments/results/kernels.md (B=4, H=8, d=64, causal, float32, fwd+bwd):
  python experiments/benchmark_attention.py --seq_lens=256,512,1024,2048,4096 \
    --batch=4 --heads=8 --head_dim=64 --causal --dtype=float32 --repeats=5 \
    --out_dir=/tmp/bench_attention
GPU target (bf16): add --dtype=bfloat16 --batch=8 --seq_lens=2048,4096,8192.
Prints one line per cell, then a markdown table and the target ratios at --target_len;
writes results.json and attention_benchmark.png to --out_dir. The Pallas columns run only on
GPU unless --pallas_interpret (slow; tiny shapes only).
"""

import argparse
import json

import jax

from hypernet_attention.ops import benchmark
from hypernet_attention.train import cli
from hypernet_attention.train import run_files


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[int]:
  """The sequence lengths; any bad argument is `parser.error` (one line, exit 2)."""
  try:
    seq_lens = [int(t) for t in args.seq_lens.split(",")]
  except ValueError:
    parser.error(f"--seq_lens={args.seq_lens!r}; allowed: comma-separated positive integers")
  for name in ("batch", "heads", "head_dim", "repeats", "target_len"):
    if getattr(args, name) < 1:
      parser.error(f"--{name}={getattr(args, name)}; allowed: a positive integer")
  if not seq_lens or min(seq_lens) < 1:
    parser.error(f"--seq_lens={args.seq_lens!r}; allowed: comma-separated positive integers")
  if not args.max_temp_gb > 0:
    parser.error(f"--max_temp_gb={args.max_temp_gb}; allowed: a positive number")
  run_files.check_output_dir(args.out_dir, "--out_dir")  # BadInput: one line, before work.
  unknown = [n for n in args.implementations.split(",") if n not in benchmark.IMPLEMENTATIONS]
  if unknown:
    parser.error(f"--implementations: unknown {unknown}; allowed: "
                 f"{','.join(benchmark.IMPLEMENTATIONS)}")
  return seq_lens


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seq_lens", default="256,512,1024,2048,4096")
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
  parser.add_argument("--causal", action=argparse.BooleanOptionalAction, default=True)
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--implementations", default=",".join(benchmark.IMPLEMENTATIONS))
  parser.add_argument("--out_dir", default="/tmp/benchmark_attention")
  parser.add_argument("--max_temp_gb", type=float, default=6.0,
                      help="skip (and stop the column) when compiled temp memory exceeds this")
  parser.add_argument("--pallas_interpret", action="store_true",
                      help="run hyla_pallas in interpret mode off GPU (very slow)")
  parser.add_argument("--target_len", type=int, default=1024)
  args = parser.parse_args()
  seq_lens = _check(parser, args)

  names = [n for n in args.implementations.split(",") if n]
  backend = jax.default_backend()
  pallas = [n for n in names if n.endswith("pallas")]
  if pallas and backend != "gpu" and not args.pallas_interpret:
    print(f"{', '.join(pallas)} skipped on {backend} (pass --pallas_interpret to interpret).")
    names = [n for n in names if n not in pallas]
  device = jax.devices()[0]
  meta = dict(device=f"{device.platform}:{device.device_kind}", backend=backend,
              jax=jax.__version__, batch=args.batch, heads=args.heads,
              head_dim=args.head_dim, dtype=args.dtype, causal=args.causal,
              repeats=args.repeats, max_temp_gb=args.max_temp_gb)
  if backend == "cpu":
    meta.update(benchmark.host_cpu())
  print(json.dumps(meta))
  rows = benchmark.run(
      seq_lens, names, batch=args.batch, heads=args.heads,
      head_dim=args.head_dim, dtype=args.dtype, causal=args.causal, repeats=args.repeats,
      max_temp_bytes=args.max_temp_gb * 2**30, interpret=args.pallas_interpret)
  print(benchmark.markdown_table(rows))
  meta["ratios_at_target_len"] = benchmark.ratios(rows, args.target_len)
  print(f"ratios at T={args.target_len}:", json.dumps(meta["ratios_at_target_len"], indent=1))
  json_path, png_path = benchmark.write_outputs(rows, args.out_dir, meta)
  print("wrote", json_path, png_path)


if __name__ == "__main__":
  cli.run_plain(main)
