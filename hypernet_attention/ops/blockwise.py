"""Blockwise attention in pure JAX: tiles of (queries x keys), rematerialized backward.

Why it is cheaper than the reference: the reference holds the (B, H, Q, K) latent code and,
for the MLP value networks, the (B, Q, K, V) hidden activations z for the whole sequence,
and autodiff keeps them for the backward pass. Here one scan walks the (query tile, key
tile) pairs, so only one (B, H, bq, bk) code tile and one (B, bq, bk, V) hidden tile exist
at a time; a custom VJP recomputes them tile by tile in the backward pass instead of storing
them. Causal attention skips the key tiles that lie entirely in the future.

For accelerators: the schedule of tiles is static (`tiling.tile_schedule` says why). And the
per-pair tensors take the inputs' dtype: with bf16 inputs the code operands and the (B, bq, bk, V)
hidden tensors u, z, dz, du (and phi, exact in bf16 for ReLU) are bf16, the contractions accumulate
in float32, and the scores, RMSHead, softmax statistics, the code's gradient and every accumulator
(output, dq, dk, dv, dbias) stay float32.

RMSHead and linear normalization are local to a (q, k) pair, so a tile needs nothing from
other tiles. Softmax needs the row statistic logsumexp over keys first: the forward then
takes two passes (statistics, then output), which also makes softmax work with the MLP
value networks, whose nonlinearity rules out flash attention's running rescaling.

Per tile, with a the code, u = sum_h a_h v_h, z = phi(u) (mlp) and dy the output cotangent:
  da_hqk = <dy_qh, z_qk> + <phi'(u_qk) * dz_qk, v_kh>,   dz_qk = sum_h a_hqk dy_qh
  dv_kh  = sum_q a_hqk phi'(u_qk) * dz_qk  (+ sum_q a_hqk dy_qh for the linear network)
then ds from da through the normalization, and dq, dk, dbias from ds.
Dropout (`dropout.py`) multiplies each tile's code by its recomputed keep/(1-rate) mask m
before the value network; the backward takes da' for the dropped code and uses da = m da'.

Shape letters: B batch, H heads, Q / K query / key positions, D query/key width, V value width.
Tile letters: q / k for the positions inside one tile.
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from hypernet_attention.ops import dropout
from hypernet_attention.ops import reference
from hypernet_attention.ops import tiling

DEFAULT_BLOCK_Q = 128
DEFAULT_BLOCK_K = 128
# What the tiles compute (`reference.Computes`); deep_mlp and anything else is the reference's.
COMPUTES = reference.Computes("blockwise", ("softmax", "linear", "rms_head"), ("linear", "mlp"))


# ------------------------------------------------------------------------ per-tile math


def tile_mask(q_start, k_start, mask_tile, cfg: tiling.TileConfig):
  """Boolean (1|B, 1|H, bq, bk) validity of a tile: padding keys, causal, user mask."""
  q_pos = q_start + jax.lax.broadcasted_iota(jnp.int32, (cfg.block_q, cfg.block_k), 0)
  k_pos = k_start + jax.lax.broadcasted_iota(jnp.int32, (cfg.block_q, cfg.block_k), 1)
  valid = k_pos < cfg.k_len
  if cfg.is_causal:
    valid = jnp.logical_and(valid, q_pos >= k_pos)
  valid = valid[None, None]
  if mask_tile is not None:
    valid = jnp.logical_and(valid, mask_tile)
  return valid


def _contract(spec, x, y, cfg, out_dtype=None):
  """A contraction of per-pair operands, returned in `out_dtype` (default `compute_dtype`).

  A (B, bq, bk, V) per-pair tensor (V times the score tile) is declared `pair_dtype` -> itself,
  never as a float32 result rounded afterwards: that float32 tensor is what costs the HBM
  traffic, and XLA:GPU only avoids it when the dot itself outputs bf16. GPUs (cuBLAS, Triton)
  and TPUs accumulate such a dot in float32; XLA:CPU computes it in float32 and rounds it.
  """
  return jnp.einsum(spec, x.astype(cfg.pair_dtype), y.astype(cfg.pair_dtype),
                    preferred_element_type=out_dtype or cfg.compute_dtype)


def tile_scores(q_BHqD, k_BHkD, bias_tile, cfg):
  s = _contract("bhqd,bhkd->bhqk", q_BHqD, k_BHkD, cfg) * cfg.scale
  if bias_tile is not None:
    s = s + bias_tile.astype(cfg.compute_dtype)
  return s


def tile_code(s_BHqk, valid, lse_BHq, cfg):
  """Latent code tile a (B, H, bq, bk) in `compute_dtype`; masked pairs exactly 0."""
  if cfg.normalization == "softmax":
    logits = jnp.where(valid, s_BHqk - lse_BHq[..., None], -jnp.inf)
    return jnp.exp(logits)
  s0 = jnp.where(valid, s_BHqk, 0.0)
  if cfg.normalization == "linear":
    return s0
  if cfg.normalization == "rms_head":
    return s0 * jax.lax.rsqrt(jnp.mean(jnp.square(s0), axis=1, keepdims=True) + cfg.eps)
  raise ValueError(f"blockwise has no code for normalization={cfg.normalization!r}; it "
                   f"computes {COMPUTES.normalizations}.")


def _tile_drop(seed, qi, kj, cfg):
  """(bq, bk) keep/(1-rate) of tile (qi, kj), or None without dropout (`dropout.py`)."""
  if not cfg.dropout_rate:
    return None
  return dropout.grid_keep_scale(seed, cfg.block_q, cfg.block_k, cfg.dropout_rate,
                                 qi * cfg.block_q, kj * cfg.block_k).astype(cfg.compute_dtype)


def _drop(a_BHqk, drop):
  return a_BHqk if drop is None else a_BHqk * drop


def tile_code_grad(s_BHqk, a_BHqk, da_BHqk, valid, row_BHq, cfg):
  """ds from da through the normalization. `row_BHq` is softmax's sum_k a da."""
  if cfg.normalization == "softmax":
    return a_BHqk * (da_BHqk - row_BHq[..., None])
  if cfg.normalization == "linear":
    return jnp.where(valid, da_BHqk, 0.0)
  if cfg.normalization == "rms_head":
    s0 = jnp.where(valid, s_BHqk, 0.0)
    r = jax.lax.rsqrt(jnp.mean(jnp.square(s0), axis=1, keepdims=True) + cfg.eps)
    ds = r * da_BHqk - s0 * r**3 * jnp.mean(da_BHqk * s0, axis=1, keepdims=True)
    return jnp.where(valid, ds, 0.0)
  raise ValueError(f"blockwise has no gradient for normalization={cfg.normalization!r}; it "
                   f"computes {COMPUTES.normalizations}.")


def tile_value(a_BHqk, v_BHkV, cfg):
  """Contribution of one key tile to the output, (B, H, bq, V) in `compute_dtype`."""
  if cfg.value_network == "linear":
    return _contract("bhqk,bhkv->bhqv", a_BHqk, v_BHkV, cfg)
  if cfg.value_network == "mlp":
    phi = reference.get_activation(cfg.activation)  # In pair_dtype: exact for ReLU.
    z_BqkV = phi(_contract("bhqk,bhkv->bqkv", a_BHqk, v_BHkV, cfg, cfg.pair_dtype))
    return _contract("bhqk,bqkv->bhqv", a_BHqk, z_BqkV, cfg)
  raise ValueError(f"blockwise has no value network {cfg.value_network!r}; it computes "
                   f"{COMPUTES.value_networks}.")


def tile_value_grad(a_BHqk, v_BHkV, dy_BHqV, cfg, need_dv=True):
  """(da (B, H, bq, bk), dv (B, H, bk, V) or None) of one tile, in `compute_dtype`."""
  if cfg.value_network == "linear":
    da = _contract("bhqv,bhkv->bhqk", dy_BHqV, v_BHkV, cfg)
    dv = _contract("bhqk,bhqv->bhkv", a_BHqk, dy_BHqV, cfg) if need_dv else None
    return da, dv
  if cfg.value_network == "mlp":
    u_BqkV = _contract("bhqk,bhkv->bqkv", a_BHqk, v_BHkV, cfg, cfg.pair_dtype)
    z_BqkV, phi_vjp = jax.vjp(reference.get_activation(cfg.activation), u_BqkV)
    (du_BqkV,) = phi_vjp(_contract("bhqk,bhqv->bqkv", a_BHqk, dy_BHqV, cfg, cfg.pair_dtype))
    da = (_contract("bhqv,bqkv->bhqk", dy_BHqV, z_BqkV, cfg)
          + _contract("bqkv,bhkv->bhqk", du_BqkV, v_BHkV, cfg))
    dv = _contract("bhqk,bqkv->bhkv", a_BHqk, du_BqkV, cfg) if need_dv else None
    return da, dv
  raise ValueError(f"blockwise has no value network {cfg.value_network!r}; it computes "
                   f"{COMPUTES.value_networks}.")


# ------------------------------------------------------------------------ passes
#
# Every pass is one `lax.scan` over the static schedule `tiling.tile_schedule` (query-major in
# the forward, key-major in the backward), carrying whole-sequence accumulators that each
# step updates at its tile's rows.


def _q_tile(x_BHTX, qi, cfg):
  return jax.lax.dynamic_slice_in_dim(x_BHTX, qi * cfg.block_q, cfg.block_q, axis=2)


def _k_tile(x_BHTX, kj, cfg):
  return jax.lax.dynamic_slice_in_dim(x_BHTX, kj * cfg.block_k, cfg.block_k, axis=2)


def _add_at(x_BHTX, start, tile_BHtX):
  """x with `tile` added to its rows start:start+t along axis 2 (in place in a scan)."""
  old = jax.lax.dynamic_slice_in_dim(x_BHTX, start, tile_BHtX.shape[2], axis=2)
  return jax.lax.dynamic_update_slice_in_dim(x_BHTX, old + tile_BHtX, start, axis=2)


def _scan_tiles(body, init, cfg, key_major=False):
  """carry = body(carry, qi, kj) for every tile of the static schedule, in order."""
  count, ends, offsets = tiling.tile_schedule(cfg, key_major)
  # Indices in JAX's default int (int64 under x64), as Python ints become in the slices.
  int_ = jax.dtypes.canonicalize_dtype(jnp.int64)
  ends, offsets = ends.astype(int_), offsets.astype(int_)

  def step(carry, p):
    major, minor = tiling.schedule_tile(p, ends, offsets)
    return body(carry, *((minor, major) if key_major else (major, minor))), None

  carry, _ = jax.lax.scan(step, init, jnp.arange(count, dtype=int_))
  return carry


def _tile_setup(q_BHQD, k_BHKD, bias4, mask4, qi, kj, cfg):
  """Scores and validity of tile (qi, kj)."""
  q_start, k_start = qi * cfg.block_q, kj * cfg.block_k
  valid = tile_mask(q_start, k_start, tiling.pair_tile(mask4, q_start, k_start, cfg), cfg)
  s = tile_scores(_q_tile(q_BHQD, qi, cfg), _k_tile(k_BHKD, kj, cfg),
                  tiling.pair_tile(bias4, q_start, k_start, cfg), cfg)
  return s, valid


def _logsumexp_rows(q_BHQD, k_BHKD, bias4, mask4, cfg):
  """Softmax statistics of every query over its visible keys: (B, H, Qp)."""
  batch, heads = q_BHQD.shape[:2]

  def body(carry, qi, kj):
    m_all, l_all = carry
    m_prev, l_prev = _q_tile(m_all, qi, cfg), _q_tile(l_all, qi, cfg)
    s, valid = _tile_setup(q_BHQD, k_BHKD, bias4, mask4, qi, kj, cfg)
    s = jnp.where(valid, s, -jnp.inf)
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=-1))
    m_safe = jnp.where(jnp.isfinite(m_next), m_next, 0.0)
    l_next = l_prev * jnp.exp(m_prev - m_safe) + jnp.sum(jnp.exp(s - m_safe[..., None]), -1)
    start = qi * cfg.block_q
    return (jax.lax.dynamic_update_slice_in_dim(m_all, m_next, start, axis=2),
            jax.lax.dynamic_update_slice_in_dim(l_all, l_next, start, axis=2))

  shape = (batch, heads, cfg.q_padded)
  init = (jnp.full(shape, -jnp.inf, cfg.compute_dtype), jnp.zeros(shape, cfg.compute_dtype))
  m, l = _scan_tiles(body, init, cfg)
  return jnp.where(l > 0, jnp.where(jnp.isfinite(m), m, 0.0) + jnp.log(l), -jnp.inf)


def _forward(q_BHQD, k_BHKD, v_BHKV, bias4, mask4, seed, cfg):
  """Returns (out (B, H, Qp, V) float32, lse (B, H, Qp) or None)."""
  batch, heads = q_BHQD.shape[:2]
  lse = None
  if cfg.normalization == "softmax":
    lse = _logsumexp_rows(q_BHQD, k_BHKD, bias4, mask4, cfg)

  def body(out_BHQV, qi, kj):
    s, valid = _tile_setup(q_BHQD, k_BHKD, bias4, mask4, qi, kj, cfg)
    lse_q = None if lse is None else _q_tile(lse, qi, cfg)
    a = _drop(tile_code(s, valid, lse_q, cfg), _tile_drop(seed, qi, kj, cfg))
    return _add_at(out_BHQV, qi * cfg.block_q, tile_value(a, _k_tile(v_BHKV, kj, cfg), cfg))

  init = jnp.zeros((batch, heads, cfg.q_padded, v_BHKV.shape[-1]), cfg.compute_dtype)
  return _scan_tiles(body, init, cfg), lse


def _softmax_row_stat(q_BHQD, k_BHKD, v_BHKV, bias4, mask4, seed, lse, out_BHQV, dy_BHQV,
                      cfg):
  """sum_k a_hqk da_hqk per (B, H, Q): the softmax backward's row term. With dropout
  (keep scale m) the value network sees m a, so da = m da' and sum_k a da = sum_k (m a) da'."""
  if cfg.value_network == "linear":  # sum_k a m <dy, v_k> = <dy, y>.
    return jnp.sum(dy_BHQV.astype(cfg.compute_dtype) * out_BHQV, axis=-1)

  def body(rows_BHQ, qi, kj):
    s, valid = _tile_setup(q_BHQD, k_BHKD, bias4, mask4, qi, kj, cfg)
    a = _drop(tile_code(s, valid, _q_tile(lse, qi, cfg), cfg), _tile_drop(seed, qi, kj, cfg))
    da, _ = tile_value_grad(a, _k_tile(v_BHKV, kj, cfg), _q_tile(dy_BHQV, qi, cfg), cfg,
                            need_dv=False)
    return _add_at(rows_BHQ, qi * cfg.block_q, jnp.sum(a * da, axis=-1))

  init = jnp.zeros(lse.shape, cfg.compute_dtype)
  return _scan_tiles(body, init, cfg)


def _backward(q_BHQD, k_BHKD, v_BHKV, bias4, mask4, seed, lse, row, dy_BHQV, cfg):
  """Key-major schedule: consecutive steps share a key tile, whose dk, dv rows they update."""

  def body(carry, qi, kj):
    dq_BHQD, dk_BHKD, dv_BHKV, dbias4 = carry
    q_start, k_start = qi * cfg.block_q, kj * cfg.block_k
    s, valid = _tile_setup(q_BHQD, k_BHKD, bias4, mask4, qi, kj, cfg)
    lse_q = row_q = None
    if cfg.normalization == "softmax":
      lse_q, row_q = _q_tile(lse, qi, cfg), _q_tile(row, qi, cfg)
    a = tile_code(s, valid, lse_q, cfg)
    drop = _tile_drop(seed, qi, kj, cfg)
    da, dv_tile = tile_value_grad(_drop(a, drop), _k_tile(v_BHKV, kj, cfg),
                                  _q_tile(dy_BHQV, qi, cfg), cfg)
    ds = tile_code_grad(s, a, _drop(da, drop), valid, row_q, cfg)
    dk_tile = cfg.scale * _contract("bhqk,bhqd->bhkd", ds, _q_tile(q_BHQD, qi, cfg), cfg)
    dq_tile = cfg.scale * _contract("bhqk,bhkd->bhqd", ds, _k_tile(k_BHKD, kj, cfg), cfg)
    if dbias4 is not None:
      starts = (0, 0, 0 if dbias4.shape[2] == 1 else q_start,
                0 if dbias4.shape[3] == 1 else k_start)
      old = tiling.pair_tile(dbias4, q_start, k_start, cfg)
      dbias4 = jax.lax.dynamic_update_slice(
          dbias4, old + reference.sum_to_shape(ds, old.shape), starts)
    return (_add_at(dq_BHQD, q_start, dq_tile), _add_at(dk_BHKD, k_start, dk_tile),
            _add_at(dv_BHKV, k_start, dv_tile), dbias4)

  zeros = lambda x: jnp.zeros(x.shape, cfg.compute_dtype)
  init = (zeros(q_BHQD), zeros(k_BHKD), zeros(v_BHKV), None if bias4 is None else zeros(bias4))
  return _scan_tiles(body, init, cfg, key_major=True)


# ------------------------------------------------------------------------ custom VJP


def _to_heads_major(x_BTHX, length):
  return tiling.pad_axis(jnp.swapaxes(x_BTHX, 1, 2), 2, length)


def _prepare(query, key, value, bias, mask, cfg):
  q = _to_heads_major(query, cfg.q_padded)
  k = _to_heads_major(key, cfg.k_padded)
  v = _to_heads_major(value, cfg.k_padded)
  bias4 = tiling.pad_pair_operand(tiling.as_rank4(bias), cfg, 0)
  mask4 = tiling.pad_pair_operand(tiling.as_rank4(mask), cfg, False)
  return q, k, v, bias4, mask4


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _attention(query, key, value, bias, mask, seed, cfg):
  out, _ = _attention_fwd(query, key, value, bias, mask, seed, cfg)
  return out


def _attention_fwd(query, key, value, bias, mask, seed, cfg):
  q, k, v, bias4, mask4 = _prepare(query, key, value, bias, mask, cfg)
  out_BHQV, lse = _forward(q, k, v, bias4, mask4, seed, cfg)
  out = jnp.swapaxes(out_BHQV[:, :, :cfg.q_len], 1, 2).astype(query.dtype)
  keep_out = cfg.normalization == "softmax" and cfg.value_network == "linear"
  return out, (query, key, value, bias, mask, seed, out_BHQV if keep_out else None, lse)


def _attention_bwd(cfg, residuals, dout_BQHV):
  query, key, value, bias, mask, seed, out_BHQV, lse = residuals
  q, k, v, bias4, mask4 = _prepare(query, key, value, bias, mask, cfg)
  dy = _to_heads_major(dout_BQHV.astype(cfg.pair_dtype), cfg.q_padded)
  row = None
  if cfg.normalization == "softmax":
    row = _softmax_row_stat(q, k, v, bias4, mask4, seed, lse, out_BHQV, dy, cfg)
  dq, dk, dv, dbias4 = _backward(q, k, v, bias4, mask4, seed, lse, row, dy, cfg)
  unpad = lambda x, n, like: jnp.swapaxes(x[:, :, :n], 1, 2).astype(like.dtype)
  dbias = None
  if bias is not None:  # Slicing a broadcast (size-1) axis to :q_len keeps it size 1.
    dbias = dbias4[:, :, :cfg.q_len, :cfg.k_len].reshape(bias.shape).astype(bias.dtype)
  return (unpad(dq, cfg.q_len, query), unpad(dk, cfg.k_len, key),
          unpad(dv, cfg.k_len, value), dbias, None, None)


_attention.defvjp(_attention_fwd, _attention_bwd)


def attention(query_BQHD: jax.Array, key_BKHD: jax.Array, value_BKHV: jax.Array, *,
              bias: Optional[jax.Array] = None, mask: Optional[jax.Array] = None,
              is_causal: bool = False, normalization: str = "rms_head", value_network: str = "mlp",
              activation: str = "relu", eps: float = reference.RMS_HEAD_EPS,
              block_q: int = DEFAULT_BLOCK_Q, block_k: int = DEFAULT_BLOCK_K,
              dropout_rate: float = 0.0, dropout_seed: Optional[jax.Array] = None) -> jax.Array:
  """Same contract as `reference.attention` (plus `is_causal` and tile sizes); no deep_mlp."""
  reference.check_operands(query_BQHD, key_BKHD, value_BKHV, bias=bias, mask=mask, eps=eps)
  cfg = tiling.make_config(
      query_BQHD.shape[1], key_BKHD.shape[1], query_BQHD.shape[-1], computes=COMPUTES,
      normalization=normalization, value_network=value_network, activation=activation,
      eps=eps, is_causal=is_causal, block_q=block_q, block_k=block_k,
      dtype=query_BQHD.dtype, dropout_rate=dropout_rate)
  if cfg.dropout_rate and dropout_seed is None:
    raise ValueError(f"dropout_rate={cfg.dropout_rate} needs dropout_seed (an int32 scalar).")
  seed = jnp.asarray(dropout_seed, jnp.int32) if cfg.dropout_rate else None
  key_BKHD, value_BKHV, poisoned_BQ = reference.isolate_nonfinite(
      key_BKHD, value_BKHV, mask, cfg.q_len, is_causal)
  return reference.reveal_nonfinite(
      _attention(query_BQHD, key_BKHD, value_BKHV, bias, mask, seed, cfg), poisoned_BQ)
