r"""What XLA:GPU makes of HYLA's programs, compiled for an H100 on a machine without a GPU.

  python experiments/gpu_program.py --program=attention --implementations=blockwise \
      --seq_lens=1024,4096
  python experiments/gpu_program.py --program=c4_step --models=hyla,softmax --batch_size=64
  python experiments/gpu_program.py --program=population --models=hyla,softmax --members=1,3,24
  python experiments/gpu_program.py --seq_lens=4096 --gpu_tiles=256x256

Per program (attention: forward and forward+backward, B=4 H=8 d=64 causal bf16 by default;
c4_step: one C4 50M train step on random tokens, the step `benchmark_training.py` times;
population: one SRAVEN paper-size train step of 1, 3, ... seeds trained as one population):
the kernels one call launches, the bytes they write (a proxy for HBM traffic, not a time),
and how many of them only move data between layouts (transposes, copies), with the kernel
families that write the most. One JSON line per program to --out as it is compiled;
--hlo_dir keeps each optimized HLO. How and with which caveats: `measure/gpu_program.py`.
Needs jax's CUDA plugin, not a GPU: pip install jax-cuda13-plugin==V jax-cuda13-pjrt==V
(V: the installed jax's version).
"""

import argparse
import json
import os

import jax
import jax.numpy as jnp

from hypernet_attention.errors import BadInput
from hypernet_attention.measure import gpu_program
from hypernet_attention.ops import dispatch
from hypernet_attention.ops import target


def attention_programs(args):
  """(label, fn, args) of each implementation, length and pass."""
  for name in args.implementations.split(","):
    for seq_len in (int(t) for t in args.seq_lens.split(",")):
      x = jax.ShapeDtypeStruct((args.batch, seq_len, args.heads, args.head_dim),
                               jnp.dtype(args.dtype))
      fn = lambda q, k, v, name=name: dispatch.attention(
          q, k, v, is_causal=True, normalization="rms_head", value_network="mlp",
          implementation=name)
      loss = lambda q, k, v, fn=fn: jnp.sum(fn(q, k, v).astype(jnp.float32))
      yield f"{name} T={seq_len} fwd", fn, (x, x, x)
      yield f"{name} T={seq_len} fwd+bwd", jax.grad(loss, (0, 1, 2)), (x, x, x)


def step_text(config, gpu):
  """The optimized HLO of one train step of `config` (a run or a population), compiled for
  GPU `gpu`."""
  from hypernet_attention.train import benchmark  # pylint: disable=g-import-not-at-top
  with target.compiling_for("gpu"):
    trainer, state, *_ = benchmark.trainer_for(config, devices=[gpu_program.device(gpu)])
    return trainer.compile_chunk(state, 1, gpu_program.COMPILER_OPTIONS).as_text()


def c4_config(spec, batch_size):
  """The C4 50M config `benchmark_training.py --synthetic_tokens` times, preset `spec`."""
  from hypernet_attention.train import benchmark  # pylint: disable=g-import-not-at-top
  from hypernet_attention.train import objectives  # pylint: disable=g-import-not-at-top
  return benchmark.model_config(
      "c4_lm", spec, "50m", f"task.name={objectives.SYNTHETIC_LM},batch_size={batch_size}")


def population_config(spec, members):
  """SRAVEN paper size, `members` seeds as one population (1: the single run)."""
  from hypernet_attention.train import benchmark  # pylint: disable=g-import-not-at-top
  return benchmark.population_config(benchmark.model_config("sraven", spec, "paper"), members)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--program", default="attention",
                      choices=("attention", "c4_step", "population"))
  parser.add_argument("--gpu", default="h100", choices=tuple(gpu_program.TARGETS))
  parser.add_argument("--implementations", default="blockwise")
  parser.add_argument("--seq_lens", default="1024,4096")
  parser.add_argument("--batch", type=int, default=4)
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
  parser.add_argument("--models", default="hyla")
  parser.add_argument("--batch_size", type=int, default=64, help="c4_step's batch")
  parser.add_argument("--members", default="1,3,24", help="population: member counts")
  parser.add_argument("--gpu_tiles", default="",
                      help="blockwise's largest GPU tiles BQxBK instead of dispatch.BLOCKS's "
                      "(e.g. 256x256), for every program of this run")
  parser.add_argument("--top", type=int, default=4, help="kernel families listed per program")
  parser.add_argument("--out", default="", help="JSON lines, one per program")
  parser.add_argument("--hlo_dir", default="", help="keep each program's optimized HLO here")
  args = parser.parse_args()
  names = args.implementations.split(",")
  unknown = [n for n in names if n not in dispatch.IMPLEMENTATIONS]
  if unknown:
    parser.error(f"--implementations: {unknown}; allowed: {', '.join(dispatch.IMPLEMENTATIONS)}")
  try:
    if not all(int(t) > 0 for t in args.seq_lens.split(",")):
      raise ValueError
  except ValueError:
    parser.error(f"--seq_lens={args.seq_lens!r}; allowed: comma-separated positive integers")
  try:
    members = [int(m) for m in args.members.split(",")]
    if min(members) < 1:
      raise ValueError
  except ValueError:
    parser.error(f"--members={args.members!r}; allowed: comma-separated positive integers")
  for flag in ("batch", "heads", "head_dim", "batch_size"):
    if getattr(args, flag) < 1:
      parser.error(f"--{flag}={getattr(args, flag)}; allowed: a positive integer")
  if args.gpu_tiles:
    try:
      tiles = tuple(int(n) for n in args.gpu_tiles.split("x"))
      if len(tiles) != 2 or min(tiles) < 1:
        raise ValueError
    except ValueError:
      parser.error(f"--gpu_tiles={args.gpu_tiles!r}; allowed: BQxBK, e.g. 256x256")
    dispatch.BLOCKS["gpu"] = tiles  # This process only: what a GPU would take at these tiles.
  try:
    device = gpu_program.device(args.gpu)
  except BadInput as e:
    parser.error(str(e))
  if args.hlo_dir:
    os.makedirs(args.hlo_dir, exist_ok=True)
  if args.program == "attention":
    programs = ((label, lambda fn=fn, xs=xs: gpu_program.compile_text(fn, *xs, name=args.gpu))
                for label, fn, xs in attention_programs(args))
  elif args.program == "c4_step":
    programs = ((f"c4_step {spec} batch {args.batch_size}",
                 lambda spec=spec: step_text(c4_config(spec, args.batch_size), args.gpu))
                for spec in args.models.split(","))
  else:
    programs = ((f"sraven paper {spec} members {m}",
                 lambda spec=spec, m=m: step_text(population_config(spec, m), args.gpu))
                for spec in args.models.split(",") for m in members)
  print(f"compiled for {device.device_kind} without one (XLA deviceless; autotuning off, "
        "GEMMs through cuBLAS)")
  print("| program | kernels | GB written | layout moves | GB they write | most written |")
  print("|---|---|---|---|---|---|")
  count = 0
  for label, compile_fn in programs:
    try:
      hlo = compile_fn()
    except BadInput as e:
      parser.error(f"{label}: {e}")
    if args.hlo_dir:
      with open(os.path.join(args.hlo_dir, label.replace(" ", "_").replace("/", "_") + ".txt"),
                "w") as f:
        f.write(hlo)
    s = gpu_program.summary(gpu_program.kernels(hlo))
    top = ", ".join(f"{f['family']} {f['bytes_written'] / 1e9:.2f}"
                    for f in s["families"][:args.top])
    print(f"| {label} | {s['launches']} | {s['bytes_written'] / 1e9:.2f} | "
          f"{s['transpose_launches']} | {s['transpose_bytes'] / 1e9:.2f} | {top} |", flush=True)
    if args.out:
      with open(args.out, "a") as f:
        f.write(json.dumps(dict(program=label, device=device.device_kind, **s)) + "\n")
    count += 1
  print(f"gpu_program: {count} programs compiled for {device.device_kind}")


if __name__ == "__main__":
  main()
