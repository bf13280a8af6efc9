"""The Mosaic kernels one at a time, each in its own process: the first minute of a GPU window.

  compute-sanitizer --tool memcheck python -m hypernet_attention.measure.mosaic_rungs forward
  python -m hypernet_attention.measure.mosaic_rungs parity --seq_lens=128,256,1000

Why: a kernel that faults on the GPU (`CUDA_ERROR_MISALIGNED_ADDRESS`) kills the process's
CUDA context, and every later call in that process fails with it, so a kernel not yet seen
to run in this window runs alone, smallest shape first, under `compute-sanitizer`, which
names the faulting instruction and address. The ladder, bottom up:
  forward       the forward kernel at its default tiles (paired 64x8x8): TMA loads and store,
                scores, RMSHead code, the code's key pairs exchanged in registers (inline Mosaic
                GPU), value network, read-out
  dq            + the backward's dS and dV kernels and the matmul kernels for dQ and dK
  fwd_bwd       the forward and the dq rung's backward once at a timing shape, unchecked (the
                reference would not fit): the program the window's profiler (ncu) reads
  parity        values and gradients in bfloat16 against the float64 reference at each T
                (`measure/parity.check`, the GPU window's bound), once the rungs have passed
--schedule=ds_two_warpgroups runs a rung with that `mosaic_kernel.Blocks` flag (not yet on a GPU).
Each rung prints one JSON line (rung, shape, status, max |error| against the float32
reference as a sanity check of what ran) and exits 0 when it ran and its numbers are finite
and close, 1 otherwise, 2 where this machine cannot run it (no Hopper GPU, no interpret mode).
On a CPU with jax >= 0.11 the kernels run in Mosaic's interpret mode (the window's dry run)."""

from __future__ import annotations

import json
import sys
import time

from hypernet_attention import errors

RUNGS = ("forward", "dq", "fwd_bwd", "parity")
SCHEDULES = ("default", "ds_two_warpgroups")  # "default", or a `mosaic_kernel.Blocks` flag
# A sanity bound for the rungs (bf16 inputs and operands against the float32 reference, in
# relative Frobenius norm per quantity); the parity rung holds the real, derived bound.
RUNG_TOLERANCE = 0.05


def _kernel_and_reference(rung: str, interpret, schedule: str = "default"):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from hypernet_attention.measure import parity  # pylint: disable=g-import-not-at-top
  from hypernet_attention.ops import mosaic_kernel  # pylint: disable=g-import-not-at-top

  blocks = mosaic_kernel.Blocks(**({} if schedule == "default" else {schedule: True}))

  def kernel(q, k, v):
    return mosaic_kernel.attention(q, k, v, is_causal=True, interpret=interpret, blocks=blocks)

  if rung == "forward":
    return jax.jit(kernel), jax.jit(parity.hyla_reference)
  # fwd_bwd keeps the loss's value, so that its forward kernel runs too (under grad alone XLA
  # drops it: the profiler then sees no forward).
  differentiate = jax.value_and_grad if rung == "fwd_bwd" else jax.grad
  grads = lambda fn: jax.jit(differentiate(lambda q, k, v, cot: (fn(q, k, v).astype(
      jnp.float32) * cot).sum(), argnums=(0, 1, 2)))
  return grads(kernel), grads(parity.hyla_reference)


def interpret_params():
  """(`plgpu.InterpretGPUParams()`, None): the Mosaic kernels' `interpret=` to run them on a
  CPU; or (None, why this jax cannot interpret Mosaic)."""
  from hypernet_attention.ops import mosaic_kernel  # pylint: disable=g-import-not-at-top
  why_not = mosaic_kernel.available()
  if why_not:
    return None, why_not
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  return plgpu.InterpretGPUParams(), None


def run_rung(rung: str, batch: int, seq_len: int, heads: int, head_dim: int,
             schedule: str = "default") -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from hypernet_attention.ops import mosaic_kernel  # pylint: disable=g-import-not-at-top
  row = dict(rung=rung, schedule=schedule, batch=batch, seq_len=seq_len, heads=heads,
             head_dim=head_dim, dtype="bfloat16", causal=True, device=jax.devices()[0].device_kind)
  if jax.default_backend() != "gpu":  # Mosaic's interpret mode, where this jax has one.
    interpret, why_not = interpret_params()
  else:  # Compiled, where dispatch's own check passes: a Hopper GPU.
    interpret, why_not = None, None
    try:
      mosaic_kernel.check_device(jnp.bfloat16)
    except errors.BadInput as e:
      why_not = str(e)
  if why_not:
    return {**row, "status": "unsupported", "message": why_not}
  row["mode"] = "compiled" if interpret is None else "interpret"
  keys = jax.random.split(jax.random.PRNGKey(seq_len), 4)
  q, k, v, cot = (jax.random.normal(key, (batch, seq_len, heads, head_dim), jnp.float32)
                  for key in keys)
  kernel, ref = _kernel_and_reference(rung, interpret, schedule)
  args = (q, k, v) if rung == "forward" else (q, k, v, cot)
  start = time.monotonic()
  got = jax.block_until_ready(kernel(*(a.astype(jnp.bfloat16) for a in args[:3]), *args[3:]))
  row["seconds"] = round(time.monotonic() - start, 2)  # compile and one call
  finite = all(bool(np.isfinite(np.float32(g)).all()) for g in jax.tree.leaves(got))
  if rung == "fwd_bwd":  # the dq rung checked these kernels' numbers at T=128
    return {**row, "status": "pass" if finite else "fail"}
  rounded = [a.astype(jnp.bfloat16).astype(jnp.float32) for a in args[:3]]
  exact = ref(*rounded, *args[3:])
  rel_errs = [float(np.linalg.norm(np.float32(g) - np.float32(e)) / np.linalg.norm(e))
              for g, e in zip(jax.tree.leaves(got), jax.tree.leaves(exact))]
  row["rel_errs"] = [round(e, 5) for e in rel_errs]  # out, or dq, dk, dv
  row["max_rel_err"] = max(rel_errs)
  row["status"] = "pass" if finite and row["max_rel_err"] < RUNG_TOLERANCE else "fail"
  return row


def main(argv=None) -> int:
  parser = errors.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("rung", choices=RUNGS)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--seq_len", type=int, default=128, help="the rungs' T")
  parser.add_argument("--seq_lens", default="128,256,1000", help="parity's T")
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--head_dim", type=int, default=64)
  parser.add_argument("--schedule", choices=SCHEDULES, default="default",
                      help="the rungs' Blocks flag (not parity's)")
  args = parser.parse_args(argv)
  parser.check_positive(args, "batch", "seq_len", "heads", "head_dim")
  if args.rung == "parity" and args.schedule != "default":
    parser.error(f"--schedule={args.schedule!r} applies to the rungs; allowed with parity: "
                 "default")
  try:
    seq_lens = [int(t) for t in args.seq_lens.split(",")]
  except ValueError:
    parser.error(f"--seq_lens={args.seq_lens!r}; allowed: comma-separated positive integers")
  if args.rung != "parity":
    row = run_rung(args.rung, args.batch, args.seq_len, args.heads, args.head_dim,
                   args.schedule)
    print(json.dumps(row), flush=True)
    return {"pass": 0, "unsupported": 2}.get(row["status"], 1)
  from hypernet_attention.measure import parity  # pylint: disable=g-import-not-at-top
  for seq_len in seq_lens:
    for row in parity.check(seq_len, "bfloat16", ["mosaic"], batch=args.batch, heads=args.heads,
                            head_dim=args.head_dim):
      print(json.dumps(row), flush=True)
      if row["status"] != "pass":
        return 2 if row["status"] == "unsupported" else 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
