"""Attention written explicitly as a hypernetwork (the paper's Eqs. 2-10).

`attention.MultiHeadAttention` computes attention the usual way. This module computes the
same function the way the paper reads it, from the same parameter tree:
  1. the latent code a_qk in R^H of every query-key pair (`latent_code`);
  2. a linear hypernetwork maps a_qk to the weights of a small value network
     (`generate_value_network`), e.g. W_qk = sum_h a_hqk W_h^out W_h^v for attention;
  3. that pair-specific network is applied to x_k and the results are summed over keys
     (`apply_value_network`).
It exists to prove the equivalence (tests) and to analyse trained models (`pair_weights`
returns the generated weights of chosen pairs); it materializes (B, Q, K, ...) weight
tensors and is slow on purpose.

Weights are matrices acting on column vectors, W x, as in the paper: a flax kernel (E, H, V) gives
W_h^v = kernel[:, h, :].T of shape (V, E). Biases are folded in by acting on the augmented input
[x_k; 1]: the value bias b_h^v becomes the last column of the generated first layer; the output bias
b^out is added once per query, outside the sum over keys (it is not generated).

Shape letters:
  B batch, Q query positions, K key positions, H heads, D per-head query/key width,
  V per-head value width, E input width, A = E + 1 (augmented input), O output width."""

from __future__ import annotations

import math
from typing import Any, Optional

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from hypernet_attention import attention as attention_lib
from hypernet_attention import errors
from hypernet_attention import positions
from hypernet_attention import presets
from hypernet_attention.ops import reference

Params = Any


def latent_code(module: attention_lib.MultiHeadAttention, params: Params, inputs_q: jax.Array,
                inputs_kv: Optional[jax.Array] = None, *, mask: Optional[jax.Array] = None,
                bias: Optional[jax.Array] = None, is_causal: bool = False) -> jax.Array:
  """The latent code a_hqk (B, H, Q, K): normalized scores, 0 on masked pairs.

  The normalization is the ops' entry (`reference.NORMALIZATIONS`), the code the module
  sows: each normalization is written once, and an unknown name is refused there."""
  params = nn.meta.unbox(params)
  errors.check_choice("position", module.position, presets.POSITIONS)
  inputs_kv = inputs_q if inputs_kv is None else inputs_kv
  chex.assert_rank([inputs_q, inputs_kv], 3)
  chex.assert_equal_shape_prefix([inputs_q, inputs_kv], 1)
  q_BQHD = jnp.einsum("bqe,ehd->bqhd", inputs_q, params["query"]["kernel"])
  k_BKHD = jnp.einsum("bke,ehd->bkhd", inputs_kv, params["key"]["kernel"])
  if module.use_bias:
    q_BQHD = q_BQHD + params["query"]["bias"]
    k_BKHD = k_BKHD + params["key"]["bias"]
  q_len, k_len = q_BQHD.shape[1], k_BKHD.shape[1]
  if module.position == "rope":
    q_BQHD = positions.apply_rope(q_BQHD, jnp.arange(q_len), module.rope_max_wavelength)
    k_BKHD = positions.apply_rope(k_BKHD, jnp.arange(k_len), module.rope_max_wavelength)
  reference.check_pair_operands((inputs_q.shape[0], module.num_heads, q_len, k_len), bias=bias,
                                mask=mask)
  scores_BHQK = jnp.einsum("bqhd,bkhd->bhqk", q_BQHD, k_BKHD) / math.sqrt(q_BQHD.shape[-1])
  if module.position == "t5":
    table_HN = params["relative_position"]["rel_embedding"]
    scores_BHQK = scores_BHQK + positions.relative_position_bias(
        table_HN, jnp.arange(q_len), jnp.arange(k_len), bidirectional=module.bidirectional,
        max_distance=module.max_distance, dtype=table_HN.dtype)
  if bias is not None:
    scores_BHQK = scores_BHQK + bias
  mask = reference.with_causal(mask, is_causal, q_len, k_len)
  chex.assert_shape(scores_BHQK, (inputs_q.shape[0], module.num_heads, q_len, k_len))
  return reference.normalize_scores(scores_BHQK, mask, module.preset.normalization, module.eps)


def _value_layer_HVA(params, use_bias):
  """Per-head first value layer [W_h^v | b_h^v], (H, V, A)."""
  kernel_EHV = params["value"]["kernel"]
  bias_HV = (params["value"]["bias"] if use_bias
             else jnp.zeros(kernel_EHV.shape[1:], kernel_EHV.dtype))
  return jnp.concatenate([jnp.transpose(kernel_EHV, (1, 2, 0)), bias_HV[..., None]], axis=-1)


def _value_network(module: attention_lib.MultiHeadAttention) -> str:
  network = module.preset.value_network
  errors.check_choice("value_network", network, attention_lib.VALUE_NETWORKS)
  return network


def _unwritten(network: str) -> errors.BadInput:
  """One of `attention.VALUE_NETWORKS` (the modules compute every one) not yet written here."""
  return errors.BadInput(f"value_network {network!r} has no explicit hypernetwork form yet; "
                         "allowed: those whose generated weights hypernetwork.py writes.")


def generate_value_network(module: attention_lib.MultiHeadAttention, params: Params,
                           code_BHQK: jax.Array) -> dict[str, jax.Array]:
  """The linear hypernetwork: latent codes -> weights of every pair's value network.

  Returns a dict of generated weights, each with leading (B, Q, K):
    linear (attention):  'W'  (O, A)  W_qk = sum_h a_hqk W_h^out [W_h^v | b_h^v]
    mlp (HYLA):          'W1' (V, A)  sum_h a_hqk [W_h^v | b_h^v]
                         'W2' (O, V)  sum_h a_hqk W_h^out
    deep_mlp (HYLA+):    'W1', 'W2' and 'W_hidden' (V, V) = sum_h a_hqk W_h^v'
    nonlinear_value:     'W2' (O, H*V) = [a_1qk W_1^out, ..., a_Hqk W_H^out], a read-out
                         over the fixed (not generated) features phi(W_h^v x + b_h^v)."""
  params = nn.meta.unbox(params)
  chex.assert_rank(code_BHQK, 4)
  chex.assert_axis_dimension(code_BHQK, 1, module.num_heads)
  value_HVA = _value_layer_HVA(params, module.use_bias)
  out_HOV = jnp.transpose(params["out"]["kernel"], (0, 2, 1))
  network = _value_network(module)
  if network == "linear":
    per_head_HOA = jnp.einsum("hov,hva->hoa", out_HOV, value_HVA)
    return {"W": jnp.einsum("bhqk,hoa->bqkoa", code_BHQK, per_head_HOA)}
  if network == "nonlinear_value":
    batch, _, q_len, k_len = code_BHQK.shape
    readout_BQKOHV = jnp.einsum("bhqk,hov->bqkohv", code_BHQK, out_HOV)
    return {"W2": readout_BQKOHV.reshape(batch, q_len, k_len, out_HOV.shape[1], -1)}
  if network not in ("mlp", "deep_mlp"):
    raise _unwritten(network)
  weights = {"W1": jnp.einsum("bhqk,hva->bqkva", code_BHQK, value_HVA),
             "W2": jnp.einsum("bhqk,hov->bqkov", code_BHQK, out_HOV)}
  if network == "deep_mlp":
    # Stored as [head, input unit, output unit]; as a matrix acting on z it is W'_h^T.
    hidden_HWV = jnp.transpose(params["value_hidden"], (0, 2, 1))
    weights["W_hidden"] = jnp.einsum("bhqk,hwv->bqkwv", code_BHQK, hidden_HWV)
  return weights


def apply_value_network(module: attention_lib.MultiHeadAttention, params: Params,
                        weights: dict[str, jax.Array], inputs_kv: jax.Array) -> jax.Array:
  """Applies every pair's generated network to x_k and sums over keys: (B, Q, O)."""
  params = nn.meta.unbox(params)
  chex.assert_rank(inputs_kv, 3)
  # Every generated weight is (B, Q, K, ...) over the same batch and keys as x_k.
  q_len = next(iter(weights.values())).shape[1]
  chex.assert_tree_shape_prefix(weights, (*inputs_kv.shape[:1], q_len, inputs_kv.shape[1]))
  phi = reference.get_activation(module.preset.activation)
  x_BKA = jnp.concatenate([inputs_kv, jnp.ones((*inputs_kv.shape[:-1], 1), inputs_kv.dtype)], -1)
  network = _value_network(module)
  if network == "linear":
    out_BQO = jnp.einsum("bqkoa,bka->bqo", weights["W"], x_BKA)
  elif network == "nonlinear_value":
    value_HVA = _value_layer_HVA(params, module.use_bias)
    features_BKF = phi(jnp.einsum("hva,bka->bkhv", value_HVA, x_BKA)).reshape(
        x_BKA.shape[0], x_BKA.shape[1], -1)
    out_BQO = jnp.einsum("bqkof,bkf->bqo", weights["W2"], features_BKF)
  elif network in ("mlp", "deep_mlp"):
    hidden_BQKV = phi(jnp.einsum("bqkva,bka->bqkv", weights["W1"], x_BKA))
    if network == "deep_mlp":
      hidden_BQKV = phi(jnp.einsum("bqkwv,bqkv->bqkw", weights["W_hidden"], hidden_BQKV))
    out_BQO = jnp.einsum("bqkov,bqkv->bqo", weights["W2"], hidden_BQKV)
  else:
    raise _unwritten(network)
  if module.use_bias:
    out_BQO = out_BQO + params["out"]["bias"]
  return out_BQO


def hypernetwork_attention(module: attention_lib.MultiHeadAttention, params: Params,
                           inputs_q: jax.Array, inputs_kv: Optional[jax.Array] = None, *,
                           mask: Optional[jax.Array] = None, bias: Optional[jax.Array] = None,
                           is_causal: bool = False) -> jax.Array:
  """`module.apply({'params': params}, ...)` computed as latent code -> W_qk -> sum_k."""
  inputs_kv = inputs_q if inputs_kv is None else inputs_kv
  code_BHQK = latent_code(module, params, inputs_q, inputs_kv, mask=mask, bias=bias,
                          is_causal=is_causal)
  weights = generate_value_network(module, params, code_BHQK)
  return apply_value_network(module, params, weights, inputs_kv)


def pair_weights(module: attention_lib.MultiHeadAttention, params: Params, inputs: jax.Array,
                 query_index: jax.Array, key_index: jax.Array, *,
                 mask: Optional[jax.Array] = None, is_causal: bool = False) -> dict[str, jax.Array]:
  """Generated value-network weights of chosen (q, k) pairs, for analysis.

  `query_index`, `key_index`: int arrays of the same shape P. Returns the dict of
  `generate_value_network` with leading (B, P) instead of (B, Q, K), plus the pairs'
  latent codes under 'latent_code' (B, P, H)."""
  code_BHQK = latent_code(module, params, inputs, mask=mask, is_causal=is_causal)
  code_BHP = code_BHQK[:, :, query_index, key_index]
  weights = generate_value_network(module, params, code_BHP[:, :, :, None])
  picked = {name: w[:, :, 0] for name, w in weights.items()}
  picked["latent_code"] = jnp.moveaxis(code_BHP, 1, -1)
  return picked
