"""HYLA as fused Pallas Mosaic GPU kernels for Hopper: the forward, and the custom VJP.

What it computes: `reference.attention` with normalization='rms_head', value_network='mlp',
activation='relu' (HYLA, the paper's Eqs. 6-7), optionally causal and with a key-padding
mask; nothing else (`supports` says so and `attention` refuses the rest).

The layout: the per-pair tensors stay in registers. One program per (batch b, query tile of
bq, value slice of bv columns); all heads of a query tile live in one program because RMSHead
normalizes each (q, k) pair across heads. Per key tile of bk keys (to the causal diagonal,
through a two-slot TMA ring: the tile after next loads while this one computes):
  s_h  = q_h k_h^T                                 H wgmmas, (bq, bk) f32 accumulators
  c_h  = s_h / rms_h(s)   (masked -> 0)            registers, all heads at hand (Eq. 7)
  for each column j of the slice:
    u_j  = sum_h c_h * v_hj[None, :]               (bq, bk): v_hj, key k's value of head h,
                                                   column j, broadcast down the rows
    z_j  = relu(u_j)
    y_hj += sum over 8-column chunks of c_h * z_j  (bq, 8) per (h, j): FMAs within a thread
At the end y_hj is summed over its 8 columns (the one cross-thread reduction) and stored. Per pair
and column that is 2H+1 multiply-adds, the value network's own count, with no shuffles in the key
loop: the code never leaves the registers the score wgmmas leave it in, as flash attention keeps
its scores, and the value network is elementwise arithmetic in that same (WGMMA) layout. What it
trades: the scores are recomputed once per value slice (V / bv times, H*D tensor-core multiply-adds
per pair each time) against (2H+1)*bv vector ones, and registers bound bk and bv (per thread,
bq=64: H*bk/2 for the code, H*bv*4 for y; H*bv*2 with `Blocks.paired`, two value columns per
accumulator). The backward (`mosaic_kernel_bwd.py`) keeps the same layout; `attention` is a
`jax.custom_vjp` whose residuals are the inputs only.

The ceiling: per causal pair the value network is (2H+1)V multiply-adds forward, ~3.4x that
backward: at T=4096, B=4, H=8, V=64 ~4.8 ms fwd+bwd at an H100's float32 CUDA-core peak, ~6.3x
cuDNN's softmax (experiments/results/kernels.md has the history of the layouts and timings).

Precision: scores, code, u, z and y in float32 from input-dtype operands (Q, K, V); on
hardware the score wgmmas take bf16/f16 (float32 inputs become TF32, and do not fit SMEM:
interpret mode only, exact float32 there).
Shape letters: B batch, H heads (Hv padded so each V ring slot spans a multiple of 128
bytes, TMA's SMEM alignment), Q / K positions (Qp / Kp padded), D query/key width (padded to
a 128-byte row), V value width, J value slices of bv columns.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp

from hypernet_attention.errors import BadInput
from hypernet_attention.ops import mosaic_kernel_bwd
from hypernet_attention.ops import mosaic_smem
from hypernet_attention.ops import reference

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Blocks:
  """The kernels' tiles and schedule flags (the tiles are the forward's; `ds_two_warpgroups` is
  the backward's dS kernel's): bq queries (wgmma M: a multiple of 64), bk keys (wgmma N: a
  multiple of 8), bv value columns (a loop); and its schedule. The default, paired 64x8x8, was
  the fastest on an H200 (experiments/results/gpu_windows/2026-11-28_h200; kernels.md).

  paired: each (bq, 8) accumulator of y holds two value columns j, j+1 (in its even and its odd
  columns) instead of one, each summed over the thread's two keys in-thread, so y takes half the
  registers and bv can double (64x8x8) at the same multiply-adds per pair: half the score
  recomputation and half the per-tile work (code, barriers) per value column. How: with c' the code
  with each key pair (2m, 2m+1) exchanged (`mosaic_smem.swap_pairs`), acc += c * relu(sum_h c_h
  v_mix_h) + c' * relu(sum_h c'_h v_swap_h), where XLA lays out v_mix[k] = v[j + k % 2, k] and
  v_swap[k] = v[j + k % 2, k ^ 1] (`_paired_values`)."""
  block_q: int = 64
  block_k: int = 8
  block_v: int = 8
  paired: bool = True  # two value columns per accumulator (bv even)
  # The backward's dS kernel with two warpgroups per CTA, Q and dY shared (mosaic_kernel_bwd.
  # ds_smem): two warps per scheduler, not one. Not yet run on a GPU.
  ds_two_warpgroups: bool = False


DEFAULT_BLOCKS = Blocks()


def available() -> Optional[str]:
  """None when this jax can build (and interpret) the kernel, else why not, in one line."""
  if tuple(int(p) for p in jax.__version__.split(".")[:2]) < (0, 11):
    return f"jax {jax.__version__} < 0.11 has no Mosaic GPU interpret mode"
  try:
    from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top
  except ImportError as e:  # pragma: no cover - depends on the install
    return f"jax.experimental.pallas.mosaic_gpu does not import: {e}"
  if not hasattr(plgpu, "InterpretGPUParams"):
    return f"jax {jax.__version__} has no plgpu.InterpretGPUParams"
  return None


# What `dispatch` may ask of this kernel (by name, or `auto` where `runs_here`): HYLA's
# pair, relu only (`supports`).
COMPUTES = reference.Computes("mosaic", ("rms_head",), ("mlp",))


def check_device(dtype) -> None:
  """BadInput in one line unless compiled execution can work here: a Hopper GPU (compute capability
  9.x: wgmma, TMA) and 16-bit inputs (the backward's float32 tiles need ~350 KiB of shared memory,
  over Hopper's 227 KiB). `dispatch` asks before running the kernel by name; the kernel itself does
  not, so that it can be lowered for an abstract Hopper device (tests)."""
  device = jax.devices()[0]
  capability = str(getattr(device, "compute_capability", ""))
  if device.platform != "gpu" or not capability.startswith("9"):
    raise BadInput(f"implementation='mosaic' needs a Hopper GPU (compute capability 9.x); "
                   f"this is {device.device_kind!r} ({device.platform}); allowed here: "
                   "'blockwise' or 'auto'")
  if jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
    raise BadInput(f"implementation='mosaic' takes bfloat16 or float16 inputs, got "
                   f"{jnp.dtype(dtype)} (float32 tiles do not fit Hopper's shared memory)")


def check_tiles(query_BQHD, value_BKHV, blocks: Blocks = DEFAULT_BLOCKS) -> None:
  """BadInput in one line, before lowering, when the compiled forward's or backward's buffers
  cannot take these shapes (`mosaic_smem.check_tiles`); interpret mode has no such limit."""
  heads, depth, dtype = query_BQHD.shape[2], query_BQHD.shape[3], query_BQHD.dtype
  buffers = forward_smem(blocks, heads, mosaic_smem.depth_padded(depth, dtype), dtype)
  mosaic_smem.check_tiles(buffers, f"mosaic_kernel blocks={blocks}, {heads} heads, {dtype}")
  mosaic_kernel_bwd.check_tiles(heads, depth, mosaic_smem.round_up(
      value_BKHV.shape[-1], mosaic_kernel_bwd.DV_BLOCK_V), dtype, 1 + blocks.ds_two_warpgroups)


def runs_here(query_BQHD, value_BKHV, normalization: str, value_network: str,
              activation: str, *, bias=None, mask=None, dropout_rate: float = 0.0) -> bool:
  """Whether `dispatch`'s `auto` may run this call through the compiled kernels here: they
  compute it (`supports`), this is a Hopper GPU with 16-bit inputs (`check_device`), and
  the tiles fit (`check_tiles`)."""
  if not supports(normalization, value_network, activation, bias=bias, mask=mask,
                  dropout_rate=dropout_rate):
    return False
  try:
    check_device(query_BQHD.dtype)
    check_tiles(query_BQHD, value_BKHV)
  except BadInput:
    return False
  return True


def supports(normalization: str, value_network: str, activation: str, *, bias=None,
             mask=None, dropout_rate: float = 0.0) -> bool:
  """Whether this kernel computes the call: HYLA (rms_head, mlp, relu), no bias or dropout,
  and a mask (if any) that depends on the key only: (B|1, 1|H..., 1, K) broadcastable."""
  if (normalization, value_network, activation) != ("rms_head", "mlp", "relu"):
    return False
  if bias is not None or dropout_rate:
    return False
  return mask is None or mask.ndim <= 4 and (
      (1,) * (4 - mask.ndim) + tuple(mask.shape))[1:3] == (1, 1)


def _v_heads(heads: int, blocks: Blocks) -> int:
  """Heads of the V ring (float32), padded so each slot spans a multiple of 128 bytes."""
  return mosaic_smem.heads_padded(heads, blocks.block_v * blocks.block_k, _F32)


def forward_smem(blocks, heads: int, depth: int, dtype) -> tuple[mosaic_smem.Buffer, ...]:
  """The forward's SMEM buffers, in the kernel's order (depth: D padded to 128-byte rows; V
  in float32: no conversion per value loaded); at bq=64, bk=8, bv=4, H=8, D=64, bf16: ~90
  KiB (Q 64, K ring 16, output 8). `check_tiles` budgets them."""
  bq, bk, bv = blocks.block_q, blocks.block_k, blocks.block_v
  return (
      mosaic_smem.Buffer("Q", (heads, bq, depth), dtype, depth),
      mosaic_smem.Buffer("K ring", (2, heads, bk, depth), dtype, depth),
      mosaic_smem.Buffer("V ring", (2, _v_heads(heads, blocks), bv, bk), _F32),
      mosaic_smem.Buffer("key validity ring", (2, mosaic_smem.key_valid_slot(bk)), _F32),
      mosaic_smem.Buffer("output", (heads, bv, bq), _F32),
  )


def _forward_call(q_BHQD, k_BHKD, v_BJHVK, key_valid_BK, *, scale, is_causal, eps, blocks,
                  interpret):
  """The kernel on padded inputs; V as (B, J, Hv, bv, Kp). Returns (B, J, H, bv, Qp) f32."""
  import jax.experimental.pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top

  batch, heads, q_padded, depth = q_BHQD.shape
  num_slices, num_k_tiles = v_BJHVK.shape[1], k_BHKD.shape[2] // blocks.block_k
  bq, bk, bv = blocks.block_q, blocks.block_k, blocks.block_v
  mask_batched = key_valid_BK.shape[0] > 1
  along_rows = plgpu.Layout.WGMMA.reduce(0)  # a (bk,) vector by key, broadcast down rows

  def kernel(q_ref, k_ref, v_ref, kval_ref, out_ref, q_smem, k_smem, v_smem, kval_smem,
             o_smem, q_bar, k_bar, v_bar, kval_bar):
    b, q0, bm, steps = mosaic_smem.query_program(
        block_q=bq, block_k=bk, num_q_tiles=q_padded // bq, num_k_tiles=num_k_tiles,
        is_causal=is_causal, mask_batched=mask_batched)
    vj = jax.lax.axis_index("v_slice")

    load_tile = functools.partial(
        mosaic_smem.copy_key_tile, refs=(k_ref, kval_ref), rings=(k_smem, v_smem, kval_smem),
        bars=(k_bar, v_bar, kval_bar), v_tile=lambda k0: v_ref.at[b, vj, :, :, pl.ds(k0, bk)],
        b=b, bm=bm)

    plgpu.copy_gmem_to_smem(q_ref.at[b, :, pl.ds(q0, bq)], q_smem, q_bar.at[0])
    for step in range(min(2, num_k_tiles)):  # the two-slot ring's prologue
      pl.when(step < steps)(functools.partial(load_tile, step, step))
    plgpu.barrier_wait(q_bar.at[0])

    def v_row(slot, h, j):  # V's row j of head h in this slot, broadcast down the rows
      return jax.lax.broadcast_in_dim(
          plgpu.load(v_smem.at[slot, h, j], layout=along_rows), (bq, bk), [1])

    def value_network_paired(c_h, y_HP, slot):  # Blocks.paired: rows 2p, 2p+1 of V's slot
      plgpu.barrier_wait(v_bar.at[slot])        # are v_mix and v_swap of columns 2p, 2p+1
      y_HP, swapped_h = list(y_HP), [mosaic_smem.swap_pairs(c, interpret) for c in c_h]
      for p in range(bv // 2):
        z_mix = jnp.maximum(sum(c * v_row(slot, h, 2 * p) for h, c in enumerate(c_h)), 0.0)
        z_swap = jnp.maximum(sum(c * v_row(slot, h, 2 * p + 1)
                                 for h, c in enumerate(swapped_h)), 0.0)
        for h, (c, swapped) in enumerate(zip(c_h, swapped_h)):  # two FMAs, not mul+FMA+add
          y_HP[h * (bv // 2) + p] = mosaic_smem.add_chunks(mosaic_smem.add_chunks(
              y_HP[h * (bv // 2) + p], c * z_mix), swapped * z_swap)
      return tuple(y_HP)

    def value_network(c_h, y_HJ, slot):  # the tile's pairs, y += c_h relu(sum_h c_h v_h)
      if blocks.paired:
        return value_network_paired(c_h, y_HJ, slot)
      plgpu.barrier_wait(v_bar.at[slot])
      y_HJ = list(y_HJ)
      for j in range(bv):
        u = sum(c * v_row(slot, h, j) for h, c in enumerate(c_h))
        z = jnp.maximum(u, 0.0)
        for h, c in enumerate(c_h):
          y_HJ[h * bv + j] = mosaic_smem.add_chunks(y_HJ[h * bv + j], c * z)
      return tuple(y_HJ)

    code = functools.partial(mosaic_smem.code_tile, q_smem, k_smem, kval_smem, k_bar,
                             kval_bar, q0=q0, is_causal=is_causal, scale=scale, eps=eps)

    def release(step, slot):
      # Every thread's reads of this slot (V, key validity) done before TMA overwrites it:
      # without this barrier interpret mode's race detector sees the prefetch race them.
      plgpu.commit_smem()

      @pl.when(step + 2 < steps)
      def _prefetch():  # this slot is free again: its wgmmas and loads have completed
        load_tile(step + 2, slot)

    def key_tile(step, y_HJ):
      slot = jax.lax.rem(step, 2)
      c_h, _ = code(slot=slot, k0=step * bk)
      y_HJ = value_network(c_h, y_HJ, slot)
      release(step, slot)
      return y_HJ

    y_HJ = jax.lax.fori_loop(0, steps, key_tile, mosaic_smem.chunk_accumulators(
        bq, heads * bv // (2 if blocks.paired else 1)))
    mosaic_smem.store_row_sums(y_HJ, o_smem, out_ref.at[b, vj, :, :, pl.ds(q0, bq)],
                               paired=blocks.paired)

  def hyla_forward(*refs):  # the kernel's name in profiles and ptxas reports
    buffers = mosaic_smem.allocate(plgpu, forward_smem(blocks, heads, depth, q_BHQD.dtype))
    barriers = (plgpu.Barrier(num_barriers=1), *(plgpu.Barrier(num_barriers=2) for _ in range(3)))
    pl.run_scoped(lambda *scoped: kernel(*refs, *scoped), *buffers, *barriers)

  return plgpu.kernel(
      hyla_forward,
      out_type=jax.ShapeDtypeStruct((batch, num_slices, heads, bv, q_padded), _F32),
      grid=(batch, q_padded // bq, num_slices),
      grid_names=("batch", "q_tile", "v_slice"),
      interpret=interpret,
  )(q_BHQD, k_BHKD, v_BJHVK, key_valid_BK)


def _forward(query_BQHD, key_BKHD, value_BKHV, mask, is_causal, eps, blocks, interpret):
  """Pads and lays out the inputs in XLA, runs the kernel, returns (B, Q, H, V) in the
  input dtype."""
  batch, q_len, heads, depth = query_BQHD.shape
  k_len, v_dim, dtype = key_BKHD.shape[1], value_BKHV.shape[-1], query_BQHD.dtype
  bq, bk, bv = blocks.block_q, blocks.block_k, blocks.block_v
  round_up = mosaic_smem.round_up
  q_padded, k_padded, v_padded = round_up(q_len, bq), round_up(k_len, bk), round_up(v_dim, bv)
  d_padded = mosaic_smem.depth_padded(depth, dtype)
  pad = lambda x, length, heads_to, width: jnp.pad(x, (
      (0, 0), (0, length - x.shape[1]), (0, heads_to - heads), (0, width - x.shape[3])))
  q_BHQD = jnp.transpose(pad(query_BQHD, q_padded, heads, d_padded), (0, 2, 1, 3))
  k_BHKD = jnp.transpose(pad(key_BKHD, k_padded, heads, d_padded), (0, 2, 1, 3))
  hv = _v_heads(heads, blocks)
  v_BJHVK = jnp.transpose(pad(value_BKHV.astype(_F32), k_padded, hv, v_padded).reshape(
      batch, k_padded, hv, v_padded // bv, bv), (0, 3, 2, 4, 1))
  if blocks.paired:
    v_BJHVK = _paired_values(v_BJHVK)
  out_BJHVQ = _forward_call(q_BHQD, k_BHKD, v_BJHVK, mosaic_smem.key_valid(mask, k_len, k_padded),
                    scale=1.0 / math.sqrt(depth), is_causal=is_causal, eps=eps, blocks=blocks,
                    interpret=interpret)
  out_BQHV = jnp.transpose(out_BJHVQ, (0, 4, 2, 1, 3)).reshape(batch, q_padded, heads, v_padded)
  return out_BQHV[:, :q_len, :, :v_dim].astype(dtype)


def _paired_values(v_BJHVK):
  """Blocks.paired's V: rows 2p, 2p+1 of each slice become v_mix and v_swap of its columns
  j = 2p, 2p+1 (`Blocks`): v_mix[k] = v[j + k % 2, k], v_swap[k] = v[j + k % 2, k ^ 1]."""
  *lead, bv, k_padded = v_BJHVK.shape
  even = jnp.arange(k_padded) % 2 == 0
  pairs = v_BJHVK.reshape(*lead, bv // 2, 2, k_padded)
  key_swapped = pairs.reshape(*lead, bv // 2, 2, k_padded // 2, 2)[..., ::-1].reshape(pairs.shape)
  mix = jnp.where(even, pairs[..., 0, :], pairs[..., 1, :])
  swap = jnp.where(even, key_swapped[..., 0, :], key_swapped[..., 1, :])
  return jnp.stack([mix, swap], axis=-2).reshape(v_BJHVK.shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8))
def _attention(query, key, value, mask, is_causal, eps, blocks, interpret, dq):
  del dq
  return _forward(query, key, value, mask, is_causal, eps, blocks, interpret)


def _attention_fwd(query, key, value, mask, is_causal, eps, blocks, interpret, dq):
  del dq
  out = _forward(query, key, value, mask, is_causal, eps, blocks, interpret)
  return out, (query, key, value, mask)  # residuals: the inputs only, nothing quadratic


def _attention_bwd(is_causal, eps, blocks, interpret, dq, residuals, d_out):
  """The backward kernels (mosaic_kernel_bwd.py), recomputed from the inputs; of `blocks`
  they take the dS kernel's warpgroups only (their tiles are mosaic_kernel_bwd's constants)."""
  query, key, value, mask = residuals
  d_query, d_key, d_value = mosaic_kernel_bwd.backward(
      query, key, value, mask, d_out, is_causal=is_causal, eps=eps, interpret=interpret, dq=dq,
      ds_warpgroups=1 + blocks.ds_two_warpgroups)
  return d_query, d_key, d_value, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(query_BQHD: jax.Array, key_BKHD: jax.Array, value_BKHV: jax.Array, *,
              bias: Optional[jax.Array] = None, mask: Optional[jax.Array] = None,
              is_causal: bool = False, normalization: str = "rms_head", value_network: str = "mlp",
              activation: str = "relu", eps: float = reference.RMS_HEAD_EPS,
              blocks: Blocks = DEFAULT_BLOCKS, interpret=None, dq: Optional[str] = None,
              dropout_rate: float = 0.0, dropout_seed: Optional[jax.Array] = None) -> jax.Array:
  """`reference.attention`'s contract for what `supports` accepts; refuses the rest.

  `mask`: bool, depending on the key only (e.g. (B, 1, 1, K) padding). `interpret`: None
  runs compiled (a Hopper GPU), or a `plgpu.InterpretGPUParams` (CPU, tests). `blocks`: the
  forward's tiles. Gradients: a custom VJP through the backward kernels
  (mosaic_kernel_bwd.py); `dq` says how their dQ = dS K and dK = dS^T Q run, a name in
  mosaic_kernel_bwd.DQ_PATHS (None: its DEFAULT_DQ, "kernel"). Masked pairs contribute 0 x
  value: NaN and Inf are selected away before the kernels (`reference.isolate_nonfinite`).
  """
  del dropout_seed
  reference.check_operands(query_BQHD, key_BKHD, value_BKHV, bias=bias, mask=mask, eps=eps)
  if not supports(normalization, value_network, activation, bias=bias, mask=mask,
                  dropout_rate=dropout_rate):
    raise BadInput(
        f"mosaic_kernel computes HYLA only (rms_head, mlp, relu; no bias, no dropout; a "
        f"key-only mask), got normalization={normalization!r}, value_network="
        f"{value_network!r}, activation={activation!r}, bias="
        f"{None if bias is None else bias.shape}, mask={None if mask is None else mask.shape},"
        f" dropout_rate={dropout_rate}.")
  dq = mosaic_kernel_bwd.DEFAULT_DQ if dq is None else dq
  if dq not in mosaic_kernel_bwd.DQ_PATHS:
    raise BadInput(f"mosaic_kernel dq={dq!r}; allowed: {', '.join(mosaic_kernel_bwd.DQ_PATHS)}.")
  if (blocks.block_q % 64 or blocks.block_k % 8 or blocks.block_v < 1 or
      blocks.paired and blocks.block_v % 2):
    raise BadInput(f"mosaic_kernel blocks={blocks}: block_q must be a multiple of 64 and "
                   "block_k of 8 (wgmma M and N), block_v at least 1 (even when paired).")
  if not interpret:  # compiled (None or False); interpret mode has no such limits
    check_tiles(query_BQHD, value_BKHV, blocks)
  key_BKHD, value_BKHV, poisoned_BQ = reference.isolate_nonfinite(
      key_BKHD, value_BKHV, mask, query_BQHD.shape[1], is_causal)
  return reference.reveal_nonfinite(_attention(
      query_BQHD, key_BKHD, value_BKHV, mask, is_causal, eps, blocks, interpret, dq), poisoned_BQ)
