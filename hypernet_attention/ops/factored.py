"""HYLA's MLP value network through one scalar per (q, k) pair: big matmuls, no code transposes.

Why: at the synthetic tasks' sizes (T ~ 36, per-head widths D = V = 2..4) the reference
contracts the (B, H, Q, K) latent code twice, over heads with (b, k) as batch axes and over
keys with (b, q) as batch axes. On CPU that means two full transposes of the code and its
gradient and thousands of (36 x 16) x (16 x 4) matmuls: HYLA's training step took ~1.5x
softmax's for a few percent more arithmetic (experiments/results/training_throughput.md).

RMSHead divides all heads' scores of a pair by one number, and the paper's dropout drops whole
pairs, so the latent code is a_hqk = c_qk s_hqk with one scalar per pair,

  c_qk = keep_qk mask_qk / sqrt(mean_h s_hqk^2 + eps)   (rms_head; keep_qk mask_qk for linear)
  s_hqk = <q~_qh, k_kh> + bias_hqk,  q~ = q / sqrt(D).

Then, with x = (h, d) the flattened query/key width,
  hidden_qkv = phi(c_qk (sum_x q~_qx (k v)_kxv + sum_h bias_hqk v_khv))
  y_qhv = sum_d q~_qhd sum_k k_khd (c z)_qkv + sum_k bias_hqk (c z)_qkv,   z = hidden,
which are per-example matmuls with contraction H*D or K and (K, V) or (Q, V) wide outputs;
the bias terms fold the batch into the output width (the bias is shared by the batch). The
code is never laid out per (b, k) or per (b, q); only the scores (for the RMS) are
materialized, once, as in softmax attention. It costs D times the reference's multiply-adds
in the value network, so it only pays for narrow heads (`dispatch.FACTORED_MAX_HEAD_DIM`).

Needs a mask that is the same for every head (it zeroes whole pairs); `dispatch` sends other masks
to the reference. Shape letters: B batch, Q / K positions, H heads, D / V widths, X = H * D.
"""

from __future__ import annotations

import math
from typing import Optional

import jax
import jax.numpy as jnp

from hypernet_attention.ops import dropout
from hypernet_attention.ops import reference

# What this factorization computes (`reference.Computes`): per-pair normalizations only.
COMPUTES = reference.Computes("factored", ("rms_head", "linear"), ("mlp",))


def supports(normalization: str, value_network: str, mask: Optional[jax.Array],
             bias: Optional[jax.Array]) -> bool:
  """Whether this factorization computes the call: per-pair normalization, MLP value
  network, a mask without a head axis (broadcastable to (B, 1, Q, K)) and a bias without a
  batch axis (broadcastable to (1, H, Q, K))."""
  head_free = mask is None or mask.ndim < 3 or mask.shape[-3] == 1
  batch_free = bias is None or bias.ndim < 4 or bias.shape[0] == 1
  return COMPUTES.covers(normalization, value_network) and head_free and batch_free


def _pair_scale(shape_BQK, scores_BHQK, mask, eps, dropout_rate, dropout_seed):
  """c_qk (B, Q, K): 1 / RMS over heads (1 without scores: linear normalization), times the
  pair's mask and dropout keep."""
  batch, q_len, k_len = shape_BQK
  valid_BQK = None
  if mask is not None:
    valid_BQK = jnp.broadcast_to(mask, (batch, 1, q_len, k_len))[:, 0]
  if scores_BHQK is not None:
    ms_BQK = jnp.mean(jnp.square(scores_BHQK), axis=1)
    if valid_BQK is not None:  # A masked pair's scores may be huge; its code is 0 anyway.
      ms_BQK = jnp.where(valid_BQK, ms_BQK, 1.0)
    scale_BQK = jax.lax.rsqrt(ms_BQK + eps)
  else:
    scale_BQK = jnp.ones(shape_BQK, jnp.float32)
  if valid_BQK is not None:
    scale_BQK = jnp.where(valid_BQK, scale_BQK, 0.0)
  if dropout_rate:
    keep_QK = dropout.grid_keep_scale(dropout_seed, q_len, k_len, dropout_rate)
    scale_BQK = scale_BQK * keep_QK.astype(scale_BQK.dtype)
  return scale_BQK


def attention(query_BQHD: jax.Array, key_BKHD: jax.Array, value_BKHV: jax.Array, *,
              bias: Optional[jax.Array] = None, mask: Optional[jax.Array] = None,
              normalization: str = "rms_head", value_network: str = "mlp", activation: str = "relu",
              eps: float = reference.RMS_HEAD_EPS, dropout_rate: float = 0.0,
              dropout_seed: Optional[jax.Array] = None) -> jax.Array:
  """`reference.attention`'s contract for the calls `supports` accepts; (B, Q, H, V)."""
  reference.check_operands(query_BQHD, key_BKHD, value_BKHV, bias=bias, mask=mask, eps=eps)
  COMPUTES.check(normalization, value_network)
  if not supports(normalization, value_network, mask, bias):
    shape = lambda x: None if x is None else tuple(x.shape)
    raise ValueError(f"factored attention got mask shape {shape(mask)}, bias shape "
                     f"{shape(bias)}; allowed: a mask without a head axis and a bias without "
                     "a batch axis.")
  key_BKHD, value_BKHV, poisoned_BQ = reference.isolate_nonfinite(
      key_BKHD, value_BKHV, mask, query_BQHD.shape[1])
  phi = reference.get_activation(activation)
  out_dtype = query_BQHD.dtype
  dtype = jnp.promote_types(out_dtype, jnp.float32)
  batch, q_len, heads, depth = query_BQHD.shape
  k_len, v_width = key_BKHD.shape[1], value_BKHV.shape[-1]
  q_BQHD = query_BQHD.astype(dtype) / math.sqrt(depth)
  k_BKHD, v_BKHV = key_BKHD.astype(dtype), value_BKHV.astype(dtype)
  bias_HQK = None
  if bias is not None:
    bias_HQK = jnp.broadcast_to(bias.astype(dtype), (1, heads, q_len, k_len))[0]
  scores_BHQK = None
  # Materialized once, for the RMS only; linear needs none (`supports` refused the rest).
  if normalization == "rms_head":
    scores_BHQK = jnp.einsum("bqhd,bkhd->bhqk", q_BQHD, k_BKHD)
    if bias_HQK is not None:
      scores_BHQK = reference.add_bias(scores_BHQK, bias_HQK[None])
  scale_BQK1 = _pair_scale((batch, q_len, k_len), scores_BHQK, mask, eps, dropout_rate,
                           dropout_seed)[..., None].astype(dtype)
  # First generated layer: sum_x q~_qx (k v)_kxv, one (Q, X) x (K*V, X)^T matmul per
  # example. The outer product is laid out (k, v)-major, x minor: it is built from k and v
  # without moving k's positions, and XLA keeps this one layout for the forward and the
  # backward (an (X, K*V) layout made XLA build both: 5-9% of the op at SRAVEN shapes).
  kv_BNX = jnp.einsum("bkhd,bkhv->bkvhd", k_BKHD, v_BKHV).reshape(
      batch, k_len * v_width, heads * depth)
  pre_BQKV = jnp.einsum("bqx,bnx->bqn", q_BQHD.reshape(batch, q_len, -1), kv_BNX).reshape(
      batch, q_len, k_len, v_width)
  if bias_HQK is not None:  # Batch folded into the output width.
    pre_BQKV = pre_BQKV + jnp.einsum("hqk,bkhv->bqkv", bias_HQK, v_BKHV)
  weighted_BQKV = scale_BQK1 * phi(scale_BQK1 * pre_BQKV)  # (c z)_qkv
  # Second generated layer: sum_d q~_qhd sum_k k_kx (c z)_qkv.
  read_BQXV = jnp.einsum("bkx,bqkv->bqxv", k_BKHD.reshape(batch, k_len, -1), weighted_BQKV)
  out_BQHV = jnp.einsum("bqhd,bqhdv->bqhv", q_BQHD,
                        read_BQXV.reshape(batch, q_len, heads, depth, v_width))
  if bias_HQK is not None:
    out_BQHV = out_BQHV + jnp.einsum("hqk,bqkv->bqhv", bias_HQK, weighted_BQKV)
  return reference.reveal_nonfinite(out_BQHV.astype(out_dtype), poisoned_BQ)
