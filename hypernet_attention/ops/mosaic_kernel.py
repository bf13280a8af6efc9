"""HYLA forward as one fused Pallas Mosaic GPU kernel for Hopper (issue 42, steps 1-3).

Status (an H200, 2026-11-27, experiments/results/gpu_windows/2026-11-27_h200_kernel): runs
correctly, forward and backward (compute-sanitizer memcheck: 0 errors; bf16 parity against
the float64 reference passes at T=128, 256, 1000, at half the bound), once the key-validity
ring's slots were aligned for TMA (`mosaic_smem.key_valid_slot`). Not fast: at T=4096, B=4, H=8,
D=V=64, causal, the forward equals XLA's blockwise (8.66 vs 8.63 ms) and fwd+bwd is 66.6 ms
against blockwise's 27.5 and cuDNN softmax's 0.76, so `dispatch`'s `auto` does not take it.
A second forward, `mosaic_forward_registers.py` (`attention(forward="registers")`), keeps
the code in the registers the score wgmmas leave it in and runs the value network on the
CUDA cores, without this one's permutation matmuls; it is correct in interpret mode and
meets Hopper's rules lowered for an H100, and waits for a window to time it.

What it computes: `reference.attention` with normalization='rms_head', value_network='mlp',
activation='relu' (HYLA, the paper's Eqs. 6-7), optionally causal and with a key-padding
mask; nothing else (`supports` says so and `attention` refuses the rest).

Program layout. One program per (batch b, query tile of bq, value slice of bv columns): all
heads of a query tile live in one program because RMSHead normalizes each (q, k) pair across
heads. The value slice is independent (u, z = relu(u) and the read-out are column-wise in V),
so splitting V trades recomputed scores for registers: the H read-out accumulators (bq, bv)
f32 must fit one warpgroup. Each program loops over key tiles of bk keys (stopping at the
causal diagonal) through a two-slot TMA ring (the tile after next loads while this one
computes), and per key tile:
  scores   s_h = q_h k_h^T                      H wgmmas (bq x D) @ (D x bk)
  code     c_h = s_h / rms_h(s)  (masked -> 0)  registers; all heads at hand, no exchange
  S_cat    c_h stored at columns [h*bk, (h+1)*bk) of a (bq, H*bk) SMEM tile
  per key k of the tile:
    C[k]   = S_cat @ P_k                         wgmma (bq x H*bk) @ (H*bk x 16), exact
    u_k    = C[k] @ V[k]                         wgmma (bq x 16) @ (16 x bv), V[k]: (Hp=16, bv)
    E_kh   = C[k] @ B_h                          wgmma, B_h = e_h 1^T: column h of C[k]
                                                 broadcast over bv columns, exact
    y_h   += E_kh * relu(u_k)                    vector units, matching layouts
The per-key code C[k][q][h16] (heads padded to 16, the wgmma K minimum for 16-bit types) is
the A operand of u_k, as the issue's sketch has it; V arrives pre-padded to 16 heads (XLA).

What Mosaic could and could not express (jax 0.12.0.1, Warpgroup lowering semantics, checked
by lowering for CUDA on a machine without a GPU; `tests/ops/test_mosaic_kernel.py`):
  - could not: storing per-head tiles head-minor, `c_smem.at[:, :, h][...] = c_h.T`, nor
    reading one head's column `c_smem.at[k, :, h]`: an integer index on the minor dimension of
    a tiled/swizzled SMEM ref fails ("Unsupported index type: DynamicJaxprTracer"), and a
    register transpose `c_h.T` is an unimplemented primitive ("Unimplemented primitive in
    Pallas Mosaic GPU lowering: transpose"). Neither is a wgmma-descriptor layout anyway.
  - could: tile-aligned column blocks of a tiled SMEM ref, per-key slices on a leading
    dimension, wgmmas with K = 16 and N = 16. Hence the next best: the head-minor C[k] is made
    by the tensor cores, S_cat @ P_k with a constant 0/1 permutation P (exact in any dtype),
    and the per-head broadcast the read-out needs by C[k] @ B_h (exact as well). Cost: the
    permutation is 2*bq*H*bk*16 FLOP per key and the broadcasts H*2*bq*16*bv per key on
    tensor cores, about 9x the value network's own multiply-adds; the cheaper read-out (warp
    shuffles of c_h's columns on the CUDA cores, the issue's first choice) has no Pallas-level
    expression found here. Measure before optimizing (the GPU window).
  - could not: a TMA copy of more than 5 strided dimensions, counted after the swizzle's
    tiling and with unit dimensions dropped, so a tile sliced along a middle axis of a
    (B, ...) array fails at B > 1 only; this failed on the H100 window of 2026-11-26, and
    the lowering test now uses a batch of two. Hence the value slice as a leading axis of
    V (B, Vp / bv, Kp, 16, bv) and of the output, and the backward's per-head copies.

Precision: scores, code, u, the read-out accumulate in float32; the operands of every wgmma
are the input dtype (bf16/f16 on hardware; float32 inputs become TF32 on hardware, exact
float32 in interpret mode). The code is rounded to the input dtype once (S_cat); P and B_h are
0/1, so the permutation and broadcast add no rounding.

Shared memory at bq=64, bk=16, bv=16, H=8, D=64, bf16 (the defaults): Q 64 KiB, K ring
32 KiB, V ring 16 KiB, S_cat 16 KiB, P 64 KiB, B 4 KiB, C 2 KiB, output 16 KiB: 219,392 bytes
of buffers (`forward_smem`), ~214 KiB of Hopper's 227. Float32 inputs need twice that: run
them in interpret mode only (tests). That makes the defaults the only tiles at the paper's
H=8, D=V=64 in bf16: bv=32 needs 256,256 bytes, bq=128 319,744, bk=32 481,536 (P grows as
bk^2), and bk=8 or bv=8 give 16-byte rows, which no Mosaic swizzle takes. Compiled, such
tiles are refused in one line before lowering (`check_tiles`; its sum is within 1 KiB below
Mosaic's own count, tested by lowering). What would buy bv=32 (half the recomputed scores
and permutations): P as 8 row-shifted copies of one (H*bk + bk + 8, 16) matrix, sliced at
8-row offsets (38 KiB instead of 64; not built, it needs a GPU to pay off).

Backward: `attention` is a `jax.custom_vjp` whose residuals are the inputs only; its backward
is `mosaic_kernel_bwd.py`: key-stationary programs that recompute S, C, u, z, accumulate dK and
dV on chip and write dS; dQ = dS K is a second, query-stationary kernel (or, `dq="xla"`, one
XLA matmul) (issue 42 step 2; that module's docstring gives what runs where, its FLOPs, its
HBM traffic and its SMEM).

Shape letters: B batch, H heads (Hp = 16 padded), Q / K positions (Qp / Kp padded), D
query/key width (Dp padded), V value width (Vp padded to a multiple of bv).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Optional

import jax
import jax.numpy as jnp

from hypernet_attention.errors import BadInput
from hypernet_attention.ops import mosaic_forward_registers
from hypernet_attention.ops import mosaic_kernel_bwd
from hypernet_attention.ops import mosaic_smem
from hypernet_attention.ops import reference

_F32 = jnp.float32


@dataclasses.dataclass(frozen=True)
class Blocks:
  """Tile sizes: bq queries (wgmma M: a multiple of 64), bk keys, bv value columns."""
  block_q: int = 64
  block_k: int = 16
  block_v: int = 16


DEFAULT_BLOCKS = Blocks()
# The forwards `attention(forward=...)` runs: "wgmma", this module's (the value network on
# the tensor cores; correct on an H200, 2026-11-27), and "registers"
# (`mosaic_forward_registers.py`: on the CUDA cores; correct in interpret mode and lowered
# for an abstract H100, not yet run on a GPU). The default moves when a window measures it.
FORWARDS = ("wgmma", "registers")
DEFAULT_FORWARD = "wgmma"
# Registers bound it (ptxas 12.9 for an H100, B=4 T=1024 H=8 D=V=64 bf16, measure/ptxas.py):
# 64x8x4 219 registers, no spill; 64x16x2 199; 64x16x4 255 and 20 B spilled; 64x8x8 and
# 128x16x2 spill 0.5-0.7 KB per thread.
REGISTERS_BLOCKS = Blocks(64, 8, 4)


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


# What `dispatch` may ask of this kernel by name (`implementation="mosaic"`; `auto` does
# not take it until a GPU window has measured it): HYLA's pair, relu only (`supports`).
COMPUTES = reference.Computes("mosaic", ("rms_head",), ("mlp",))


def check_device(dtype) -> None:
  """BadInput in one line unless compiled execution can work here: a Hopper GPU (compute
  capability 9.x: wgmma, TMA) and 16-bit inputs (float32 tiles need ~430 KiB of shared
  memory, over Hopper's 227 KiB). `dispatch` asks before running the kernel by name; the
  kernel itself does not, so that it can be lowered for an abstract Hopper device (tests)."""
  device = jax.devices()[0]
  capability = str(getattr(device, "compute_capability", ""))
  if device.platform != "gpu" or not capability.startswith("9"):
    raise BadInput(f"implementation='mosaic' needs a Hopper GPU (compute capability 9.x); "
                   f"this is {device.device_kind!r} ({device.platform}); allowed here: "
                   "'blockwise' or 'auto'")
  if jnp.dtype(dtype) not in (jnp.bfloat16, jnp.float16):
    raise BadInput(f"implementation='mosaic' takes bfloat16 or float16 inputs, got "
                   f"{jnp.dtype(dtype)} (float32 tiles do not fit Hopper's shared memory)")


def supports(normalization: str, value_network: str, activation: str, *, bias=None,
             mask=None, dropout_rate: float = 0.0) -> bool:
  """Whether this kernel computes the call: HYLA (rms_head, mlp, relu), no bias or dropout,
  and a mask (if any) that depends on the key only: (B|1, 1|H..., 1, K) broadcastable."""
  if (normalization, value_network, activation) != ("rms_head", "mlp", "relu"):
    return False
  if bias is not None or dropout_rate:
    return False
  return mask is None or _key_mask_shape_ok(mask)


def _key_mask_shape_ok(mask) -> bool:
  shape = (1,) * (4 - mask.ndim) + tuple(mask.shape)
  return len(shape) == 4 and shape[1] == 1 and shape[2] == 1


def forward_smem(blocks: Blocks, heads: int, depth: int,
                 dtype) -> tuple[mosaic_smem.Buffer, ...]:
  """The forward kernel's SMEM buffers, in the order the kernel takes them (depth: D padded
  to a 128-byte row). The kernel allocates exactly these; `check_tiles` budgets them."""
  bq, bk, bv, hp = blocks.block_q, blocks.block_k, blocks.block_v, mosaic_smem.HEADS_PADDED
  return (
      mosaic_smem.Buffer("Q", (heads, bq, depth), dtype, depth),
      mosaic_smem.Buffer("K ring", (2, heads, bk, depth), dtype, depth),
      mosaic_smem.Buffer("V ring", (2, bk, hp, bv), dtype, bv),
      mosaic_smem.Buffer("key validity ring", (2, mosaic_smem.key_valid_slot(bk)), _F32),
      mosaic_smem.Buffer("S_cat", (bq, heads * bk), dtype, bk),
      mosaic_smem.Buffer("C[k]", (bq, hp), dtype, hp),
      mosaic_smem.Buffer("P", (bk, heads * bk, hp), dtype, hp),
      mosaic_smem.Buffer("B", (heads, hp, bv), dtype, bv),
      mosaic_smem.Buffer("output", (heads, bq, bv), dtype),
  )


def _forward_call(q_BHQD, k_BHKD, v_BJKHV, key_valid_BK, *, scale, is_causal, eps, blocks,
                  interpret):
  """The pallas kernel on padded inputs, V as (B, Vp / bv, Kp, 16, bv): (B, Vp / bv, H, Qp,
  bv) in the input dtype. The value slice is a leading axis of V and of the output so that
  each tile is a TMA copy of at most 5 strided dimensions (Mosaic's limit): a tile sliced
  from (B, Kp, 16, Vp) or (B, H, Qp, Vp) is 6 once tiled whenever B > 1 (b, the tile's rows,
  their 8-row tiles, the slice's 16-column tile, 8, 16), which the H100 window of 2026-11-26
  hit ("Async copies only support striding up to 5 dimensions"; B = 1 drops the unit batch
  axis, so B = 1 lowering did not see it)."""
  import jax.experimental.pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top

  batch, heads, q_padded, depth = q_BHQD.shape
  k_padded = k_BHKD.shape[2]
  v_padded = v_BJKHV.shape[1] * v_BJKHV.shape[-1]
  dtype = q_BHQD.dtype
  bq, bk, bv, hp = blocks.block_q, blocks.block_k, blocks.block_v, mosaic_smem.HEADS_PADDED
  num_k_tiles = k_padded // bk
  mask_batched = key_valid_BK.shape[0] > 1
  perm_KJH, bcast_HHV = mosaic_smem.selection_constants(heads, bk, bv, dtype)

  def kernel(q_ref, k_ref, v_ref, kval_ref, perm_ref, bcast_ref, out_ref, scoped):
    (q_smem, k_smem, v_smem, kval_smem, scat_smem, c_smem, perm_smem, bcast_smem,
     o_smem), (q_bar, const_bar, k_bar, v_bar, kval_bar) = scoped
    b, q0, vj, bm, steps = mosaic_smem.forward_program(
        block_q=bq, block_k=bk, num_k_tiles=num_k_tiles, is_causal=is_causal,
        mask_batched=mask_batched)

    load_tile = functools.partial(
        mosaic_smem.copy_key_tile, refs=(k_ref, kval_ref), rings=(k_smem, v_smem, kval_smem),
        bars=(k_bar, v_bar, kval_bar), v_tile=lambda k0: v_ref.at[b, vj, pl.ds(k0, bk)], b=b, bm=bm)

    plgpu.copy_gmem_to_smem(q_ref.at[b, :, pl.ds(q0, bq)], q_smem, q_bar.at[0])
    plgpu.copy_gmem_to_smem(perm_ref, perm_smem, const_bar.at[0])
    plgpu.copy_gmem_to_smem(bcast_ref, bcast_smem, const_bar.at[1])
    for step in range(2):  # the two-slot ring's prologue
      pl.when(step < steps)(functools.partial(load_tile, step, step))
    plgpu.barrier_wait(q_bar.at[0])
    plgpu.barrier_wait(const_bar.at[0])
    plgpu.barrier_wait(const_bar.at[1])

    def key_tile(step, ys):
      slot = jax.lax.rem(step, 2)
      c_h = mosaic_smem.code_tile(q_smem, k_smem, kval_smem, k_bar, kval_bar, slot=slot,
                                  q0=q0, k0=step * bk, is_causal=is_causal, scale=scale,
                                  eps=eps)
      for h, c in enumerate(c_h):
        scat_smem[:, pl.ds(h * bk, bk)] = c.astype(dtype)
      plgpu.commit_smem()
      plgpu.barrier_wait(v_bar.at[slot])

      def one_key(k, ys):
        def code(acc):
          plgpu.wgmma(acc, scat_smem, perm_smem.at[k])
          return acc[...]

        c_smem[...] = pl.run_scoped(code, plgpu.ACC((bq, hp), _F32)).astype(dtype)
        plgpu.commit_smem()

        def value_net(u_acc, *e_accs):
          plgpu.wgmma(u_acc, c_smem, v_smem.at[slot, k])
          for h, e_acc in enumerate(e_accs):
            plgpu.wgmma(e_acc, c_smem, bcast_smem.at[h])
          return u_acc[...], [e[...] for e in e_accs]

        u, e_h = pl.run_scoped(value_net, *[plgpu.ACC((bq, bv), _F32)
                                            for _ in range(heads + 1)])
        z = jnp.maximum(u, 0.0)
        return tuple(y + e * z for y, e in zip(ys, e_h))

      ys = jax.lax.fori_loop(0, bk, one_key, ys)

      @pl.when(step + 2 < steps)
      def _prefetch():  # this slot is free again: every wgmma reading it has completed
        load_tile(step + 2, slot)

      return ys

    ys = tuple(plgpu.layout_cast(jnp.zeros((bq, bv), _F32), plgpu.Layout.WGMMA)
               for _ in range(heads))
    ys = jax.lax.fori_loop(0, steps, key_tile, ys)
    for h, y in enumerate(ys):
      o_smem[h] = y.astype(dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, out_ref.at[b, vj, :, pl.ds(q0, bq)])
    plgpu.wait_smem_to_gmem(0)

  def entry(q_ref, k_ref, v_ref, kval_ref, perm_ref, bcast_ref, out_ref):
    smem = mosaic_smem.allocate(plgpu, forward_smem(blocks, heads, depth, dtype))
    barriers = (plgpu.Barrier(num_barriers=1), plgpu.Barrier(num_barriers=2),
                plgpu.Barrier(num_barriers=2), plgpu.Barrier(num_barriers=2),
                plgpu.Barrier(num_barriers=2))
    pl.run_scoped(
        lambda *scoped: kernel(q_ref, k_ref, v_ref, kval_ref, perm_ref, bcast_ref, out_ref,
                               (scoped[:9], scoped[9:])),
        *smem, *barriers)

  return plgpu.kernel(
      entry,
      out_type=jax.ShapeDtypeStruct((batch, v_padded // bv, heads, q_padded, bv), dtype),
      grid=(batch, q_padded // bq, v_padded // bv),
      grid_names=("batch", "q_tile", "v_slice"),
      interpret=interpret,
  )(q_BHQD, k_BHKD, v_BJKHV, key_valid_BK, perm_KJH, bcast_HHV)


def _forward(query_BQHD, key_BKHD, value_BKHV, mask, is_causal, eps, blocks, interpret):
  """Pads and lays out the inputs in XLA, runs the kernel, returns (B, Q, H, V)."""
  batch, q_len, heads, depth = query_BQHD.shape
  k_len, v_dim = key_BKHD.shape[1], value_BKHV.shape[-1]
  bq, bk, bv = blocks.block_q, blocks.block_k, blocks.block_v
  round_up, hp = mosaic_smem.round_up, mosaic_smem.HEADS_PADDED
  q_padded, k_padded, v_padded = round_up(q_len, bq), round_up(k_len, bk), round_up(v_dim, bv)
  d_padded = mosaic_smem.depth_padded(depth, query_BQHD.dtype)
  pad = lambda x, length, width: jnp.pad(
      x, ((0, 0), (0, length - x.shape[1]), (0, 0), (0, width - x.shape[3])))
  q_BHQD = jnp.transpose(pad(query_BQHD, q_padded, d_padded), (0, 2, 1, 3))
  k_BHKD = jnp.transpose(pad(key_BKHD, k_padded, d_padded), (0, 2, 1, 3))
  v_BKHV = jnp.pad(value_BKHV, ((0, 0), (0, k_padded - k_len), (0, hp - heads),
                                (0, v_padded - v_dim)))
  v_BJKHV = jnp.transpose(v_BKHV.reshape(batch, k_padded, hp, v_padded // bv, bv),
                          (0, 3, 1, 2, 4))
  out_BJHQV = _forward_call(
      q_BHQD, k_BHKD, v_BJKHV, mosaic_smem.key_valid(mask, k_len, k_padded),
      scale=1.0 / math.sqrt(depth), is_causal=is_causal, eps=eps, blocks=blocks,
      interpret=interpret)
  out_BQHV = jnp.transpose(out_BJHQV, (0, 3, 2, 1, 4)).reshape(batch, q_padded, heads, v_padded)
  return out_BQHV[:, :q_len, :, :v_dim]


def _any_forward(query, key, value, mask, is_causal, eps, blocks, interpret, forward):
  run = mosaic_forward_registers.forward if forward == "registers" else _forward
  return run(query, key, value, mask, is_causal, eps, blocks, interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7, 8, 9))
def _attention(query, key, value, mask, is_causal, eps, blocks, interpret, dq, forward):
  del dq
  return _any_forward(query, key, value, mask, is_causal, eps, blocks, interpret, forward)


def _attention_fwd(query, key, value, mask, is_causal, eps, blocks, interpret, dq, forward):
  del dq
  out = _any_forward(query, key, value, mask, is_causal, eps, blocks, interpret, forward)
  return out, (query, key, value, mask)  # residuals: the inputs only, nothing quadratic


def _attention_bwd(is_causal, eps, blocks, interpret, dq, forward, residuals, d_out):
  """The key-stationary backward kernel (mosaic_kernel_bwd.py), recomputed from the inputs."""
  del blocks, forward  # the backward has its own tiles (mosaic_kernel_bwd.BLOCK_Q, BLOCK_K)
  query, key, value, mask = residuals
  d_query, d_key, d_value = mosaic_kernel_bwd.backward(
      query, key, value, mask, d_out, is_causal=is_causal, eps=eps, interpret=interpret, dq=dq)
  return d_query, d_key, d_value, None


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(
    query_BQHD: jax.Array,
    key_BKHD: jax.Array,
    value_BKHV: jax.Array,
    *,
    bias: Optional[jax.Array] = None,
    mask: Optional[jax.Array] = None,
    is_causal: bool = False,
    normalization: str = "rms_head",
    value_network: str = "mlp",
    activation: str = "relu",
    eps: float = reference.RMS_HEAD_EPS,
    blocks: Optional[Blocks] = None,
    interpret=None,
    dq: Optional[str] = None,
    forward: str = DEFAULT_FORWARD,
    dropout_rate: float = 0.0,
    dropout_seed: Optional[jax.Array] = None,
) -> jax.Array:
  """`reference.attention`'s contract for what `supports` accepts; refuses the rest.

  `mask`: bool, depending on the key only (e.g. (B, 1, 1, K) padding). `interpret`: None
  runs compiled (a Hopper GPU), or a `plgpu.InterpretGPUParams` (CPU, tests). Gradients:
  a custom VJP through the backward kernel (mosaic_kernel_bwd.py); `dq` says how its
  dQ = dS K runs, a name in mosaic_kernel_bwd.DQ_PATHS (None: its DEFAULT_DQ, "kernel").
  `forward`: which forward kernel, a name in FORWARDS; `blocks` its tiles (None: the
  forward's defaults, DEFAULT_BLOCKS or REGISTERS_BLOCKS).
  """
  del dropout_seed
  if not supports(normalization, value_network, activation, bias=bias, mask=mask,
                  dropout_rate=dropout_rate):
    raise BadInput(
        f"mosaic_kernel computes HYLA only (rms_head, mlp, relu; no bias, no dropout; a "
        f"key-only mask), got normalization={normalization!r}, value_network="
        f"{value_network!r}, activation={activation!r}, bias="
        f"{None if bias is None else bias.shape}, mask={None if mask is None else mask.shape},"
        f" dropout_rate={dropout_rate}.")
  heads = query_BQHD.shape[2]
  if heads > mosaic_smem.HEADS_PADDED:
    raise BadInput(f"mosaic_kernel takes at most {mosaic_smem.HEADS_PADDED} heads, got {heads}.")
  dq = mosaic_kernel_bwd.DEFAULT_DQ if dq is None else dq
  if dq not in mosaic_kernel_bwd.DQ_PATHS:
    raise BadInput(f"mosaic_kernel dq={dq!r}; allowed: {', '.join(mosaic_kernel_bwd.DQ_PATHS)}.")
  if forward not in FORWARDS:
    raise BadInput(f"mosaic_kernel forward={forward!r}; allowed: {', '.join(FORWARDS)}.")
  if blocks is None:
    blocks = REGISTERS_BLOCKS if forward == "registers" else DEFAULT_BLOCKS
  v_unit = 1 if forward == "registers" else 8  # there bv is a loop, not a wgmma N
  if (blocks.block_q % 64 or blocks.block_k % 8 or blocks.block_v % v_unit
      or blocks.block_v < 1):
    raise BadInput(f"mosaic_kernel forward={forward} blocks={blocks}: block_q must be a "
                   f"multiple of 64, block_k of 8 (wgmma M and N) and block_v of {v_unit}.")
  if not interpret:  # compiled (None or False); interpret mode has no such limits
    d_padded = mosaic_smem.depth_padded(query_BQHD.shape[3], query_BQHD.dtype)
    buffers = (mosaic_forward_registers.smem if forward == "registers" else forward_smem)(
        blocks, heads, d_padded, query_BQHD.dtype)
    mosaic_smem.check_tiles(buffers, f"mosaic_kernel forward={forward}, blocks={blocks}, "
                                     f"{heads} heads, {query_BQHD.dtype}")
  return _attention(query_BQHD, key_BKHD, value_BKHV, mask, is_causal, eps, blocks,
                    interpret, dq, forward)
