"""Blockwise attention in pure JAX: tiles of (queries x keys), rematerialized backward.

Why it is cheaper than the reference: the reference holds the (B, H, Q, K) latent code and,
for the MLP value networks, the (B, Q, K, V) hidden activations z for the whole sequence,
and autodiff keeps them for the backward pass. Here a loop over query tiles runs an inner
loop over key tiles, so only one (B, H, bq, bk) code tile and one (B, bq, bk, V) hidden tile
exist at a time; a custom VJP recomputes them tile by tile in the backward pass instead of
storing them. Causal attention skips the key tiles that lie entirely in the future.

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

import dataclasses
import functools
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from hypernet_attention.ops import dropout
from hypernet_attention.ops import reference
from hypernet_attention.ops import tiling

DEFAULT_BLOCK_Q = 128
DEFAULT_BLOCK_K = 128


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


def tile_scores(q_BHqD, k_BHkD, bias_tile, cfg):
  s = jnp.einsum("bhqd,bhkd->bhqk", q_BHqD, k_BHkD,
                 preferred_element_type=cfg.compute_dtype)
  s = s * cfg.scale
  if bias_tile is not None:
    s = s + bias_tile.astype(cfg.compute_dtype)
  return s


def tile_code(s_BHqk, valid, lse_BHq, cfg):
  """Latent code tile a (B, H, bq, bk); masked pairs exactly 0."""
  if cfg.normalization == "softmax":
    logits = jnp.where(valid, s_BHqk - lse_BHq[..., None], -jnp.inf)
    return jnp.exp(logits)
  s0 = jnp.where(valid, s_BHqk, 0.0)
  if cfg.normalization == "linear":
    return s0
  return s0 * jax.lax.rsqrt(jnp.mean(jnp.square(s0), axis=1, keepdims=True) + cfg.eps)


def tile_dropout(q_start, k_start, seed, cfg):
  """(bq, bk) keep/(1-rate) of a tile, or None without dropout (`dropout.py`)."""
  if not cfg.dropout_rate:
    return None
  return dropout.grid_keep_scale(seed, cfg.block_q, cfg.block_k, cfg.dropout_rate,
                                 q_start, k_start).astype(cfg.compute_dtype)


def _drop(a_BHqk, drop):
  return a_BHqk if drop is None else a_BHqk * drop


def tile_code_grad(s_BHqk, a_BHqk, da_BHqk, valid, row_BHq, cfg):
  """ds from da through the normalization. `row_BHq` is softmax's sum_k a da."""
  if cfg.normalization == "softmax":
    return a_BHqk * (da_BHqk - row_BHq[..., None])
  if cfg.normalization == "linear":
    return jnp.where(valid, da_BHqk, 0.0)
  s0 = jnp.where(valid, s_BHqk, 0.0)
  r = jax.lax.rsqrt(jnp.mean(jnp.square(s0), axis=1, keepdims=True) + cfg.eps)
  ds = r * da_BHqk - s0 * r**3 * jnp.mean(da_BHqk * s0, axis=1, keepdims=True)
  return jnp.where(valid, ds, 0.0)


def _hidden(a_BHqk, v_BHkV, cfg):
  u_BqkV = jnp.einsum("bhqk,bhkv->bqkv", a_BHqk, v_BHkV)
  return u_BqkV, reference.get_activation(cfg.activation)(u_BqkV)


def tile_value(a_BHqk, v_BHkV, cfg):
  """Contribution of one key tile to the output, (B, H, bq, V)."""
  if cfg.value_network == "linear":
    return jnp.einsum("bhqk,bhkv->bhqv", a_BHqk, v_BHkV)
  _, z_BqkV = _hidden(a_BHqk, v_BHkV, cfg)
  return jnp.einsum("bhqk,bqkv->bhqv", a_BHqk, z_BqkV)


def tile_value_grad(a_BHqk, v_BHkV, dy_BHqV, cfg, need_dv=True):
  """(da (B, H, bq, bk), dv (B, H, bk, V) or None) of one tile."""
  if cfg.value_network == "linear":
    da = jnp.einsum("bhqv,bhkv->bhqk", dy_BHqV, v_BHkV)
    dv = jnp.einsum("bhqk,bhqv->bhkv", a_BHqk, dy_BHqV) if need_dv else None
    return da, dv
  phi = reference.get_activation(cfg.activation)
  u_BqkV = jnp.einsum("bhqk,bhkv->bqkv", a_BHqk, v_BHkV)
  z_BqkV, phi_vjp = jax.vjp(phi, u_BqkV)
  dz_BqkV = jnp.einsum("bhqk,bhqv->bqkv", a_BHqk, dy_BHqV)
  (du_BqkV,) = phi_vjp(dz_BqkV)
  da = (jnp.einsum("bhqv,bqkv->bhqk", dy_BHqV, z_BqkV)
        + jnp.einsum("bqkv,bhkv->bhqk", du_BqkV, v_BHkV))
  dv = jnp.einsum("bhqk,bqkv->bhkv", a_BHqk, du_BqkV) if need_dv else None
  return da, dv


# ------------------------------------------------------------------------ passes


def _q_tile(x_BHTX, qi, cfg):
  return jax.lax.dynamic_slice_in_dim(x_BHTX, qi * cfg.block_q, cfg.block_q, axis=2)


def _k_tile(x_BHTX, kj, cfg):
  return jax.lax.dynamic_slice_in_dim(x_BHTX, kj * cfg.block_k, cfg.block_k, axis=2)


def _tile_setup(q_BHQD, k_BHKD, bias4, mask4, qi, kj, cfg):
  """Scores and validity of tile (qi, kj)."""
  q_start, k_start = qi * cfg.block_q, kj * cfg.block_k
  valid = tile_mask(q_start, k_start, tiling.pair_tile(mask4, q_start, k_start, cfg), cfg)
  s = tile_scores(_q_tile(q_BHQD, qi, cfg), _k_tile(k_BHKD, kj, cfg),
                  tiling.pair_tile(bias4, q_start, k_start, cfg), cfg)
  return s, valid


def _tile_drop(seed, qi, kj, cfg):
  return tile_dropout(qi * cfg.block_q, kj * cfg.block_k, seed, cfg)


def _logsumexp_rows(q_BHQD, k_BHKD, bias4, mask4, qi, cfg):
  """Softmax statistics of query tile qi over its visible keys: (B, H, bq)."""
  batch, heads = q_BHQD.shape[:2]

  def body(kj, carry):
    m_prev, l_prev = carry
    s, valid = _tile_setup(q_BHQD, k_BHKD, bias4, mask4, qi, kj, cfg)
    s = jnp.where(valid, s, -jnp.inf)
    m_next = jnp.maximum(m_prev, jnp.max(s, axis=-1))
    m_safe = jnp.where(jnp.isfinite(m_next), m_next, 0.0)
    l_next = l_prev * jnp.exp(m_prev - m_safe) + jnp.sum(jnp.exp(s - m_safe[..., None]), -1)
    return m_next, l_next

  init = (jnp.full((batch, heads, cfg.block_q), -jnp.inf, cfg.compute_dtype),
          jnp.zeros((batch, heads, cfg.block_q), cfg.compute_dtype))
  m, l = jax.lax.fori_loop(0, tiling.causal_k_blocks(qi, cfg), body, init)
  return jnp.where(l > 0, jnp.where(jnp.isfinite(m), m, 0.0) + jnp.log(l), -jnp.inf)


def _forward(q_BHQD, k_BHKD, v_BHKV, bias4, mask4, seed, cfg):
  """Returns (out (B, H, Qp, V) float32, lse (B, H, Qp) or None)."""
  batch, heads = q_BHQD.shape[:2]
  v_dim = v_BHKV.shape[-1]

  def q_block(qi):
    lse = None
    if cfg.normalization == "softmax":
      lse = _logsumexp_rows(q_BHQD, k_BHKD, bias4, mask4, qi, cfg)

    def body(kj, acc):
      s, valid = _tile_setup(q_BHQD, k_BHKD, bias4, mask4, qi, kj, cfg)
      a = _drop(tile_code(s, valid, lse, cfg), _tile_drop(seed, qi, kj, cfg))
      return acc + tile_value(a, _k_tile(v_BHKV, kj, cfg).astype(cfg.compute_dtype), cfg)

    acc = jnp.zeros((batch, heads, cfg.block_q, v_dim), cfg.compute_dtype)
    acc = jax.lax.fori_loop(0, tiling.causal_k_blocks(qi, cfg), body, acc)
    return acc, (lse if lse is not None else jnp.zeros((), cfg.compute_dtype))

  out, lse = jax.lax.map(q_block, jnp.arange(cfg.num_q_blocks))
  out_BHQV = jnp.moveaxis(out, 0, 2).reshape(batch, heads, cfg.q_padded, v_dim)
  if cfg.normalization != "softmax":
    return out_BHQV, None
  return out_BHQV, jnp.moveaxis(lse, 0, 2).reshape(batch, heads, cfg.q_padded)


def _softmax_row_stat(q_BHQD, k_BHKD, v_BHKV, bias4, mask4, seed, lse, out_BHQV, dy_BHQV,
                      cfg):
  """sum_k a_hqk da_hqk per (B, H, Q): the softmax backward's row term. With dropout
  (keep scale m) the value network sees m a, so da = m da' and sum_k a da = sum_k (m a) da'."""
  if cfg.value_network == "linear":  # sum_k a m <dy, v_k> = <dy, y>.
    return jnp.sum(dy_BHQV * out_BHQV, axis=-1)
  batch, heads = q_BHQD.shape[:2]

  def q_block(qi):
    dy = _q_tile(dy_BHQV, qi, cfg)
    lse_q = jax.lax.dynamic_slice_in_dim(lse, qi * cfg.block_q, cfg.block_q, axis=2)

    def body(kj, acc):
      s, valid = _tile_setup(q_BHQD, k_BHKD, bias4, mask4, qi, kj, cfg)
      a = _drop(tile_code(s, valid, lse_q, cfg), _tile_drop(seed, qi, kj, cfg))
      v_tile = _k_tile(v_BHKV, kj, cfg).astype(cfg.compute_dtype)
      da, _ = tile_value_grad(a, v_tile, dy, cfg, need_dv=False)
      return acc + jnp.sum(a * da, axis=-1)

    acc = jnp.zeros((batch, heads, cfg.block_q), cfg.compute_dtype)
    return jax.lax.fori_loop(0, tiling.causal_k_blocks(qi, cfg), body, acc)

  rows = jax.lax.map(q_block, jnp.arange(cfg.num_q_blocks))
  return jnp.moveaxis(rows, 0, 2).reshape(batch, heads, cfg.q_padded)


def _reduce_to(x, shape):
  """Sums a tile cotangent over the axes that `shape` broadcasts (size 1)."""
  axes = tuple(i for i, (n, m) in enumerate(zip(shape, x.shape)) if n == 1 and m != 1)
  return jnp.sum(x, axis=axes, keepdims=True) if axes else x


def _backward(q_BHQD, k_BHKD, v_BHKV, bias4, mask4, seed, lse, row, dy_BHQV, cfg):
  """Key tiles outside, query tiles inside: dk, dv stay in the carry of the inner loop."""
  batch, heads, _, depth = q_BHQD.shape
  v_dim = v_BHKV.shape[-1]

  def k_block(carry, kj):
    dq_BHQD, dbias4 = carry
    k_tile = _k_tile(k_BHKD, kj, cfg).astype(cfg.compute_dtype)
    v_tile = _k_tile(v_BHKV, kj, cfg).astype(cfg.compute_dtype)

    def body(qi, inner):
      dq_BHQD, dbias4, dk, dv = inner
      q_start, k_start = qi * cfg.block_q, kj * cfg.block_k
      q_tile = _q_tile(q_BHQD, qi, cfg).astype(cfg.compute_dtype)
      s, valid = _tile_setup(q_BHQD, k_BHKD, bias4, mask4, qi, kj, cfg)
      lse_q = row_q = None
      if cfg.normalization == "softmax":
        lse_q = jax.lax.dynamic_slice_in_dim(lse, q_start, cfg.block_q, axis=2)
        row_q = jax.lax.dynamic_slice_in_dim(row, q_start, cfg.block_q, axis=2)
      a = tile_code(s, valid, lse_q, cfg)
      drop = _tile_drop(seed, qi, kj, cfg)
      da, dv_tile = tile_value_grad(_drop(a, drop), v_tile, _q_tile(dy_BHQV, qi, cfg), cfg)
      ds = tile_code_grad(s, a, _drop(da, drop), valid, row_q, cfg)
      dk = dk + cfg.scale * jnp.einsum("bhqk,bhqd->bhkd", ds, q_tile)
      dq_tile = cfg.scale * jnp.einsum("bhqk,bhkd->bhqd", ds, k_tile)
      dq_BHQD = jax.lax.dynamic_update_slice_in_dim(
          dq_BHQD, _q_tile(dq_BHQD, qi, cfg) + dq_tile, q_start, axis=2)
      if dbias4 is not None:
        starts = (0, 0, 0 if dbias4.shape[2] == 1 else q_start,
                  0 if dbias4.shape[3] == 1 else k_start)
        old = tiling.pair_tile(dbias4, q_start, k_start, cfg)
        dbias4 = jax.lax.dynamic_update_slice(dbias4, old + _reduce_to(ds, old.shape), starts)
      return dq_BHQD, dbias4, dk, dv + dv_tile

    zeros = lambda width: jnp.zeros((batch, heads, cfg.block_k, width), cfg.compute_dtype)
    init = (dq_BHQD, dbias4, zeros(depth), zeros(v_dim))
    dq_BHQD, dbias4, dk, dv = jax.lax.fori_loop(
        tiling.causal_first_q_block(kj, cfg), cfg.num_q_blocks, body, init)
    return (dq_BHQD, dbias4), (dk, dv)

  init = (jnp.zeros(q_BHQD.shape, cfg.compute_dtype),
          None if bias4 is None else jnp.zeros(bias4.shape, cfg.compute_dtype))
  (dq, dbias4), (dk, dv) = jax.lax.scan(k_block, init, jnp.arange(cfg.num_k_blocks))
  dk = jnp.moveaxis(dk, 0, 2).reshape(batch, heads, cfg.k_padded, depth)
  dv = jnp.moveaxis(dv, 0, 2).reshape(batch, heads, cfg.k_padded, v_dim)
  return dq, dk, dv, dbias4


# ------------------------------------------------------------------------ custom VJP


def _to_heads_major(x_BTHX, length):
  x = jnp.swapaxes(x_BTHX, 1, 2)
  return tiling.pad_axis(x, 2, length) if x.shape[2] != length else x


def _prepare(query, key, value, bias, mask, cfg):
  q = _to_heads_major(query, cfg.q_padded)
  k = _to_heads_major(key, cfg.k_padded)
  v = _to_heads_major(value, cfg.k_padded)
  full = (query.shape[0], query.shape[2], cfg.q_len, cfg.k_len)
  bias4 = tiling.pad_pair_operand(tiling.as_rank4(bias, "bias", full), cfg, 0)
  mask4 = tiling.as_rank4(mask, "mask", full)
  mask4 = None if mask4 is None else tiling.pad_pair_operand(mask4.astype(bool), cfg, False)
  return q, k, v, bias4, mask4


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _attention(query, key, value, bias, mask, seed, cfg, kernels):
  out, _ = _attention_fwd(query, key, value, bias, mask, seed, cfg, kernels)
  return out


def _attention_fwd(query, key, value, bias, mask, seed, cfg, kernels):
  q, k, v, bias4, mask4 = _prepare(query, key, value, bias, mask, cfg)
  out_BHQV, lse = kernels.forward(q, k, v, bias4, mask4, seed, cfg)
  out = jnp.swapaxes(out_BHQV[:, :, :cfg.q_len], 1, 2).astype(query.dtype)
  keep_out = cfg.normalization == "softmax" and cfg.value_network == "linear"
  return out, (query, key, value, bias, mask, seed, out_BHQV if keep_out else None, lse)


def _attention_bwd(cfg, kernels, residuals, dout_BQHV):
  query, key, value, bias, mask, seed, out_BHQV, lse = residuals
  q, k, v, bias4, mask4 = _prepare(query, key, value, bias, mask, cfg)
  dy = _to_heads_major(dout_BQHV.astype(cfg.compute_dtype), cfg.q_padded)
  row = None
  if cfg.normalization == "softmax":
    row = _softmax_row_stat(q, k, v, bias4, mask4, seed, lse, out_BHQV, dy, cfg)
  dq, dk, dv, dbias4 = kernels.backward(q, k, v, bias4, mask4, seed, lse, row, dy, cfg)
  unpad = lambda x, n, like: jnp.swapaxes(x[:, :, :n], 1, 2).astype(like.dtype)
  dbias = None
  if bias is not None:
    dbias4 = dbias4[:, :, :bias4.shape[2] if bias4.shape[2] == 1 else cfg.q_len,
                    :bias4.shape[3] if bias4.shape[3] == 1 else cfg.k_len]
    dbias = dbias4.reshape(bias.shape).astype(bias.dtype)
  return (unpad(dq, cfg.q_len, query), unpad(dk, cfg.k_len, key),
          unpad(dv, cfg.k_len, value), dbias, None, None)


_attention.defvjp(_attention_fwd, _attention_bwd)


@dataclasses.dataclass(frozen=True)
class Kernels:
  """The tiled passes behind the custom VJP (hashable: a nondiff argument).

  forward(q, k, v, bias4, mask4, seed, cfg) -> (out (B, H, Qp, V) f32, lse (B, H, Qp) | None);
  backward(q, k, v, bias4, mask4, seed, lse, row, dy, cfg) -> (dq, dk, dv, dbias4 | None),
  all heads-major, padded and float32. Inputs are heads-major and padded (`_prepare`);
  `seed` is the int32 dropout seed (None without dropout).
  """
  forward: Callable = _forward
  backward: Callable = _backward


def tiled_attention(query, key, value, bias, mask, cfg, kernels: Kernels = Kernels(),
                    dropout_seed=None):
  """Runs the custom-VJP op with the given forward/backward passes (Pallas reuses this)."""
  if mask is not None and mask.dtype != jnp.bool_:
    mask = mask.astype(bool)
  seed = None
  if cfg.dropout_rate:
    if dropout_seed is None:
      raise ValueError(f"dropout_rate={cfg.dropout_rate} needs dropout_seed (an int32 scalar).")
    seed = jnp.asarray(dropout_seed, jnp.int32)
  return _attention(query, key, value, bias, mask, seed, cfg, kernels)


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
    block_q: int = DEFAULT_BLOCK_Q,
    block_k: int = DEFAULT_BLOCK_K,
    dropout_rate: float = 0.0,
    dropout_seed: Optional[jax.Array] = None,
) -> jax.Array:
  """Same contract as `reference.attention` (plus `is_causal`, tile sizes); no deep_mlp."""
  cfg = tiling.make_config(
      query_BQHD.shape[1], key_BKHD.shape[1], query_BQHD.shape[-1],
      normalization=normalization, value_network=value_network, activation=activation,
      eps=eps, is_causal=is_causal, block_q=block_q, block_k=block_k,
      dtype=query_BQHD.dtype, dropout_rate=dropout_rate)
  return tiled_attention(query_BQHD, key_BKHD, value_BKHV, bias, mask, cfg,
                         dropout_seed=dropout_seed)
