"""Fused Pallas kernels for HYLA-style attention: forward, and a two-kernel backward.

One program owns one batch element and one tile of bq queries, for *all* heads: RMSHead
normalizes across heads and the MLP value network sums over heads, so heads cannot be
split across programs the way flash attention splits them. It loops over key tiles of bk
keys (stopping at the causal diagonal), keeps per-head accumulators (bq, V) on chip and
never writes a score, code or hidden tile to memory. Softmax normalization runs the key
loop twice inside the program (row logsumexp, then output).

Per key tile, with a_h the (bq, bk) code of head h:
  linear value network:  acc_h += a_h @ v_h                         (matrix units)
  mlp value network:     z = phi(sum_h a_h[:, :, None] * v_h[None])  (bq, bk, V)
                         acc_h += sum_k a_h[:, :, None] * z          (vector units)
The MLP value network contracts over heads inside each (q, k) pair, which no matrix unit
does, so its two extra H*V-long products per pair run on the vector units: that, not
memory, bounds this kernel.

Backward (plugged into `blockwise`'s custom VJP): one kernel per key tile accumulates dk,
dv over the query tiles that see it; one per query tile accumulates dq and its rows of the
bias gradient. Both recompute the tiles from (q, k, v, bias, mask) and the forward's
logsumexp, so nothing quadratic is stored and no atomics are needed. Softmax's row
statistic sum_k a da is the blockwise JAX pass (one extra sweep, softmax only).

Lowering: Triton on GPU (tiles padded to powers of two >= 16, as `tl.dot` needs);
`interpret=True` runs the same kernels on CPU for tests. Compiled and run on an H100
(jax 0.11.2, Triton 3.6): tests/ops/test_ops_gpu.py passes every variant there. But it is slow:
at T=4096, B=4, H=8, d=64, bf16, causal the MLP kernel took 208 / 1261 ms (fwd / fwd+bwd)
against blockwise's 32 / 66 ms, because the MLP's (bq, bk, V) products run on the vector
units (and Triton compiles them slowly) while XLA maps blockwise's einsums to the matrix
units; `dispatch` therefore never picks it. On the H100 window of 2026-11-26 (timed inside
one jitted loop) it took 17.3 / 116.5 ms at T=1024, 993x cuDNN softmax's fwd+bwd and 40x
blockwise's, and passed the float64 parity check at T=256 (float32 and bf16). jax 0.11 also
marks Pallas's Triton backend deprecated (Mosaic GPU is its successor): it stays, by name
only, until `mosaic_kernel` has passed parity on a GPU.

Shape letters: B batch, H heads, Q / K (padded Qp / Kp) positions, D query/key width
(padded Dp), V value width (padded Vp); q / k for positions inside a tile.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import jax
from jax.experimental import pallas as pl
import jax.numpy as jnp

from hypernet_attention.ops import blockwise
from hypernet_attention.ops import dropout
from hypernet_attention.ops import reference
from hypernet_attention.ops import tiling


@dataclasses.dataclass(frozen=True)
class Launch:
  """Triton launch parameters (threads per program, software-pipelining depth)."""
  num_warps: int = 4
  num_stages: int = 2


# (block_q, block_k) per value network: the MLP keeps (bq, bk, V) tensors in registers.
# Linear: 64x64 tiles with two pipeline stages asked an H100 for 328 KiB of shared memory
# at H=8, d=64 (227 KiB available): every head's tiles are live at once. 32x32 with one
# stage needs about an eighth of that.
DEFAULT_BLOCKS = {"mlp": (16, 16), "linear": (32, 32)}
# What the kernels compute (`reference.Computes`): one key of DEFAULT_BLOCKS per value network.
COMPUTES = reference.Computes("pallas", ("softmax", "linear", "rms_head"),
                              tuple(DEFAULT_BLOCKS))
DEFAULT_LAUNCH = {"mlp": Launch(num_stages=1), "linear": Launch(num_stages=1)}
_MIN_DOT = 16  # Triton's tl.dot needs every dimension >= 16.
_F32 = jnp.float32


def _dot(x, y, contract, dtype):
  """x . y over axes `contract` ((x axis,), (y axis,)), float32 result.

  Operands go to the matrix units in the inputs' `dtype`: bf16/f16 tiles (flash-attention
  practice), or float32 at full precision (Triton would otherwise use TF32 for f32).
  """
  low = jnp.dtype(dtype).itemsize < 4
  precision = None if low else jax.lax.Precision.HIGHEST
  if low:
    x, y = x.astype(dtype), y.astype(dtype)
  return jax.lax.dot_general(x, y, (contract, ((), ())), precision=precision,
                             preferred_element_type=_F32)


_ROWS = ((1,), (1,))  # x @ y.T
_COLS = ((0,), (0,))  # x.T @ y
_MATMUL = ((1,), (0,))  # x @ y


def _next_pow2(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


def _pair_spec(x4, block_q):
  """BlockSpec of a rank-4 bias/mask for grid (b, i): query tile i (None: all rows)."""
  if x4 is None:
    return None
  b_full, q_full = x4.shape[0] != 1, x4.shape[2] != 1
  rows = x4.shape[2] if (block_q is None or not q_full) else block_q
  block = (None, x4.shape[1], rows, x4.shape[3])
  if block_q is None:
    return pl.BlockSpec(block, lambda b, i: (b if b_full else 0, 0, 0, 0))
  return pl.BlockSpec(block, lambda b, i: (b if b_full else 0, 0, i if q_full else 0, 0))


def _pair_tile(ref, h, q_start, k_start, bq, bk, local_q):
  """(bq|1, bk|1) tile of a bias/mask block; `local_q`: the block holds only this tile's rows."""
  if ref is None:
    return None
  rows = slice(None) if (local_q or ref.shape[1] == 1) else pl.ds(q_start, bq)
  cols = slice(None) if ref.shape[2] == 1 else pl.ds(k_start, bk)
  return ref[h if ref.shape[0] > 1 else 0, rows, cols]


def _tile(queries, k_ref, bias_ref, mask_ref, q_start, k_start, cfg, heads, local_q):
  """Per-head scores s_h (bq, bk) float32 and validity of one (query, key) tile."""
  bq, bk = cfg.block_q, cfg.block_k
  q_pos = q_start + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
  k_pos = k_start + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
  valid = k_pos < cfg.k_len
  if cfg.is_causal:
    valid = jnp.logical_and(valid, q_pos >= k_pos)
  valid_h, s_h = [], []
  for h in range(heads):
    m = _pair_tile(mask_ref, h, q_start, k_start, bq, bk, local_q)
    valid_h.append(valid if m is None else jnp.logical_and(valid, m != 0))
    s = _dot(queries[h], k_ref[h, pl.ds(k_start, bk), :], _ROWS, queries[h].dtype)
    s = s * cfg.scale
    b = _pair_tile(bias_ref, h, q_start, k_start, bq, bk, local_q)
    s_h.append(s if b is None else s + b.astype(_F32))
  return s_h, valid_h


def _code(s_h, valid_h, lse_h, cfg, heads):
  """Latent code a_h (bq, bk) per head; masked pairs exactly 0."""
  if cfg.normalization == "softmax":
    return [jnp.exp(jnp.where(valid_h[h], s_h[h] - lse_h[h][:, None], -jnp.inf))
            for h in range(heads)]
  a_h = [jnp.where(valid_h[h], s_h[h], 0.0) for h in range(heads)]
  if cfg.normalization == "linear":
    return a_h
  if cfg.normalization == "rms_head":
    r = jax.lax.rsqrt(sum(a * a for a in a_h) * (1.0 / heads) + cfg.eps)
    return [a * r for a in a_h]
  raise ValueError(f"pallas has no code for normalization={cfg.normalization!r}; it "
                   f"computes {COMPUTES.normalizations}.")


def _tile_drop(seed_ref, q_start, k_start, cfg):
  """(bq, bk) dropout keep/(1-rate) of a tile (`dropout.py`), or None without dropout."""
  if seed_ref is None:
    return None
  return dropout.grid_keep_scale(seed_ref[0], cfg.block_q, cfg.block_k, cfg.dropout_rate,
                                 q_start, k_start)


def _dropped(a_h, drop):
  return a_h if drop is None else [a * drop for a in a_h]


def _tile_grads(s_h, valid_h, a_h, values, dys, row_h, cfg, heads, dtype, drop):
  """(ds_h (bq, bk), dv_h (bk, V)) per head of one tile: see blockwise's docstring.
  `a_h` is the code before dropout; the value network saw `a * drop`."""
  code_h, a_h = a_h, _dropped(a_h, drop)
  if cfg.value_network == "linear":
    da_h = [_dot(dy, v, _ROWS, dtype) for dy, v in zip(dys, values)]
    dv_h = [_dot(a, dy, _COLS, dtype) for a, dy in zip(a_h, dys)]
  elif cfg.value_network == "mlp":
    phi = reference.get_activation(cfg.activation)
    u = sum(a[:, :, None] * v[None, :, :] for a, v in zip(a_h, values))
    z, phi_vjp = jax.vjp(phi, u)
    (du,) = phi_vjp(sum(a[:, :, None] * dy[:, None, :] for a, dy in zip(a_h, dys)))
    da_h = [jnp.sum(dy[:, None, :] * z + du * v[None, :, :], axis=2)
            for dy, v in zip(dys, values)]
    dv_h = [jnp.sum(a[:, :, None] * du, axis=0) for a in a_h]
  else:
    raise ValueError(f"pallas has no value network {cfg.value_network!r}; it computes "
                     f"{COMPUTES.value_networks}.")
  da_h = _dropped(da_h, drop)
  if cfg.normalization == "softmax":
    ds_h = [a * (da - row[:, None]) for a, da, row in zip(code_h, da_h, row_h)]
  elif cfg.normalization == "linear":
    ds_h = [jnp.where(valid, da, 0.0) for valid, da in zip(valid_h, da_h)]
  elif cfg.normalization == "rms_head":
    s0_h = [jnp.where(valid, s, 0.0) for valid, s in zip(valid_h, s_h)]
    r = jax.lax.rsqrt(sum(s * s for s in s0_h) * (1.0 / heads) + cfg.eps)
    mean_da_s = sum(da * s for da, s in zip(da_h, s0_h)) * (1.0 / heads)
    ds_h = [jnp.where(valid, r * da - s * r**3 * mean_da_s, 0.0)
            for valid, da, s in zip(valid_h, da_h, s0_h)]
  else:
    raise ValueError(f"pallas has no gradient for normalization={cfg.normalization!r}; it "
                     f"computes {COMPUTES.normalizations}.")
  return ds_h, dv_h


def _forward_kernel(q_ref, k_ref, v_ref, bias_ref, mask_ref, seed_ref, out_ref, lse_ref, *,
                    cfg, heads):
  """One (batch, query tile) program; refs are (H, ., .) blocks of this batch element."""
  qi = pl.program_id(1)
  bq, bk = cfg.block_q, cfg.block_k
  phi = reference.get_activation(cfg.activation)
  q_start = qi * bq
  queries = [q_ref[h] for h in range(heads)]
  tile = lambda kj: _tile(queries, k_ref, bias_ref, mask_ref, q_start, kj * bk, cfg, heads,
                          local_q=True)
  num_k = tiling.causal_k_blocks(qi, cfg)
  lse_h = None
  if cfg.normalization == "softmax":
    def stats(kj, carry):
      s_h, valid_h = tile(kj)
      new = []
      for h in range(heads):
        m_prev, l_prev = carry[h]
        s = jnp.where(valid_h[h], s_h[h], -jnp.inf)
        m_next = jnp.maximum(m_prev, jnp.max(s, axis=1))
        m_safe = jnp.where(m_next == -jnp.inf, 0.0, m_next)
        l_next = l_prev * jnp.exp(m_prev - m_safe) + jnp.sum(jnp.exp(s - m_safe[:, None]), 1)
        new.append((m_next, l_next))
      return tuple(new)

    init = tuple((jnp.full((bq,), -jnp.inf, _F32), jnp.zeros((bq,), _F32))
                 for _ in range(heads))
    carry = jax.lax.fori_loop(0, num_k, stats, init)
    lse_h = []
    for h, (m, l) in enumerate(carry):
      lse = jnp.where(l > 0, jnp.where(m == -jnp.inf, 0.0, m) + jnp.log(l), -jnp.inf)
      lse_ref[h, :] = lse
      lse_h.append(lse)

  def body(kj, accs):
    s_h, valid_h = tile(kj)
    a_h = _dropped(_code(s_h, valid_h, lse_h, cfg, heads),
                   _tile_drop(seed_ref, q_start, kj * bk, cfg))
    values = [v_ref[h, pl.ds(kj * bk, bk), :].astype(_F32) for h in range(heads)]
    if cfg.value_network == "linear":
      return tuple(acc + _dot(a, v, _MATMUL, q_ref.dtype)
                   for acc, a, v in zip(accs, a_h, values))
    if cfg.value_network == "mlp":
      z = phi(sum(a[:, :, None] * v[None, :, :] for a, v in zip(a_h, values)))
      return tuple(acc + jnp.sum(a[:, :, None] * z, axis=1) for acc, a in zip(accs, a_h))
    raise ValueError(f"pallas has no value network {cfg.value_network!r}; it computes "
                     f"{COMPUTES.value_networks}.")

  init = tuple(jnp.zeros((bq, out_ref.shape[-1]), _F32) for _ in range(heads))
  accs = jax.lax.fori_loop(0, num_k, body, init)
  for h in range(heads):
    out_ref[h] = accs[h].astype(out_ref.dtype)


def _dkv_kernel(q_ref, k_ref, v_ref, bias_ref, mask_ref, seed_ref, lse_ref, row_ref, dy_ref,
                dk_ref, dv_ref, *, cfg, heads):
  """Program (batch, key tile kj): loops over the query tiles that see kj."""
  kj = pl.program_id(1)
  bq, bk = cfg.block_q, cfg.block_k
  k_start = kj * bk
  dtype = q_ref.dtype
  values = [v_ref[h, pl.ds(k_start, bk), :].astype(_F32) for h in range(heads)]

  def body(qi, carry):
    dk_h, dv_h = carry
    q_slice = pl.ds(qi * bq, bq)
    queries = [q_ref[h, q_slice, :] for h in range(heads)]
    s_h, valid_h = _tile(queries, k_ref, bias_ref, mask_ref, qi * bq, k_start, cfg, heads,
                         local_q=False)
    lse_h = row_h = None
    if cfg.normalization == "softmax":
      lse_h = [lse_ref[h, q_slice] for h in range(heads)]
      row_h = [row_ref[h, q_slice] for h in range(heads)]
    a_h = _code(s_h, valid_h, lse_h, cfg, heads)
    dys = [dy_ref[h, q_slice, :] for h in range(heads)]
    ds_h, dv_tile = _tile_grads(s_h, valid_h, a_h, values, dys, row_h, cfg, heads, dtype,
                                _tile_drop(seed_ref, qi * bq, k_start, cfg))
    dk_h = tuple(dk + cfg.scale * _dot(ds, q, _COLS, dtype)
                 for dk, ds, q in zip(dk_h, ds_h, queries))
    return dk_h, tuple(dv + d for dv, d in zip(dv_h, dv_tile))

  init = (tuple(jnp.zeros((bk, dk_ref.shape[-1]), _F32) for _ in range(heads)),
          tuple(jnp.zeros((bk, dv_ref.shape[-1]), _F32) for _ in range(heads)))
  dk_h, dv_h = jax.lax.fori_loop(tiling.causal_first_q_block(kj, cfg), cfg.num_q_blocks,
                                 body, init)
  for h in range(heads):
    dk_ref[h] = dk_h[h]
    dv_ref[h] = dv_h[h]


def _dq_kernel(q_ref, k_ref, v_ref, bias_ref, mask_ref, seed_ref, lse_ref, row_ref, dy_ref,
               dq_ref, dbias_ref, *, cfg, heads):
  """Program (batch, query tile qi): loops over visible key tiles; dq and this batch
  element's bias gradient rows (summed over heads / key tiles where bias broadcasts)."""
  qi = pl.program_id(1)
  bq, bk = cfg.block_q, cfg.block_k
  queries = [q_ref[h] for h in range(heads)]
  dys = [dy_ref[h] for h in range(heads)]
  lse_h = row_h = None
  if cfg.normalization == "softmax":
    lse_h = [lse_ref[h] for h in range(heads)]
    row_h = [row_ref[h] for h in range(heads)]
  if dbias_ref is not None:
    _zero_dbias(dbias_ref, cfg)

  def body(kj, dq_h):
    k_start = kj * bk
    s_h, valid_h = _tile(queries, k_ref, bias_ref, mask_ref, qi * bq, k_start, cfg, heads,
                         local_q=True)
    a_h = _code(s_h, valid_h, lse_h, cfg, heads)
    values = [v_ref[h, pl.ds(k_start, bk), :].astype(_F32) for h in range(heads)]
    ds_h, _ = _tile_grads(s_h, valid_h, a_h, values, dys, row_h, cfg, heads, q_ref.dtype,
                          _tile_drop(seed_ref, qi * bq, k_start, cfg))
    if dbias_ref is not None:
      _accumulate_dbias(dbias_ref, ds_h, k_start, bk)
    return tuple(dq + cfg.scale * _dot(ds, k_ref[h, pl.ds(k_start, bk), :], _MATMUL,
                                       q_ref.dtype)
                 for h, (dq, ds) in enumerate(zip(dq_h, ds_h)))

  init = tuple(jnp.zeros((bq, dq_ref.shape[-1]), _F32) for _ in range(heads))
  dq_h = jax.lax.fori_loop(0, tiling.causal_k_blocks(qi, cfg), body, init)
  for h in range(heads):
    dq_ref[h] = dq_h[h]


def _zero_dbias(dbias_ref, cfg):
  """Zeroes the bias-gradient block tile by tile: Triton arrays must have power-of-two
  sizes, and the block's head count and padded key length need not."""
  rows = dbias_ref.shape[1]
  if dbias_ref.shape[2] == 1:
    for h in range(dbias_ref.shape[0]):
      dbias_ref[h] = jnp.zeros((rows, 1), dbias_ref.dtype)
    return

  def body(kj, carry):
    for h in range(dbias_ref.shape[0]):
      dbias_ref[h, :, pl.ds(kj * cfg.block_k, cfg.block_k)] = jnp.zeros(
          (rows, cfg.block_k), dbias_ref.dtype)
    return carry

  jax.lax.fori_loop(0, cfg.num_k_blocks, body, 0)


def _accumulate_dbias(dbias_ref, ds_h, k_start, bk):
  """Adds one tile's ds into the (Hb, bq|1, Kp|1) bias-gradient block of this program."""
  if dbias_ref.shape[0] == 1:
    ds_h = [sum(ds_h)]
  cols = slice(None) if dbias_ref.shape[2] == 1 else pl.ds(k_start, bk)
  for h, ds in enumerate(ds_h):
    if dbias_ref.shape[1] == 1:
      ds = jnp.sum(ds, axis=0, keepdims=True)
    if dbias_ref.shape[2] == 1:
      ds = jnp.sum(ds, axis=1, keepdims=True)
    dbias_ref[h, :, cols] = dbias_ref[h, :, cols] + ds


def _pad_last(x, size):
  if x.shape[-1] == size:
    return x
  return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, size - x.shape[-1])])


def _padded_widths(depth, v_dim):
  return max(_MIN_DOT, _next_pow2(depth)), max(_MIN_DOT, _next_pow2(v_dim))


def _compiler_params(interpret, launch):
  if interpret or jax.default_backend() == "tpu":
    return None
  # Written for Triton: without these params Pallas would pick its Mosaic GPU backend.
  from jax.experimental.pallas import triton as plgpu  # pylint: disable=g-import-not-at-top
  return plgpu.CompilerParams(num_warps=launch.num_warps, num_stages=launch.num_stages)


def _seed_operand(seed, cfg):
  """The dropout seed as a (1,) int32 operand and its BlockSpec (None, None without)."""
  if not cfg.dropout_rate:
    return None, None
  return seed.reshape(1).astype(jnp.int32), pl.BlockSpec((1,), lambda b, i: (0,))


def forward(q_BHQD, k_BHKD, v_BHKV, bias4, mask4, seed, cfg, *, interpret=False,
            launch=None):
  """blockwise.Kernels.forward: (out (B, H, Qp, V) f32, lse (B, H, Qp) | None)."""
  batch, heads, _, depth = q_BHQD.shape
  v_dim = v_BHKV.shape[-1]
  d_pad, v_pad = _padded_widths(depth, v_dim)
  q, k, v = _pad_last(q_BHQD, d_pad), _pad_last(k_BHKD, d_pad), _pad_last(v_BHKV, v_pad)
  # Masks travel as int8: bool memrefs lower poorly.
  mask4 = None if mask4 is None else mask4.astype(jnp.int8)
  softmax = cfg.normalization == "softmax"
  tile_spec = lambda width: pl.BlockSpec((None, heads, cfg.block_q, width),
                                         lambda b, i: (b, 0, i, 0))
  seq_spec = lambda width: pl.BlockSpec((None, heads, cfg.k_padded, width),
                                        lambda b, i: (b, 0, 0, 0))
  seed1, seed_spec = _seed_operand(seed, cfg)
  in_specs = [tile_spec(d_pad), seq_spec(d_pad), seq_spec(v_pad),
              _pair_spec(bias4, cfg.block_q), _pair_spec(mask4, cfg.block_q), seed_spec]
  out_shape = [jax.ShapeDtypeStruct((batch, heads, cfg.q_padded, v_pad), _F32)]
  out_specs = [tile_spec(v_pad)]
  if softmax:
    out_shape.append(jax.ShapeDtypeStruct((batch, heads, cfg.q_padded), _F32))
    out_specs.append(pl.BlockSpec((None, heads, cfg.block_q), lambda b, i: (b, 0, i)))

  def kernel(q_ref, k_ref, v_ref, bias_ref, mask_ref, seed_ref, out_ref, *lse):
    _forward_kernel(q_ref, k_ref, v_ref, bias_ref, mask_ref, seed_ref, out_ref,
                    lse[0] if lse else None, cfg=cfg, heads=heads)

  outs = pl.pallas_call(
      kernel, out_shape=out_shape, grid=(batch, cfg.num_q_blocks), in_specs=in_specs,
      out_specs=out_specs, interpret=interpret,
      compiler_params=_compiler_params(interpret, launch),
      name=f"hyla_{cfg.normalization}_{cfg.value_network}_forward",
  )(q, k, v, bias4, mask4, seed1)
  return outs[0][..., :v_dim], (outs[1] if softmax else None)


def backward(q_BHQD, k_BHKD, v_BHKV, bias4, mask4, seed, lse, row, dy_BHQV, cfg, *,
             interpret=False, launch=None):
  """blockwise.Kernels.backward as two Pallas kernels: dk/dv by key tile, dq/dbias by
  query tile (each recomputes its tiles; no atomics). Softmax's row statistic `row` comes
  from blockwise's pass."""
  batch, heads, _, depth = q_BHQD.shape
  v_dim = v_BHKV.shape[-1]
  d_pad, v_pad = _padded_widths(depth, v_dim)
  q, k, v = _pad_last(q_BHQD, d_pad), _pad_last(k_BHKD, d_pad), _pad_last(v_BHKV, v_pad)
  dy = _pad_last(dy_BHQV, v_pad)
  mask4 = None if mask4 is None else mask4.astype(jnp.int8)
  whole = lambda length, width: pl.BlockSpec((None, heads, length, width),
                                             lambda b, i: (b, 0, 0, 0))
  tile = lambda length, width: pl.BlockSpec((None, heads, length, width),
                                            lambda b, i: (b, 0, i, 0))
  stat_whole = stat_tile = None
  if cfg.normalization == "softmax":
    stat_whole = pl.BlockSpec((None, heads, cfg.q_padded), lambda b, i: (b, 0, 0))
    stat_tile = pl.BlockSpec((None, heads, cfg.block_q), lambda b, i: (b, 0, i))
  params = _compiler_params(interpret, launch)
  name = f"hyla_{cfg.normalization}_{cfg.value_network}"
  seed1, seed_spec = _seed_operand(seed, cfg)

  dk, dv = pl.pallas_call(
      functools.partial(_dkv_kernel, cfg=cfg, heads=heads),
      out_shape=[jax.ShapeDtypeStruct((batch, heads, cfg.k_padded, d_pad), _F32),
                 jax.ShapeDtypeStruct((batch, heads, cfg.k_padded, v_pad), _F32)],
      grid=(batch, cfg.num_k_blocks),
      in_specs=[whole(cfg.q_padded, d_pad), whole(cfg.k_padded, d_pad),
                whole(cfg.k_padded, v_pad), _pair_spec(bias4, None), _pair_spec(mask4, None),
                seed_spec, stat_whole, stat_whole, whole(cfg.q_padded, v_pad)],
      out_specs=[tile(cfg.block_k, d_pad), tile(cfg.block_k, v_pad)],
      interpret=interpret, compiler_params=params, name=f"{name}_dkv",
  )(q, k, v, bias4, mask4, seed1, lse, row, dy)

  out_shape = [jax.ShapeDtypeStruct((batch, heads, cfg.q_padded, d_pad), _F32)]
  out_specs = [tile(cfg.block_q, d_pad)]
  if bias4 is not None:
    # Per batch element and query tile; reduced over broadcast axes below.
    q_full = bias4.shape[2] != 1
    rows = cfg.q_padded if q_full else cfg.num_q_blocks
    out_shape.append(jax.ShapeDtypeStruct(
        (batch, bias4.shape[1], rows, bias4.shape[3]), _F32))
    out_specs.append(pl.BlockSpec(
        (None, bias4.shape[1], cfg.block_q if q_full else 1, bias4.shape[3]),
        lambda b, i: (b, 0, i, 0)))

  def dq_kernel(q_ref, k_ref, v_ref, bias_ref, mask_ref, seed_ref, lse_ref, row_ref, dy_ref,
                dq_ref, *dbias):
    _dq_kernel(q_ref, k_ref, v_ref, bias_ref, mask_ref, seed_ref, lse_ref, row_ref, dy_ref,
               dq_ref, dbias[0] if dbias else None, cfg=cfg, heads=heads)

  outs = pl.pallas_call(
      dq_kernel, out_shape=out_shape, grid=(batch, cfg.num_q_blocks),
      in_specs=[tile(cfg.block_q, d_pad), whole(cfg.k_padded, d_pad),
                whole(cfg.k_padded, v_pad), _pair_spec(bias4, cfg.block_q),
                _pair_spec(mask4, cfg.block_q), seed_spec, stat_tile, stat_tile,
                tile(cfg.block_q, v_pad)],
      out_specs=out_specs, interpret=interpret, compiler_params=params,
      name=f"{name}_dq",
  )(q, k, v, bias4, mask4, seed1, lse, row, dy)
  dbias4 = None
  if bias4 is not None:
    dbias4 = outs[1]
    if bias4.shape[0] == 1:
      dbias4 = jnp.sum(dbias4, axis=0, keepdims=True)
    if bias4.shape[2] == 1:
      dbias4 = jnp.sum(dbias4, axis=2, keepdims=True)
  return outs[0][..., :depth], dk[..., :depth], dv[..., :v_dim], dbias4


@functools.lru_cache(maxsize=None)
def _kernels(interpret: bool, launch: Launch) -> blockwise.Kernels:
  return blockwise.Kernels(
      forward=functools.partial(forward, interpret=interpret, launch=launch),
      backward=functools.partial(backward, interpret=interpret, launch=launch))


# The GPU `lower_for_gpu` targets: the one the kernels were compiled and timed on.
LOWERING_DEVICE = jax.sharding.AbstractDevice(device_kind="NVIDIA H100", num_cores=132,
                                              platform="gpu")


def lower_for_gpu(fn, *arg_specs, device: jax.sharding.AbstractDevice = LOWERING_DEVICE):
  """`jax.jit(fn)` traced on `arg_specs` and lowered for CUDA, on a machine with no GPU too.

  The Triton lowering needs the target GPU's compute capability. jax 0.10 assumed an H100's
  (9.0) when no GPU was attached; jax 0.11 refuses ("No supported GPU devices found") unless
  the abstract mesh in context names an abstract GPU `device`, which this supplies. Use it
  to check ahead of time that the kernels lower (the tests do, on CPU).
  """
  mesh = jax.sharding.AbstractMesh((1,), ("gpu",), abstract_device=device)
  with jax.sharding.use_abstract_mesh(mesh):
    return jax.jit(fn).trace(*arg_specs).lower(lowering_platforms=("cuda",))


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
    block_q: Optional[int] = None,
    block_k: Optional[int] = None,
    interpret: Optional[bool] = None,
    launch: Optional[Launch] = None,
    dropout_rate: float = 0.0,
    dropout_seed: Optional[jax.Array] = None,
) -> jax.Array:
  """Same contract as `blockwise.attention`. `interpret` defaults to True off GPU;
  `launch` defaults to `DEFAULT_LAUNCH[value_network]`."""
  COMPUTES.check(normalization, value_network)
  default_q, default_k = DEFAULT_BLOCKS[value_network]
  block_q, block_k = block_q or default_q, block_k or default_k
  if interpret is None:
    interpret = jax.default_backend() != "gpu"
  q_len, k_len = query_BQHD.shape[1], key_BKHD.shape[1]
  # Power-of-two tiles of at least 16 (tl.dot), no larger than the padded sequence.
  block_q = max(_MIN_DOT, min(_next_pow2(block_q), _next_pow2(q_len)))
  block_k = max(_MIN_DOT, min(_next_pow2(block_k), _next_pow2(k_len)))
  cfg = tiling.make_config(
      q_len, k_len, query_BQHD.shape[-1], computes=COMPUTES, normalization=normalization,
      value_network=value_network, activation=activation, eps=eps, is_causal=is_causal,
      block_q=block_q, block_k=block_k, balance=False, dropout_rate=dropout_rate)
  return blockwise.tiled_attention(query_BQHD, key_BKHD, value_BKHV, bias, mask, cfg,
                                   _kernels(bool(interpret),
                                            launch or DEFAULT_LAUNCH[value_network]),
                                   dropout_seed=dropout_seed)
