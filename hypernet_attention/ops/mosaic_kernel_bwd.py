"""HYLA's backward in Pallas Mosaic GPU, its per-pair tensors in registers (issue 52).

The forward is `mosaic_kernel.py`; read its docstring first (the layout: scores from the tensor
cores, the value network on the CUDA cores in the WGMMA layout). For every pair (q, k), head h and
value column j, with s = scores * scale, r = rsqrt(mean_h s^2 + eps), c = s r valid (the code; valid
0 for a masked pair), u_j = sum_h c_h v_hj, z = relu(u) and dy the output's cotangent:

  dz_j    = sum_h c_h dy_hj                      (the read-out's gradient into z)
  du_j    = dz_j [u_j > 0]
  dc_h    = sum_j dy_hj z_j + du_j v_hj          (read-out and value network into c)
  ds_h    = scale r (dc_h - c_h <c, dc> / H)     (Eq. 7's Jacobian, per pair)
  dV_hj   = sum_q c_h du_j                       (per key)
  dQ_h    = dS_h K_h,  dK_h = dS_h^T Q_h         (matmuls over the written dS)

A masked or padded pair has c = 0 (`mosaic_smem.rms_code`), so u = z = 0 and dc = 0: its dS
and its share of dV are exactly 0 with no mask in the backward beyond the recomputed code's.

Why three kinds of program. dc needs all V columns of a pair and dV sums over all queries of
a key, so no one tile order serves both without per-key accumulators across queries, which spilled
(the previous backward's; experiments/results/kernels.md, also on sharing u between dS and dV):
  dS   query-stationary, a program per (batch, 64-query tile, run of at most DS_SPLIT_KEYS
       keys; causal, the last query tiles first): per key tile of bk keys it recomputes c, loops
       over the V columns accumulating dc_h (bq, bk) per head, and writes dS_h (bf16) to HBM:
       (4H + 1) V multiply-adds per pair, c and dc in registers; on one warpgroup, or on two
       that share Q and dY and take alternate key tiles (`ds_smem`).
  dV   key-stationary, the forward's program with rows and columns swapped: a program per
       (batch, 64-key tile, slice of bv columns) loops over query tiles of 8; the scores
       k_h q_h^T put keys on the rows, so each key's v_hj is a per-row vector and dV_hj a
       sum along the row, within each thread over 8-column chunks (as the forward sums y):
       (3H + 1) bv multiply-adds per pair and slice.
  dQ, dK  query- resp. key-stationary wgmma matmuls over dS (64 x 64 tiles, a two-slot TMA
       ring, one head per program: a (64, D) float32 accumulator), or XLA's (`dq="xla"`).
Causal, every program stops at (or starts from) the diagonal: the dS kernel leaves the tiles
above it unwritten, which the matmul kernels never read (XLA's path reads them: the dS
kernel then writes zeros there).

Cost: (7H + 2) V CUDA-core multiply-adds per pair; dS in HBM is 2H bytes per pair, written once
and read twice. Times: `ops/kernel_cost.py`; registers, occupancy, instructions per pair:
`tune_kernels.py --ptxas`.

Shape letters as in `mosaic_kernel.py`; Hv heads padded so that a ring slot spans a multiple
of 128 bytes (`mosaic_smem.heads_padded`), J value slices of bv columns.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from hypernet_attention.ops import mosaic_smem

_F32 = jnp.float32
BLOCK = 64  # queries per dS program, keys per dV program, both sides of the matmul tiles
# Keys per dS step: c and dc take H * bk / 2 registers each (bq = 64). 16 would halve the
# dY loads per pair but does not lower: its (H, 64, 16) dS store becomes a TMA copy of 6
# strided dimensions (Mosaic allows 5); it would need one store per head.
DS_BLOCK_K = 8
DV_BLOCK_Q, DV_BLOCK_V = 8, 4  # queries per dV step, value columns per dV program
# Keys per dS program at most: a query tile's keys split over several programs (dS of a pair needs
# no other key, so nothing is reduced), so that no program runs a whole causal row alone while the
# GPU idles: at T=1024, B=4 the 64 query tiles filled 64 of 132 multiprocessors; at T=4096 the
# last tiles' 4096-key loops set the kernel's time (modeled: kernels.md).
DS_SPLIT_KEYS = 512


def ds_smem(heads: int, depth: int, v_dim: int, dtype, warpgroups: int = 1
            ) -> tuple[mosaic_smem.Buffer, ...]:
  """The dS kernel's SMEM buffers, in its order (depth: D padded to a 128-byte row). With two
  warpgroups (`Blocks.ds_two_warpgroups`) Q and dY are shared and each has its own rings, V in the
  input dtype: in float32 they would need 262,656 bytes at H=8, D=V=64 (Hopper: 232,448)."""
  bq, bk, buf = BLOCK, DS_BLOCK_K, mosaic_smem.Buffer
  v_type, slots = (_F32 if warpgroups == 1 else dtype), 2 * warpgroups
  hv = mosaic_smem.heads_padded(heads, v_dim * bk, v_type)
  return (
      buf("Q", (heads, bq, depth), dtype, depth),
      buf("dY", (heads, v_dim, bq), dtype),
      buf("K ring", (slots, heads, bk, depth), dtype, depth),
      buf("V ring", (slots, hv, v_dim, bk), v_type),
      buf("key validity ring", (slots, mosaic_smem.key_valid_slot(bk)), _F32),
      buf("dS ring", (slots, heads, bq, bk), dtype),
  )


def dv_smem(heads: int, depth: int, dtype) -> tuple[mosaic_smem.Buffer, ...]:
  """The dV kernel's SMEM buffers, in its order."""
  bk, bq, bv, buf = BLOCK, DV_BLOCK_Q, DV_BLOCK_V, mosaic_smem.Buffer
  return (
      buf("K", (heads, bk, depth), dtype, depth),
      buf("V", (heads, bv, bk), _F32),
      buf("key validity", (bk,), _F32),
      buf("Q ring", (2, heads, bq, depth), dtype, depth),
      buf("dY ring", (2, mosaic_smem.heads_padded(heads, bv * bq, _F32), bv, bq), _F32),
      buf("dV", (heads, bv, bk), _F32),
  )


def matmul_smem(width: int, dtype) -> tuple[mosaic_smem.Buffer, ...]:
  """The dQ / dK matmul kernel's SMEM buffers (width: D), in its order."""
  n, buf = BLOCK, mosaic_smem.Buffer
  return (buf("dS ring", (2, n, n), dtype, n), buf("Q or K ring", (2, n, width), dtype, width),
          buf("output", (n, width), dtype))


def _ds_call(q_BHQD, k_BHKD, v_BHVK, dy_BHVQ, key_valid_BK, *, scale, is_causal, eps,
             zero_skipped, warpgroups, interpret):
  """dS (B, H, Qp, Kp) in the input dtype. Causal, the tiles past each query tile's diagonal
  are written (as zeros) only if `zero_skipped`. `warpgroups` (1 or 2): with two, a program's
  key tiles alternate between them, each with its own rings, Q and dY shared (`ds_smem`)."""
  import jax.experimental.pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top

  batch, heads, q_padded, depth = q_BHQD.shape
  k_padded, v_dim, dtype = k_BHKD.shape[2], v_BHVK.shape[2], q_BHQD.dtype
  bq, bk = BLOCK, DS_BLOCK_K
  num_k_tiles, split = k_padded // bk, DS_SPLIT_KEYS // bk
  rows, cols = plgpu.Layout.WGMMA.reduce(1), plgpu.Layout.WGMMA.reduce(0)
  shared = dict(collective_axes="wg") if warpgroups > 1 else {}

  def kernel(q_ref, k_ref, v_ref, dy_ref, kval_ref, ds_ref, q_smem, dy_smem, k_smem, v_smem,
             kval_smem, ds_smem, q_bar, k_bar, v_bar, kval_bar):
    b, q0, bm, stop = mosaic_smem.query_program(
        block_q=bq, block_k=bk, num_q_tiles=q_padded // bq, num_k_tiles=num_k_tiles,
        is_causal=is_causal, mask_batched=key_valid_BK.shape[0] > 1)
    first = jax.lax.axis_index("k_split") * split  # this program's key tiles: first + [0, steps)
    steps = jnp.maximum(jnp.minimum(stop, first + split) - first, 0)
    # This warpgroup's key tiles: tile(i) for i < own, in its ring slots 2wg, 2wg + 1.
    wg = jax.lax.axis_index("wg") if warpgroups > 1 else 0
    own, base = (steps - wg + warpgroups - 1) // warpgroups, 2 * wg
    tile = lambda i: first + wg + warpgroups * i
    first_wg = (lambda fn: fn()) if warpgroups == 1 else pl.when(wg == 0)  # a decorator
    load_tile = functools.partial(
        mosaic_smem.copy_key_tile, refs=(k_ref, kval_ref), rings=(k_smem, v_smem, kval_smem),
        bars=(k_bar, v_bar, kval_bar), v_tile=lambda k0: v_ref.at[b, :, :, pl.ds(k0, bk)],
        b=b, bm=bm)

    @first_wg
    def _load_shared():
      plgpu.copy_gmem_to_smem(q_ref.at[b, :, pl.ds(q0, bq)], q_smem, q_bar.at[0])
      plgpu.copy_gmem_to_smem(dy_ref.at[b, :, :, pl.ds(q0, bq)], dy_smem, q_bar.at[1])

    for step in range(2):  # the two-slot ring's prologue
      pl.when(step < own)(lambda step=step: load_tile(tile(step), base + step))
    plgpu.barrier_wait(q_bar.at[0])
    plgpu.barrier_wait(q_bar.at[1])

    def key_tile(step, carry):
      slot, k0 = base + jax.lax.rem(step, 2), tile(step) * bk
      c_h, inv_rms = mosaic_smem.code_tile(q_smem, k_smem, kval_smem, k_bar, kval_bar,
                                           slot=slot, q0=q0, k0=k0, is_causal=is_causal,
                                           scale=scale, eps=eps)
      plgpu.barrier_wait(v_bar.at[slot])

      def column(j, dc_h):
        v_h = [jax.lax.broadcast_in_dim(plgpu.load(v_smem.at[slot, h, j], layout=cols).astype(
            _F32), (bq, bk), [1]) for h in range(heads)]
        dy_h = [jax.lax.broadcast_in_dim(plgpu.load(dy_smem.at[h, j], layout=rows).astype(
            _F32), (bq, bk), [0]) for h in range(heads)]
        u = sum(c * v for c, v in zip(c_h, v_h))
        dz = sum(c * dy for c, dy in zip(c_h, dy_h))
        z, du = jnp.maximum(u, 0.0), jnp.where(u > 0.0, dz, 0.0)
        return tuple(dc + dy * z + du * v for dc, dy, v in zip(dc_h, dy_h, v_h))

      dc_h = jax.lax.fori_loop(0, v_dim, column, tuple(jnp.zeros_like(c) for c in c_h))
      along_c = sum(c * dc for c, dc in zip(c_h, dc_h)) * (1.0 / heads)
      scaled_rms = inv_rms * scale
      plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # this slot's last store has read it
      for h, (c, dc) in enumerate(zip(c_h, dc_h)):
        ds_smem[slot, h] = ((dc - c * along_c) * scaled_rms).astype(dtype)
      # Every thread's reads of the slot (V, key validity) and writes of dS done before TMA
      # overwrites the one and reads the other.
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(ds_smem.at[slot], ds_ref.at[b, :, pl.ds(q0, bq), pl.ds(k0, bk)])

      @pl.when(step + 2 < own)
      def _prefetch():
        load_tile(tile(step + 2), slot)

      return carry

    jax.lax.fori_loop(0, own, key_tile, 0)
    if is_causal and zero_skipped:  # XLA's matmuls read the tiles past the diagonal: zeros
      @first_wg
      def _write_zeros():
        plgpu.wait_smem_to_gmem(0, wait_read_only=True)
        for h in range(heads):
          ds_smem[0, h] = plgpu.layout_cast(jnp.zeros((bq, bk), dtype), plgpu.Layout.WGMMA)
        plgpu.commit_smem()

        @pl.loop(jnp.maximum(stop, first), jnp.minimum(first + split, num_k_tiles))
        def _skipped(kt):
          plgpu.copy_smem_to_gmem(ds_smem.at[0],
                                  ds_ref.at[b, :, pl.ds(q0, bq), pl.ds(kt * bk, bk)])
    plgpu.wait_smem_to_gmem(0)

  def hyla_ds(*refs):
    buffers = mosaic_smem.allocate(plgpu, ds_smem(heads, depth, v_dim, dtype, warpgroups))
    barriers = [plgpu.Barrier(num_barriers=n) for n in (2, *[2 * warpgroups] * 3)]
    pl.run_scoped(lambda *scoped: kernel(*refs, *scoped), *buffers, *barriers, **shared)

  threads = dict(num_threads=warpgroups, thread_name="wg") if warpgroups > 1 else {}
  return plgpu.kernel(
      hyla_ds, out_type=jax.ShapeDtypeStruct((batch, heads, q_padded, k_padded), dtype),
      grid=(batch, q_padded // bq, -(-num_k_tiles // split)),
      grid_names=("batch", "q_tile", "k_split"), interpret=interpret, **threads,
  )(q_BHQD, k_BHKD, v_BHVK, dy_BHVQ, key_valid_BK)


def _dv_call(k_BHKD, q_BHQD, v_BJHVK, dy_BJHVQ, key_valid_BK, *, scale, is_causal, eps,
             interpret):
  """dV (B, J, H, bv, Kp) float32: the forward's program with keys on the rows."""
  import jax.experimental.pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top

  batch, heads, k_padded, depth = k_BHKD.shape
  q_padded, num_slices, dtype = q_BHQD.shape[2], v_BJHVK.shape[1], k_BHKD.dtype
  bk, bq, bv = BLOCK, DV_BLOCK_Q, DV_BLOCK_V
  num_q_tiles = q_padded // bq
  rows, cols = plgpu.Layout.WGMMA.reduce(1), plgpu.Layout.WGMMA.reduce(0)

  def kernel(k_ref, q_ref, v_ref, dy_ref, kval_ref, out_ref, k_smem, v_smem, kval_smem,
             q_smem, dy_smem, o_smem, key_bar, q_bar, dy_bar):
    b, vj = jax.lax.axis_index("batch"), jax.lax.axis_index("v_slice")
    k0 = jax.lax.axis_index("k_tile") * bk
    first = k0 // bq if is_causal else 0  # query tiles wholly before the keys see none
    steps = num_q_tiles - first

    def load_tile(step, slot):
      q0 = (first + step) * bq
      plgpu.copy_gmem_to_smem(q_ref.at[b, :, pl.ds(q0, bq)], q_smem.at[slot], q_bar.at[slot])
      plgpu.copy_gmem_to_smem(dy_ref.at[b, vj, :, :, pl.ds(q0, bq)], dy_smem.at[slot],
                              dy_bar.at[slot])

    plgpu.copy_gmem_to_smem(k_ref.at[b, :, pl.ds(k0, bk)], k_smem, key_bar.at[0])
    plgpu.copy_gmem_to_smem(v_ref.at[b, vj, :, :, pl.ds(k0, bk)], v_smem, key_bar.at[1])
    plgpu.copy_gmem_to_smem(kval_ref.at[b if key_valid_BK.shape[0] > 1 else 0,
                                        pl.ds(k0, bk)], kval_smem, key_bar.at[2])
    for step in range(2):
      pl.when(step < steps)(functools.partial(load_tile, step, step))
    for i in range(3):
      plgpu.barrier_wait(key_bar.at[i])
    key_valid = jax.lax.broadcast_in_dim(plgpu.load(kval_smem, layout=rows), (bk, bq), [0])

    def query_tile(step, dv_HJ):
      slot, q0 = jax.lax.rem(step, 2), (first + step) * bq
      plgpu.barrier_wait(q_bar.at[slot])
      valid = mosaic_smem.causal(key_valid, q0=q0, k0=k0, keys_are_rows=True) if (
          is_causal) else key_valid
      c_h, _ = mosaic_smem.rms_code(mosaic_smem.scores_tile(k_smem, q_smem.at[slot]),
                                    valid, scale=scale, eps=eps)
      plgpu.barrier_wait(dy_bar.at[slot])
      dv_HJ = list(dv_HJ)
      for j in range(bv):
        u = sum(c * jax.lax.broadcast_in_dim(plgpu.load(v_smem.at[h, j], layout=rows),
                                             (bk, bq), [0]) for h, c in enumerate(c_h))
        dz = sum(c * jax.lax.broadcast_in_dim(plgpu.load(dy_smem.at[slot, h, j], layout=cols),
                                              (bk, bq), [1]) for h, c in enumerate(c_h))
        du = jnp.where(u > 0.0, dz, 0.0)
        for h, c in enumerate(c_h):
          dv_HJ[h * bv + j] = mosaic_smem.add_chunks(dv_HJ[h * bv + j], c * du)
      plgpu.commit_smem()  # every thread's reads of the slot done before TMA overwrites it

      @pl.when(step + 2 < steps)
      def _prefetch():
        load_tile(step + 2, slot)

      return tuple(dv_HJ)

    dv_HJ = jax.lax.fori_loop(0, steps, query_tile, mosaic_smem.chunk_accumulators(bk, heads * bv))
    mosaic_smem.store_row_sums(dv_HJ, o_smem, out_ref.at[b, vj, :, :, pl.ds(k0, bk)])

  def hyla_dv(*refs):
    buffers = mosaic_smem.allocate(plgpu, dv_smem(heads, depth, dtype))
    barriers = (plgpu.Barrier(num_barriers=3), plgpu.Barrier(num_barriers=2),
                plgpu.Barrier(num_barriers=2))
    pl.run_scoped(lambda *scoped: kernel(*refs, *scoped), *buffers, *barriers)

  return plgpu.kernel(
      hyla_dv, out_type=jax.ShapeDtypeStruct((batch, num_slices, heads, bv, k_padded), _F32),
      grid=(batch, k_padded // bk, num_slices), grid_names=("batch", "k_tile", "v_slice"),
      interpret=interpret,
  )(k_BHKD, q_BHQD, v_BJHVK, dy_BJHVQ, key_valid_BK)


def _ds_matmul_kernel(ds_BHQK, y_BHXW, *, transposed, is_causal, interpret):
  """dQ_h = dS_h K_h (y = K), or with `transposed` dK_h = dS_h^T Q_h (y = Q): a program per
  (batch, 64-row tile of the output, head) loops over 64 x 64 tiles of dS through a two-slot
  TMA ring (causal: up to, resp. from, the diagonal: the tiles the dS kernel wrote), one
  (64, W) float32 accumulator; (B, H, Qp or Kp, W) in dS's dtype."""
  import jax.experimental.pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top

  batch, heads, q_padded, k_padded = ds_BHQK.shape
  width, dtype, n = y_BHXW.shape[-1], ds_BHQK.dtype, BLOCK
  out_len, inner_len = (k_padded, q_padded) if transposed else (q_padded, k_padded)

  def kernel(ds_ref, y_ref, out_ref, ds_smem, y_smem, o_smem, ds_bar, y_bar):
    b, h = jax.lax.axis_index("batch"), jax.lax.axis_index("head")
    x0 = jax.lax.axis_index("tile") * n  # the output's first row: a query (dQ) or key (dK)
    first, stop = jnp.int32(0), jnp.int32(inner_len // n)
    if is_causal and transposed:
      first = x0 // n
    elif is_causal:
      stop = x0 // n + 1

    def load_tile(step, slot):
      i0 = (first + step) * n
      tile = (pl.ds(i0, n), pl.ds(x0, n)) if transposed else (pl.ds(x0, n), pl.ds(i0, n))
      plgpu.copy_gmem_to_smem(ds_ref.at[b, h, tile[0], tile[1]], ds_smem.at[slot], ds_bar.at[slot])
      plgpu.copy_gmem_to_smem(y_ref.at[b, h, pl.ds(i0, n)], y_smem.at[slot], y_bar.at[slot])

    steps = stop - first
    for step in range(2):
      pl.when(step < steps)(functools.partial(load_tile, step, step))

    def inner_tile(step, acc_value):
      slot = jax.lax.rem(step, 2)
      plgpu.barrier_wait(ds_bar.at[slot])
      plgpu.barrier_wait(y_bar.at[slot])

      def matmul(acc):
        a = ds_smem.at[slot]
        plgpu.wgmma(acc, a.transpose((1, 0)) if transposed else a, y_smem.at[slot])
        return acc[...]

      acc_value = acc_value + pl.run_scoped(matmul, plgpu.ACC((n, width), _F32))

      @pl.when(step + 2 < steps)
      def _prefetch():  # this slot is free again: the wgmma reading it has completed
        load_tile(step + 2, slot)

      return acc_value

    out = jax.lax.fori_loop(0, steps, inner_tile, plgpu.layout_cast(
        jnp.zeros((n, width), _F32), plgpu.Layout.WGMMA))
    o_smem[...] = out.astype(dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, out_ref.at[b, h, pl.ds(x0, n)])
    plgpu.wait_smem_to_gmem(0)

  def hyla_dq_dk(*refs):
    smem = mosaic_smem.allocate(plgpu, matmul_smem(width, dtype))
    barriers = (plgpu.Barrier(num_barriers=2), plgpu.Barrier(num_barriers=2))
    pl.run_scoped(lambda *scoped: kernel(*refs, *scoped), *smem, *barriers)

  return plgpu.kernel(
      hyla_dq_dk, out_type=jax.ShapeDtypeStruct((batch, heads, out_len, width), dtype),
      grid=(batch, out_len // n, heads), grid_names=("batch", "tile", "head"),
      interpret=interpret,
  )(ds_BHQK, y_BHXW)


def _matmuls_kernel(ds_BHQK, q_BHQD, k_BHKD, *, is_causal, interpret):
  run = functools.partial(_ds_matmul_kernel, is_causal=is_causal, interpret=interpret)
  return run(ds_BHQK, k_BHKD, transposed=False), run(ds_BHQK, q_BHQD, transposed=True)


def _matmuls_xla(ds_BHQK, q_BHQD, k_BHKD, *, is_causal, interpret):
  """dQ and dK as two XLA batched matmuls over all of dS (causal: its zeros included)."""
  del is_causal, interpret
  return (jnp.einsum("bhqk,bhkd->bhqd", ds_BHQK, k_BHKD, preferred_element_type=_F32),
          jnp.einsum("bhqk,bhqd->bhkd", ds_BHQK, q_BHQD, preferred_element_type=_F32))


# How dQ = dS K and dK = dS^T Q are computed from the dS the dS kernel writes. "kernel"
# (default): causal, the matmul kernels read dS up to the diagonal only, and the dS kernel
# writes nothing past it; "xla": cuBLAS over all of dS. A GPU window times the two.
DQ_PATHS = {"kernel": _matmuls_kernel, "xla": _matmuls_xla}
DEFAULT_DQ = "kernel"


def check_tiles(heads: int, depth: int, v_dim: int, dtype, ds_warpgroups: int = 1) -> None:
  """BadInput in one line, before lowering, when the compiled backward's buffers cannot fit
  (`mosaic_smem.check_tiles`); interpret mode has no such limit."""
  what = f"mosaic_kernel backward, {heads} heads, D={depth}, V={v_dim}, {dtype}"
  depth_padded = mosaic_smem.depth_padded(depth, dtype)
  mosaic_smem.check_tiles(ds_smem(heads, depth_padded, v_dim, dtype, ds_warpgroups), what + " (dS)")
  mosaic_smem.check_tiles(dv_smem(heads, depth_padded, dtype), what + " (dV)")


def backward(query_BQHD, key_BKHD, value_BKHV, mask, d_out_BQHV, *, is_causal, eps,
             interpret, dq=DEFAULT_DQ, ds_warpgroups=1):
  """(dQ, dK, dV) of `mosaic_kernel.attention` from the inputs and the output's cotangent;
  `dq` names the entry of DQ_PATHS that computes dQ and dK from dS; `ds_warpgroups` (1 or 2)
  the dS kernel's (`_ds_call`)."""
  batch, q_len, heads, depth = query_BQHD.shape
  k_len, v_dim, dtype = key_BKHD.shape[1], value_BKHV.shape[-1], query_BQHD.dtype
  round_up = mosaic_smem.round_up
  q_padded, k_padded = round_up(q_len, BLOCK), round_up(k_len, BLOCK)
  v_padded, d_padded = round_up(v_dim, DV_BLOCK_V), mosaic_smem.depth_padded(depth, dtype)
  pad = lambda x, length, heads_to, width, to=dtype: jnp.pad(x.astype(to), (
      (0, 0), (0, length - x.shape[1]), (0, heads_to - heads), (0, width - x.shape[3])))
  q_BHQD = jnp.transpose(pad(query_BQHD, q_padded, heads, d_padded), (0, 2, 1, 3))
  k_BHKD = jnp.transpose(pad(key_BKHD, k_padded, heads, d_padded), (0, 2, 1, 3))
  # V (and dY, for dV) in float32: the kernels' FMAs take it without a conversion per load
  # (except in the two-warpgroup dS kernel, whose rings would not fit: `ds_smem`).
  v_type = _F32 if ds_warpgroups == 1 else dtype
  hv_ds = mosaic_smem.heads_padded(heads, v_padded * DS_BLOCK_K, v_type)
  v_BHVK = jnp.transpose(pad(value_BKHV, k_padded, hv_ds, v_padded, v_type), (0, 2, 3, 1))
  dy_BHVQ = jnp.transpose(pad(d_out_BQHV, q_padded, heads, v_padded), (0, 2, 3, 1))
  key_valid_BK = mosaic_smem.key_valid(mask, k_len, k_padded)
  scale = 1.0 / math.sqrt(depth)
  ds_BHQK = _ds_call(q_BHQD, k_BHKD, v_BHVK, dy_BHVQ, key_valid_BK, scale=scale,
                     is_causal=is_causal, eps=eps, zero_skipped=dq == "xla",
                     warpgroups=ds_warpgroups, interpret=interpret)

  def sliced(x_BXHV, length, heads_to):  # (B, J, Hv, bv, X): the value slice leading
    x = pad(x_BXHV, length, heads_to, v_padded, _F32).reshape(
        batch, length, heads_to, v_padded // DV_BLOCK_V, DV_BLOCK_V)
    return jnp.transpose(x, (0, 3, 2, 4, 1))

  dv_BJHVK = _dv_call(
      k_BHKD, q_BHQD, sliced(value_BKHV, k_padded, heads),
      sliced(d_out_BQHV, q_padded,
             mosaic_smem.heads_padded(heads, DV_BLOCK_V * DV_BLOCK_Q, _F32)),
      key_valid_BK, scale=scale, is_causal=is_causal, eps=eps, interpret=interpret)
  # Padded keys and queries have dS = 0 (their scores are 0), so the padded Q and K are exact here.
  dq_BHQD, dk_BHKD = DQ_PATHS[dq](ds_BHQK, q_BHQD, k_BHKD, is_causal=is_causal, interpret=interpret)
  d_query = jnp.transpose(dq_BHQD[:, :, :q_len, :depth], (0, 2, 1, 3))
  d_key = jnp.transpose(dk_BHKD[:, :, :k_len, :depth], (0, 2, 1, 3))
  d_value = jnp.transpose(dv_BJHVK, (0, 4, 2, 1, 3)).reshape(batch, k_padded, heads, v_padded)
  return d_query.astype(dtype), d_key.astype(dtype), d_value[:, :k_len, :, :v_dim].astype(dtype)
