"""`auto`'s model of HYLA's fwd+bwd time on one Hopper GPU: the fused kernels against blockwise.

Why not a length: the kernels' time is set by how their CTAs fill the GPU's 132 multiprocessors,
which depends on batch, heads, query tiles and the causal triangle. Each kernel's CTAs are placed
greedily, in launch order, on the GPU's CTA slots (multiprocessors x `CTAS_PER_SM`); the busiest
slot's (query, key) pairs times a cost per pair calibrated on one row is the kernel's time: at
T=1024, B=4 the dS kernel's 64 CTAs leave half the GPU idle; C4's B=64, T=512 has 512.

Calibration (`CALIBRATION`): one H200, 2026-11-28, B=4, T=4096, H=8, D=V=64, bf16, causal
(experiments/results/gpu_windows/2026-11-28_h200, gpu_window.jsonl: the paired 64x8x8 row's
kernels_ms, blockwise 256 x 256's fwd_bwd_ms); tests/ops/test_kernel_cost.py checks other rows.
Extrapolated, untimed: per-CTA fixed costs as key loops shorten (no row below T=1024: `MIN_KEYS`);
blockwise below B=4 (`BLOCKWISE_FLOOR_MS`); H, D, V other than 8, 64, 64 (per-pair costs scaled by
each kernel's multiply-adds per pair)."""

from __future__ import annotations

import functools
import heapq

from hypernet_attention.ops import tiling

SMS = 132  # streaming multiprocessors of an H100 SXM and of an H200
# CTAs one multiprocessor holds: `measure.ptxas.occupancy` of the kernels' ptxas rows (forward 236
# registers and 103 KiB, dS 154 and 193 KiB, dV 247 and 101 KiB; tests/measure/test_ptxas.py).
CTAS_PER_SM = {"forward": 2, "dS": 1, "dV": 2}
BLOCK = 64  # queries per forward and dS CTA, keys per dV CTA
FORWARD_BLOCK_V, DV_BLOCK_V = 8, 4  # value columns per forward (paired) and dV CTA
DS_SPLIT_KEYS = 512  # keys per dS CTA at most (mosaic_kernel_bwd.DS_SPLIT_KEYS)
# Multiply-adds per pair and value column of each kernel, as (a, b) in a*H + b (mosaic_kernel_bwd's
# docstring): the factor by which another H or V changes a kernel's cost per pair.
WORK = {"forward": (2, 1), "dS": (4, 1), "dV": (3, 1)}
CALIBRATION = dict(batch=4, seq_len=4096, heads=8, v_dim=64,
                   kernels_ms={"forward": 4.4196, "dS": 10.5049, "dV": 7.1118},
                   other_ms=0.31 + 0.09,  # the dQ/dK matmuls and XLA's layout moves
                   blockwise_ms=35.6633)
# Below this many keys no row covers the kernels (the shortest timed: 1024; C4's 512 one halving
# under it, which the next window times): `auto` keeps blockwise there.
MIN_KEYS = 512
# Blockwise's time per causal 256 x 256 tile pair cannot fall below its ~21 kernels' launches
# (2,866 kernels for 136 tile pairs at T=4096, experiments/results/gpu_program_h100.jsonl; ~2.7 us
# each, kernels.md).
BLOCKWISE_FLOOR_MS = 21 * 0.0027


def _busiest_slot(pairs_per_cta, slots: int) -> float:
  """Pairs on the busiest of `slots` CTA slots, CTAs taken in launch order by the first free.
  Past 64 waves the tail is noise: the mean load plus the largest CTA, without the walk."""
  if len(pairs_per_cta) > 64 * slots:
    return sum(pairs_per_cta) / slots + max(pairs_per_cta)
  finish = [0.0] * slots
  for pairs in pairs_per_cta:
    heapq.heappush(finish, heapq.heappop(finish) + pairs)
  return max(finish)


def _visible(q0: int, k_len: int, causal: bool) -> int:
  """Keys a tile of BLOCK queries from q0 reads (to the diagonal when causal)."""
  return min(k_len, q0 + BLOCK) if causal else k_len


def _ctas(kernel: str, batch: int, q_len: int, k_len: int, v_dim: int, causal: bool,
          as_measured: bool):
  """Pairs of each CTA of `kernel`, in launch order (the grid's last axis fastest). Causal, the
  query tiles run last first and the dS kernel splits each tile's keys into runs of
  DS_SPLIT_KEYS (mosaic_smem.query_program, mosaic_kernel_bwd); `as_measured`: the schedule the
  calibration row ran, first query tile first and dS unsplit."""
  q_tiles, k_tiles = -(-q_len // BLOCK), -(-k_len // BLOCK)
  if kernel == "dV":
    slices = -(-v_dim // DV_BLOCK_V)
    return [BLOCK * (q_tiles * BLOCK - (j * BLOCK if causal else 0))
            for _ in range(batch) for j in range(k_tiles) for _ in range(slices)]
  order = range(q_tiles) if as_measured or not causal else range(q_tiles - 1, -1, -1)
  if kernel == "forward":
    return [BLOCK * _visible(i * BLOCK, k_len, causal) for _ in range(batch) for i in order
            for _ in range(-(-v_dim // FORWARD_BLOCK_V))]
  split = k_len if as_measured else DS_SPLIT_KEYS
  return [BLOCK * max(0, min(_visible(i * BLOCK, k_len, causal), (p + 1) * split) - p * split)
          for _ in range(batch) for i in order for p in range(-(-k_len // split))]


@functools.lru_cache(maxsize=256)
def _busiest(kernel: str, batch: int, q_len: int, k_len: int, v_dim: int, causal: bool,
             as_measured: bool) -> float:
  return _busiest_slot(_ctas(kernel, batch, q_len, k_len, v_dim, causal, as_measured),
                       SMS * CTAS_PER_SM[kernel])


def mosaic_ms(batch: int, q_len: int, k_len: int, heads: int, v_dim: int, causal: bool,
              as_measured: bool = False) -> float:
  """Modeled fwd+bwd ms of the fused kernels (paired 64x8x8 forward, dS, dV, dQ/dK); with
  `as_measured`, of the schedule the calibration row ran (`_ctas`)."""
  c = CALIBRATION
  total = c["other_ms"] * (batch * q_len * k_len * heads) / (c["batch"] * c["seq_len"] ** 2 * 8)
  for kernel, measured_ms in c["kernels_ms"].items():
    per_pair = measured_ms / _busiest(kernel, c["batch"], c["seq_len"], c["seq_len"],
                                      c["v_dim"], True, True)
    a, b = WORK[kernel]
    scale = (a * heads + b) * v_dim / ((a * c["heads"] + b) * c["v_dim"])
    total += per_pair * scale * _busiest(kernel, batch, q_len, k_len, v_dim, causal, as_measured)
  return total


def _tile_pairs(q_len: int, k_len: int, block_q: int, block_k: int, causal: bool) -> int:
  """The (query tile, key tile) pairs blockwise's schedule visits (`tiling.tile_schedule`)."""
  k_tiles = -(-k_len // block_k)
  return sum(tiling.visible_k_blocks(i, block_q, block_k, k_tiles, causal)
             for i in range(-(-q_len // block_q)))


def blockwise_ms(batch: int, q_len: int, k_len: int, heads: int, v_dim: int, causal: bool,
                 block_q: int = 256, block_k: int = 256) -> float:
  """Modeled fwd+bwd ms of blockwise with (at most) these tiles: a cost per batch row and tile
  pair, scaled by heads x value width, with its launch floor."""
  c = CALIBRATION
  block_q, block_k = tiling.balanced_block(q_len, block_q), tiling.balanced_block(k_len, block_k)
  per_row_pair = c["blockwise_ms"] / (c["batch"] * _tile_pairs(c["seq_len"], c["seq_len"], 256,
                                                                256, True))
  scale = (heads * v_dim * block_q * block_k) / (c["heads"] * c["v_dim"] * 256 * 256)
  return _tile_pairs(q_len, k_len, block_q, block_k, causal) * max(
      BLOCKWISE_FLOOR_MS, batch * per_row_pair * scale)


def mosaic_faster(batch: int, q_len: int, k_len: int, heads: int, v_dim: int, causal: bool) -> bool:
  """Whether `auto` takes the fused kernels over blockwise: the model above says they are faster,
  from MIN_KEYS keys on. Timed as the calibration row ran them (`as_measured`): the reversed query
  tiles and split dS keys only shorten the model's time, and no window has timed them yet."""
  if k_len < MIN_KEYS:
    return False
  return (mosaic_ms(batch, q_len, k_len, heads, v_dim, causal, as_measured=True)
          < blockwise_ms(batch, q_len, k_len, heads, v_dim, causal))
