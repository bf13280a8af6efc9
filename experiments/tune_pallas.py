r"""Tile sizes and Triton launch parameters of the Pallas kernels, timed against cuDNN.

  python experiments/tune_pallas.py --seq_len=4096 --batch=4 --heads=8 --head_dim=64 \
      --configs=mlp:16x16:4:2,mlp:32x32:8:2,linear:64x64:4:1 --out=/tmp/tune.jsonl

Times (median of --repeats after compilation, bf16, causal) the forward and forward+backward
of `pallas_kernel.attention` for every --configs entry
`value_network:block_qxblock_k:num_warps:num_stages`, beside softmax attention through cuDNN
flash attention and HYLA's blockwise JAX kernel; writes one JSON line per configuration to
--out as it finishes and prints a sorted table at the end. A configuration that Triton cannot
compile (registers, shared memory) is listed as failed, not fatal. Needs a GPU.
"""

import argparse
import json

import jax
import jax.numpy as jnp

from hypernet_attention.ops import benchmark
from hypernet_attention.ops import dispatch
from hypernet_attention.ops import pallas_kernel


def _time(fn, args, repeats):
  loss = lambda *a: jnp.sum(fn(*a).astype(jnp.float32))
  fwd = jax.jit(fn).lower(*args).compile()
  fwd_bwd = jax.jit(jax.grad(loss, (0, 1, 2))).lower(*args).compile()
  return (1e3 * benchmark.median_time(fwd, args, repeats),
          1e3 * benchmark.median_time(fwd_bwd, args, repeats))


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seq_len", type=int, default=4096)
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--configs", default="mlp:16x16:4:2,mlp:32x32:4:2,linear:64x64:4:1")
  parser.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=True,
                      help="also time blockwise HYLA (cuDNN softmax is always timed)")
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--out", default="", help="JSON lines, one per row, as they finish")
  args = parser.parse_args()
  if jax.default_backend() != "gpu":
    raise SystemExit(f"tune_pallas needs a GPU; JAX's backend is {jax.default_backend()}.")
  shape = (args.batch, args.seq_len, args.heads, args.head_dim)
  keys = jax.random.split(jax.random.PRNGKey(0), 3)
  qkv = tuple(jax.random.normal(k, shape, jnp.bfloat16) for k in keys)
  rows = []

  def record(name, fn, **extra):
    try:
      fwd, fwd_bwd = _time(fn, qkv, args.repeats)
      row = dict(name=name, fwd_ms=fwd, fwd_bwd_ms=fwd_bwd, status="ok", **extra)
    except Exception as err:  # pylint: disable=broad-except
      row = dict(name=name, status=f"failed: {type(err).__name__}: {str(err)[:120]}", **extra)
    rows.append(row)
    print(json.dumps(row), flush=True)
    if args.out:
      with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")

  record("cudnn_softmax", lambda q, k, v: dispatch.attention(
      q, k, v, is_causal=True, normalization="softmax", value_network="linear"))
  configs = [c.split(":") for c in args.configs.split(",") if c]
  if args.baselines:
    for vn in dict.fromkeys(c[0] for c in configs):
      record(f"blockwise_{vn}", lambda q, k, v, vn=vn: dispatch.attention(
          q, k, v, is_causal=True, normalization="rms_head", value_network=vn,
          implementation="blockwise"))
  for vn, blocks, warps, stages in configs:
    bq, bk = (int(x) for x in blocks.split("x"))
    launch = pallas_kernel.Launch(num_warps=int(warps), num_stages=int(stages))
    record(f"pallas_{vn}", lambda q, k, v, vn=vn, bq=bq, bk=bk, launch=launch:
           pallas_kernel.attention(q, k, v, is_causal=True, normalization="rms_head",
                                   value_network=vn, block_q=bq, block_k=bk,
                                   launch=launch, interpret=False),
           block_q=bq, block_k=bk, warps=int(warps), stages=int(stages))
  base = rows[0].get("fwd_bwd_ms")
  print(f"\nT={args.seq_len} B={args.batch} H={args.heads} d={args.head_dim} bf16 causal; "
        f"x = fwd+bwd time over cuDNN softmax's")
  print("| kernel | bq | bk | warps | stages | fwd ms | fwd+bwd ms | x cuDNN |")
  print("|---|---|---|---|---|---|---|---|")
  for r in sorted(rows, key=lambda r: (r["name"], r.get("fwd_bwd_ms", 1e9))):
    if r["status"] != "ok":
      print(f"| {r['name']} | {r.get('block_q', '-')} | {r.get('block_k', '-')} | "
            f"{r.get('warps', '-')} | {r.get('stages', '-')} | {r['status'][:60]} | | |")
      continue
    print(f"| {r['name']} | {r.get('block_q', '-')} | {r.get('block_k', '-')} | "
          f"{r.get('warps', '-')} | {r.get('stages', '-')} | {r['fwd_ms']:.2f} | "
          f"{r['fwd_bwd_ms']:.2f} | {r['fwd_bwd_ms'] / base:.2f} |")


if __name__ == "__main__":
  main()
