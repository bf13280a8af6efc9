"""HYLA backward in Pallas Mosaic GPU: a key-stationary kernel (dK, dV, dS), then dQ (issue 42).

The forward is `mosaic_kernel.py` (read its docstring first: the layouts and what Mosaic can
and cannot express carry over). For every pair (q, k) and head h, with s = scores * scale
(masked -> 0), r = rsqrt(mean_h s^2 + eps), c = s r (the code), u_k = C[k] V[k] (heads
contracted), z = relu(u) and dy the output's cotangent:

  dz_qk   = sum_h c_h dy_qh                       (the read-out's gradient into z)
  du_qk   = dz_qk * [u_qk > 0]
  dc_h    = <dy_qh, z_qk> + <du_qk, V[k]_h>       (read-out and value network into c)
  ds_h    = r (dc_h - c_h <c, dc> / H)            (RMSHead's Jacobian, per pair)
  dV[k]_h = sum_q c_h du_qk                       (accumulated on chip)
  dS      = scale * ds                            (w.r.t. the raw q.k products)
  dK_h    = dS_h^T Q_h                            (accumulated on chip)
  dQ_h    = dS_h K_h                              (a second kernel over the written dS)

A masked or padded pair has s = 0, so c = u = z = 0 and dc = 0: its dS is exactly 0 with no
mask in the backward (the mask acts through the recomputed scores, as in the reference).

Where it runs. One program per (batch b, key tile of bk = 16 keys); K, V (heads padded to 16)
and the permutation P load once, then the program loops over the query tiles that may see its
keys (causal: from the tile holding k0) and, per query tile:
  scores   s_h = q_h k_h^T, masked, scaled       H wgmmas (bq x W) @ (W x bk) -> S_cat
  dy       the tile's cotangent, loaded into the SMEM buffer Q used (Q is consumed by then)
  per key k of the tile (unrolled: each key keeps its own dV accumulator):
    s[k]   = S_cat @ P_k                         wgmma, exact permutation -> (bq, 16) head-minor
    c      = s * rsqrt(sum_h s^2 / H + eps)      registers (row reductions)
    u      = C[k] @ V[k]                         wgmma
    dz, dc_read                                  registers: per head, a masked row sum of c
                                                 broadcast over W, and a row sum of dy_h * z
    dc_val = du @ V[k]^T                         wgmma (transposed B, like the scores' K)
    dV[k]^T += du^T @ C[k]                       wgmma (transposed A; M = W, a multiple of 64)
    dS_h[:, k] += ds[k] @ P_k[h]^T               H wgmmas (bq x 16) @ (16 x bk): the inverse
                                                 permutation, exact (P_k[h]^T = e_h e_k^T)
  dS_h     -> SMEM (H, bq, bk) -> HBM (B, H, Qp, Kp), one TMA store
  Q        reloaded into the buffer dY used (dY is consumed by then)
  dK_h^T  += Q_h^T @ dS_h                        H wgmmas (W x bq) @ (bq x bk), transposed A
After the loop each key's dV^T (W, 16) and each head's dK^T (W, bk) are stored; XLA
transposes them (linear in T). No atomics: every dK and dV entry has one writer. Causal: a
key tile's programs never visit query tiles wholly before it.

dQ sums over keys, i.e. over key-stationary programs (atomics, which the issue rules out), so
it is a second pass over the written dS (B, H, Qp, Kp), against the padded K (padded keys and
queries have dS = 0), chosen by name from DQ_PATHS:
  "kernel" (default)  query-stationary: a program per (batch, 64-query tile, head) loops over
                      key tiles of 64 (32 or 16 where Kp needs) up to the causal diagonal
                      through a two-slot TMA ring, dQ_h += dS_h @ K_h by wgmma, one
                      (64, W) float32 accumulator. Causal, it reads dS up to the diagonal
                      only, so the key-stationary kernel leaves the tiles above unwritten.
  "xla"               one batched matmul (cuBLAS) over all of dS: causal, the key-stationary
                      kernel writes zeros in the tiles it skips.
The kernel is the default for what it saves causal (below); cuBLAS's larger tiles re-read K
less (the kernel reads K_h once per 64-query tile: 2 bytes per pair and head, from L2), so
"xla" may win non-causal: a GPU window should time both before `auto` takes this path.

All SMEM operands use 16-element (32-byte) rows and swizzle: a wgmma's two SMEM operands must
share a swizzle, and dK's B (one head's dS tile, bk = 16 bf16 columns) allows 32 bytes only,
so Q/dY and K take the narrow swizzle too (the previous version had 128 for them; the wider
swizzle avoids bank conflicts, to be measured).

FLOPs per (q, k) pair (W = D = V, H heads, Hp = 16, bk = 16), tensor cores:
  scores 2HW, permutation 2*H*bk*Hp, u 2*Hp*W, dc_val 2*Hp*W, dV 2*Hp*W, dS scatter
  2*Hp*bk*H, dK 2HW; then dQ 2HW. With H = 8, W = 64: 1024 + 4096 + 3 * 2048 + 4096 + 1024
  = 16.4 kFLOP in the key-stationary kernel plus 1.0 for dQ (the first version: 11.3 in
  the kernel, 2.0 in XLA for dQ and dK). The scatter's 4096 (0/1 products, exact) is the
  price of dK on chip: Mosaic has no register transpose or head-minor SMEM store (see
  mosaic_kernel.py), so dS goes from per-key (bq, 16 heads) tiles back to per-head (bq, bk)
  tiles through the tensor cores. The forward at the same
  sizes is 38.9 kFLOP (bv = 16: 4 value slices each recomputing scores and permutation).
  What the math needs (backward with recomputed scores and u) is 8 * 2HW = 8.2 kFLOP, of
  which dz and dc_read (2 * 2HW) run on the CUDA cores here.

HBM traffic of dS (bf16; B * Qp * Kp pairs): 2H bytes per pair written by the kernel, 2H
read by dQ: 32 bytes per pair at H = 8. At B = 4, T = 4096 that is 2.1 GB, ~0.45 ms at an
H200's 4.8 TB/s, against ~150 MB for all of a flash softmax backward: dS in HBM, not the
FLOPs, is what this design pays for its simplicity. Causal, the dQ kernel and the skipped
tiles halve it (1.1 GB: ~T^2/2 pairs written and read); XLA's dQ path writes the zeros and
reads the full square (2.1 GB). Q loads twice per (key tile, query tile), beside dY once:
3 * H * W * 2 / bk = 192 bytes per pair from L2 into SMEM; Q and dY (16.8 MB each at those
sizes) may not both stay in an H100's 50 MB L2.

Shared memory (bf16, H = 8, W = 64, bq = 64, bk = 16; measured by lowering for an abstract
H100): 230,456 bytes (225 KiB) of Hopper's 232,448 (Q/dY 64 KiB, K 16, V 32, S_cat 16, P 64,
C/ds 2, du 8, dS per head 16, dV^T/dK^T ring 4). H = 4 fits. H = 16 (410,680 bytes), D = V =
128 (357,432) and float32 inputs (457,784) do not: lowering says so ("exceeds available
shared memory"); they run in interpret mode only. Registers: live across the key loop are
16 dV^T accumulators (W x 16 f32: 8 registers per thread each at W = 64), H dK^T (8 each) and
H dS tiles (8 each): 256 per thread before any working set, over Hopper's 255. ptxas confirms
it (measure/ptxas.py, an H100 target without a GPU, B=4 T=1024): 255 registers and ~9.3 KB
of spill stores per thread, against 80 for the dQ kernel and none for either forward. bk = 8
is not open (8 bf16 keys are 16-byte S_cat rows, which no Mosaic swizzle takes); the
remedies are two consumer warpgroups splitting W for dV/dK (as attention_mgpu.py's backward
splits its work) or the registers forward's layout (not built). Lowering the backward (16
keys unrolled) takes ~45 s on a 2-core CPU.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from hypernet_attention.ops import mosaic_smem

_F32 = jnp.float32
BLOCK_Q = 64   # wgmma M
BLOCK_K = 16   # one (8, 16) SMEM tile column per head in S_cat, as in the forward


def backward_smem(heads: int, width: int, dtype) -> tuple:
  """The key-stationary kernel's SMEM buffers, in the order it takes them. Every swizzled
  one has 16-element (32-byte) rows: a wgmma's two SMEM operands must share a swizzle, and
  dK's B (one head's dS tile, bk = 16 bf16 columns) allows 32 bytes only."""
  bq, bk, hp, buf = BLOCK_Q, BLOCK_K, mosaic_smem.HEADS_PADDED, mosaic_smem.Buffer
  return (
      buf("Q, then dY, then Q", (heads, bq, width), dtype, 16),
      buf("K", (heads, bk, width), dtype, 16),
      buf("V, heads padded", (bk, hp, width), dtype, 16),
      buf("key validity", (bk,), _F32),
      buf("S_cat", (bq, heads * bk), dtype, 16),
      buf("P", (bk, heads * bk, hp), dtype, 16),
      buf("C[k]", (bq, hp), dtype, 16),
      buf("du", (bq, width), dtype, 16),
      buf("dS per head", (heads, bq, bk), dtype, 16),
      buf("dV^T / dK^T ring", (2, width, hp), dtype),
  )


def _backward_call(q_BHQW, k_BHKW, v_BKHW, dy_BHQW, key_valid_BK, *, scale, is_causal, eps,
                   zero_skipped, interpret):
  """The kernel on padded inputs: dS (B, H, Qp, Kp), dV^T (B, Kp, W, 16), dK^T (B, H, W, Kp).
  Causal: the dS tiles no query sees are written as zeros only if `zero_skipped` (XLA's dQ
  reads all of dS; the dQ kernel reads up to the diagonal only)."""
  import jax.experimental.pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top

  batch, heads, q_padded, width = q_BHQW.shape
  k_padded = k_BHKW.shape[2]
  dtype = q_BHQW.dtype
  bq, bk, hp = BLOCK_Q, BLOCK_K, mosaic_smem.HEADS_PADDED
  num_q_tiles = q_padded // bq
  mask_batched = key_valid_BK.shape[0] > 1
  perm_KJH, _ = mosaic_smem.selection_constants(heads, bk, bk, dtype)

  def kernel(q_ref, k_ref, v_ref, dy_ref, kval_ref, perm_ref, ds_ref, dvt_ref, dkt_ref, scoped):
    (qdy_smem, k_smem, v_smem, kval_smem, scat_smem, perm_smem, c_smem, du_smem, ds_smem,
     out_smem), (tile_bar, k_bar, v_bar, q_bar, dy_bar, q_again_bar) = scoped
    b = jax.lax.axis_index("batch")
    k0 = jax.lax.axis_index("k_tile") * bk
    bm = b if mask_batched else 0
    first = k0 // bq if is_causal else 0

    def per_head_load(src_ref, q0, barrier):
      for h in range(heads):
        plgpu.copy_gmem_to_smem(src_ref.at[b, h, pl.ds(q0, bq)], qdy_smem.at[h], barrier)

    for h in range(heads):
      plgpu.copy_gmem_to_smem(k_ref.at[b, h, pl.ds(k0, bk)], k_smem.at[h], k_bar)
    for k in range(bk):
      plgpu.copy_gmem_to_smem(v_ref.at[b, k0 + k], v_smem.at[k], v_bar)
    plgpu.copy_gmem_to_smem(kval_ref.at[bm, pl.ds(k0, bk)], kval_smem, tile_bar.at[0])
    plgpu.copy_gmem_to_smem(perm_ref, perm_smem, tile_bar.at[1])
    for barrier in (k_bar, v_bar, tile_bar.at[0], tile_bar.at[1]):
      plgpu.barrier_wait(barrier)
    key_valid = jax.lax.broadcast_in_dim(
        plgpu.load(kval_smem, layout=plgpu.Layout.WGMMA.reduce(0)), (bq, bk), [1])

    if is_causal and zero_skipped:  # no query of tiles [0, first) sees these keys: dS = 0
      for h in range(heads):
        ds_smem[h] = jnp.zeros((bq, bk), dtype)
      plgpu.commit_smem()

      @pl.loop(0, first)
      def _skipped_tile(qi):
        for h in range(heads):
          plgpu.copy_smem_to_gmem(ds_smem.at[h],
                                  ds_ref.at[b, h, pl.ds(qi * bq, bq), pl.ds(k0, bk)])

    def scores_tile(q0):
      per_head_load(q_ref, q0, q_bar)
      plgpu.barrier_wait(q_bar)

      def scores(*accs):
        for h, acc in enumerate(accs):
          plgpu.wgmma(acc, qdy_smem.at[h], k_smem.at[h].transpose((1, 0)))
        return [acc[...] for acc in accs]

      s_h = pl.run_scoped(scores, *[plgpu.ACC((bq, bk), _F32) for _ in range(heads)])
      valid = key_valid
      if is_causal:
        rows = plgpu.broadcasted_iota(jnp.int32, (bq, bk), 0, layout=plgpu.Layout.WGMMA)
        cols = plgpu.broadcasted_iota(jnp.int32, (bq, bk), 1, layout=plgpu.Layout.WGMMA)
        valid = jnp.where(q0 + rows >= k0 + cols, valid, 0.0)
      for h, s in enumerate(s_h):
        scat_smem[:, pl.ds(h * bk, bk)] = (s * (scale * valid)).astype(dtype)
      plgpu.commit_smem()
      # Q is consumed (the score wgmmas completed): the cotangent takes its buffer.
      per_head_load(dy_ref, q0, dy_bar)
      plgpu.barrier_wait(dy_bar)

    def one_key(k, dvt, ds_accs):
      """Key k0 + k against this query tile: its dS scattered into the per-head accumulators
      ds_accs (column k of each), its dV^T returned."""
      def permute(acc):
        plgpu.wgmma(acc, scat_smem, perm_smem.at[k])
        return acc[...]

      s = pl.run_scoped(permute, plgpu.ACC((bq, hp), _F32))
      inv_rms = jax.lax.rsqrt(jnp.sum(s * s, axis=1) * (1.0 / heads) + eps)
      c = s * jax.lax.broadcast_in_dim(inv_rms, (bq, hp), [0])
      c_smem[...] = c.astype(dtype)
      plgpu.commit_smem()

      def value_net(acc):
        plgpu.wgmma(acc, c_smem, v_smem.at[k])
        return acc[...]

      u = pl.run_scoped(value_net, plgpu.ACC((bq, width), _F32))
      z = jnp.maximum(u, 0.0)
      head_col = plgpu.broadcasted_iota(jnp.int32, (bq, hp), 1, layout=plgpu.Layout.WGMMA)
      dz = jnp.zeros((bq, width), _F32)
      dc = jnp.zeros((bq, hp), _F32)
      for h in range(heads):
        dy_h = plgpu.load(qdy_smem.at[h], layout=plgpu.Layout.WGMMA).astype(_F32)
        c_h = jnp.sum(jnp.where(head_col == h, c, 0.0), axis=1)
        dz = dz + jax.lax.broadcast_in_dim(c_h, (bq, width), [0]) * dy_h
        dc_h = jax.lax.broadcast_in_dim(jnp.sum(dy_h * z, axis=1), (bq, hp), [0])
        dc = dc + jnp.where(head_col == h, dc_h, 0.0)
      du_smem[...] = jnp.where(u > 0.0, dz, 0.0).astype(dtype)
      plgpu.commit_smem()

      def grads(dc_acc, dvt_acc):
        plgpu.wgmma(dc_acc, du_smem, v_smem.at[k].transpose((1, 0)))
        plgpu.wgmma(dvt_acc, du_smem.transpose((1, 0)), c_smem)
        return dc_acc[...], dvt_acc[...]

      # Fresh accumulators plus a register add: interpret mode cannot run a wgmma inside
      # pl.run_state (ACC.init), which would save the add on hardware.
      dc_val, dvt_step = pl.run_scoped(grads, plgpu.ACC((bq, hp), _F32),
                                       plgpu.ACC((width, hp), _F32))
      dc, dvt = dc + dc_val, dvt + dvt_step
      along_c = jnp.sum(c * dc, axis=1) * (1.0 / heads)
      ds = (dc - c * jax.lax.broadcast_in_dim(along_c, (bq, hp), [0])) * \
          jax.lax.broadcast_in_dim(inv_rms * scale, (bq, hp), [0])
      # The inverse permutation, by the tensor cores again: ds (bq, 16 heads) times the 0/1
      # block P[k][h*bk:(h+1)*bk]^T (16, bk), which is e_h e_k^T, adds ds[:, h] to column k
      # of head h's dS tile. A from SMEM (C[k]'s buffer, free once `grads` has completed):
      # interpret mode cannot take a wgmma's A from registers. The next key's first acc[...]
      # read waits for these wgmmas before C[k+1] overwrites the buffer.
      c_smem[...] = ds.astype(dtype)
      plgpu.commit_smem()
      for h, acc in enumerate(ds_accs):
        plgpu.wgmma(acc, c_smem, perm_smem.at[k, pl.ds(h * bk, bk)].transpose((1, 0)))
      return dvt

    def q_tile(qi, carry):
      dvts, dkts = carry
      q0 = qi * bq
      scores_tile(q0)

      def keys(*ds_accs):
        new_dvts = tuple(one_key(k, dvt, ds_accs) for k, dvt in enumerate(dvts))
        return new_dvts, [acc[...] for acc in ds_accs]

      dvts, ds_h = pl.run_scoped(keys, *[plgpu.ACC((bq, bk), _F32) for _ in range(heads)])
      # The cotangent is consumed (loaded into registers key by key): Q again, for dK.
      per_head_load(q_ref, q0, q_again_bar)
      plgpu.wait_smem_to_gmem(0, wait_read_only=True)  # the last dS store has read ds_smem
      for h, ds in enumerate(ds_h):
        ds_smem[h] = ds.astype(dtype)
      plgpu.commit_smem()
      for h in range(heads):
        plgpu.copy_smem_to_gmem(ds_smem.at[h], ds_ref.at[b, h, pl.ds(q0, bq), pl.ds(k0, bk)])
      plgpu.barrier_wait(q_again_bar)

      def key_grads(*accs):  # dK_h^T (W, bk) += Q_h^T (W, bq) @ dS_h (bq, bk)
        for h, acc in enumerate(accs):
          plgpu.wgmma(acc, qdy_smem.at[h].transpose((1, 0)), ds_smem.at[h])
        return [acc[...] for acc in accs]

      dk_steps = pl.run_scoped(key_grads, *[plgpu.ACC((width, bk), _F32) for _ in range(heads)])
      return dvts, tuple(dkt + step for dkt, step in zip(dkts, dk_steps))

    zeros = lambda: plgpu.layout_cast(jnp.zeros((width, bk), _F32), plgpu.Layout.WGMMA)
    dvts, dkts = jax.lax.fori_loop(
        first, num_q_tiles, q_tile,
        (tuple(zeros() for _ in range(bk)), tuple(zeros() for _ in range(heads))))
    stores = [(dvt, dvt_ref.at[b, k0 + k]) for k, dvt in enumerate(dvts)]
    stores += [(dkt, dkt_ref.at[b, h, :, pl.ds(k0, bk)]) for h, dkt in enumerate(dkts)]
    for i, (value, dst) in enumerate(stores):
      plgpu.wait_smem_to_gmem(1, wait_read_only=True)  # this slot's previous store has read it
      out_smem[i % 2] = value.astype(dtype)
      plgpu.commit_smem()
      plgpu.copy_smem_to_gmem(out_smem.at[i % 2], dst)
    plgpu.wait_smem_to_gmem(0)

  def entry(q_ref, k_ref, v_ref, dy_ref, kval_ref, perm_ref, ds_ref, dvt_ref, dkt_ref):
    smem = mosaic_smem.allocate(plgpu, backward_smem(heads, width, dtype))
    # One arrival per copy: a tile of (heads or keys, rows, W) goes as one TMA copy per head
    # or key. As one copy it is 6 strided dimensions once tiled by the 32-byte swizzle (the
    # batch index, heads, 8-row tiles, W's four 16-column tiles, 8, 16) and Mosaic allows 5:
    # the H100 window of 2026-11-26 failed so at B = 4 ("Async copies only support striding
    # up to 5 dimensions"); a unit batch axis is dropped, so B = 1 lowered. dS is stored per
    # head for the same reason.
    barriers = (plgpu.Barrier(num_barriers=2), plgpu.Barrier(num_arrivals=heads),
                plgpu.Barrier(num_arrivals=bk), plgpu.Barrier(num_arrivals=heads),
                plgpu.Barrier(num_arrivals=heads), plgpu.Barrier(num_arrivals=heads))
    pl.run_scoped(
        lambda *scoped: kernel(q_ref, k_ref, v_ref, dy_ref, kval_ref, perm_ref, ds_ref, dvt_ref,
                               dkt_ref, (scoped[:10], scoped[10:])),
        *smem, *barriers)

  return plgpu.kernel(
      entry,
      out_type=(jax.ShapeDtypeStruct((batch, heads, q_padded, k_padded), dtype),
                jax.ShapeDtypeStruct((batch, k_padded, width, hp), dtype),
                jax.ShapeDtypeStruct((batch, heads, width, k_padded), dtype)),
      grid=(batch, k_padded // bk),
      grid_names=("batch", "k_tile"),
      interpret=interpret,
  )(q_BHQW, k_BHKW, v_BKHW, dy_BHQW, key_valid_BK, perm_KJH)


def _dq_kernel(ds_BHQK, k_BHKW, *, is_causal, interpret):
  """dQ_h = dS_h K_h, query-stationary: a program per (batch, query tile, head) loops over key
  tiles (causal: up to the diagonal) through a two-slot TMA ring; (B, H, Qp, W), dS's dtype.

  One head per program keeps one (bq, W) float32 accumulator (32 registers per thread at
  W = 64; all heads in one program would take 256). Key tiles of 64 where Kp allows (wgmma K
  = 64, 128-byte swizzle), else 32 or 16."""
  import jax.experimental.pallas as pl  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas import mosaic_gpu as plgpu  # pylint: disable=g-import-not-at-top

  batch, heads, q_padded, k_padded = ds_BHQK.shape
  width = k_BHKW.shape[-1]
  dtype = ds_BHQK.dtype
  bq, bk = BLOCK_Q, next(n for n in (64, 32, 16) if k_padded % n == 0)
  num_k_tiles = k_padded // bk
  # Both operands take dS's swizzle (bk columns); K's W columns split into tiles of that width.
  transforms = mosaic_smem.smem_transforms(plgpu, bk, dtype)

  def kernel(ds_ref, k_ref, dq_ref, scoped):
    (ds_smem, k_smem, o_smem), (ds_bar, k_bar) = scoped
    b = jax.lax.axis_index("batch")
    h = jax.lax.axis_index("head")
    q0 = jax.lax.axis_index("q_tile") * bq
    if is_causal:  # the key-stationary kernel wrote every tile up to the diagonal, no further
      steps = jnp.minimum(num_k_tiles, pl.cdiv(q0 + bq, jnp.int32(bk)))
    else:
      steps = jnp.int32(num_k_tiles)

    def load_tile(step, slot):
      plgpu.copy_gmem_to_smem(ds_ref.at[b, h, pl.ds(q0, bq), pl.ds(step * bk, bk)],
                              ds_smem.at[slot], ds_bar.at[slot])
      plgpu.copy_gmem_to_smem(k_ref.at[b, h, pl.ds(step * bk, bk)], k_smem.at[slot],
                              k_bar.at[slot])

    for step in range(min(2, num_k_tiles)):  # the two-slot ring's prologue
      pl.when(step < steps)(functools.partial(load_tile, step, step))

    def key_tile(step, dq):
      slot = jax.lax.rem(step, 2)
      plgpu.barrier_wait(ds_bar.at[slot])
      plgpu.barrier_wait(k_bar.at[slot])

      def matmul(acc):
        plgpu.wgmma(acc, ds_smem.at[slot], k_smem.at[slot])
        return acc[...]

      dq = dq + pl.run_scoped(matmul, plgpu.ACC((bq, width), _F32))

      @pl.when(step + 2 < steps)
      def _prefetch():  # this slot is free again: the wgmma reading it has completed
        load_tile(step + 2, slot)

      return dq

    dq = jax.lax.fori_loop(
        0, steps, key_tile,
        plgpu.layout_cast(jnp.zeros((bq, width), _F32), plgpu.Layout.WGMMA))
    o_smem[...] = dq.astype(dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(o_smem, dq_ref.at[b, h, pl.ds(q0, bq)])
    plgpu.wait_smem_to_gmem(0)

  def entry(ds_ref, k_ref, dq_ref):
    smem = (plgpu.SMEM((2, bq, bk), dtype, transforms=transforms),
            plgpu.SMEM((2, bk, width), dtype, transforms=transforms),
            plgpu.SMEM((bq, width), dtype))
    barriers = (plgpu.Barrier(num_barriers=2), plgpu.Barrier(num_barriers=2))
    pl.run_scoped(lambda *scoped: kernel(ds_ref, k_ref, dq_ref, (scoped[:3], scoped[3:])),
                  *smem, *barriers)

  return plgpu.kernel(
      entry,
      out_type=jax.ShapeDtypeStruct((batch, heads, q_padded, width), dtype),
      grid=(batch, q_padded // bq, heads),
      grid_names=("batch", "q_tile", "head"),
      interpret=interpret,
  )(ds_BHQK, k_BHKW)


def _dq_xla(ds_BHQK, k_BHKW, *, is_causal, interpret):
  """dQ_h = dS_h K_h as one XLA batched matmul over all of dS (causal: zeros included)."""
  del is_causal, interpret
  return jnp.einsum("bhqk,bhkw->bhqw", ds_BHQK, k_BHKW, preferred_element_type=_F32)


# How dQ = dS K is computed from the dS the key-stationary kernel writes. "kernel" is the
# default: causal, it reads dS up to the diagonal only and spares the key-stationary kernel
# the zeros above it (half of dS's HBM traffic at long T); not causal, both read dS once.
# "xla" is cuBLAS's matmul, the first version's path, kept until a GPU window times the two.
DQ_PATHS = {"kernel": _dq_kernel, "xla": _dq_xla}
DEFAULT_DQ = "kernel"


def backward(query_BQHD, key_BKHD, value_BKHV, mask, d_out_BQHV, *, is_causal, eps,
             interpret, dq=DEFAULT_DQ):
  """(dQ, dK, dV) of `mosaic_kernel.attention` from the inputs and the output's cotangent;
  `dq` names the entry of DQ_PATHS that computes dQ = dS K."""
  batch, q_len, heads, depth = query_BQHD.shape
  k_len, v_dim = key_BKHD.shape[1], value_BKHV.shape[-1]
  dtype = query_BQHD.dtype
  q_padded, k_padded = mosaic_smem.round_up(q_len, BLOCK_Q), mosaic_smem.round_up(k_len, BLOCK_K)
  # One width W for Q, K (D) and V, dY (V): Q's buffer holds dY between its two uses, and
  # dV^T's and dK^T's wgmmas take W as their M (a multiple of 64).
  width = max(mosaic_smem.round_up(depth, 64), mosaic_smem.round_up(v_dim, 64))
  pad = lambda x, length: jnp.pad(
      x, ((0, 0), (0, length - x.shape[1]), (0, 0), (0, width - x.shape[3])))
  q_BHQW = jnp.transpose(pad(query_BQHD, q_padded), (0, 2, 1, 3))
  k_BHKW = jnp.transpose(pad(key_BKHD, k_padded), (0, 2, 1, 3))
  dy_BHQW = jnp.transpose(pad(d_out_BQHV.astype(dtype), q_padded), (0, 2, 1, 3))
  v_BKHW = jnp.pad(value_BKHV, ((0, 0), (0, k_padded - k_len),
                                (0, mosaic_smem.HEADS_PADDED - heads), (0, width - v_dim)))
  if not interpret:  # compiled (None or False); interpret mode has no such limits
    mosaic_smem.check_tiles(backward_smem(heads, width, dtype),
                    f"mosaic_kernel backward, {heads} heads, width {width}, {dtype}")
  ds_BHQK, dvt_BKWH, dkt_BHWK = _backward_call(
      q_BHQW, k_BHKW, v_BKHW, dy_BHQW,
      mosaic_smem.key_valid(mask, k_len, k_padded),
      scale=1.0 / math.sqrt(depth), is_causal=is_causal, eps=eps, zero_skipped=dq == "xla",
      interpret=interpret)
  # Padded keys and queries have dS = 0 (their scores are 0), so the padded K is exact here.
  dq_BHQW = DQ_PATHS[dq](ds_BHQK, k_BHKW, is_causal=is_causal, interpret=interpret)
  d_query = jnp.transpose(dq_BHQW[:, :, :q_len, :depth], (0, 2, 1, 3))
  d_key = jnp.transpose(dkt_BHWK[:, :, :depth, :k_len], (0, 3, 1, 2))
  d_value = jnp.transpose(dvt_BKWH[:, :k_len, :v_dim, :heads], (0, 1, 3, 2))
  return d_query.astype(dtype), d_key, d_value
