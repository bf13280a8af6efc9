"""Reference attention: the paper's equations as plain einsums.

This is the ground truth that every fast implementation (factored, blockwise, Mosaic) is tested
against, and the path `MultiHeadAttention` takes when it must expose the latent code
(probing) or apply dropout to it. It materializes the (B, H, Q, K) latent code and, for the
MLP value networks, the (B, Q, K, V) hidden activations, so it is memory-hungry by design.

Shape letters:
  B batch, Q query positions, K key positions, H heads, D per-head query/key width,
  V per-head value width.

The computation, for every query q, key k and head h (the paper's Eqs. 2-7):
  s_hqk = <q_qh, k_kh> / sqrt(D) + bias_hqk
  a_hqk = normalize(s)_hqk                      # the latent code of pair (q, k)
  linear value network:   y_qh = sum_k a_hqk v_kh
  mlp value network:      z_qk = phi(sum_h a_hqk v_kh);  y_qh = sum_k a_hqk z_qk
  deep_mlp value network: z_qk = phi(sum_h a_hqk W'_h phi(sum_h a_hqk v_kh));
                          y_qh = sum_k a_hqk z_qk
The per-head output projection W_h^out is applied by the caller.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp

from hypernet_attention import errors
from hypernet_attention.ops import dropout

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "relu": jax.nn.relu, "gelu": jax.nn.gelu, "silu": jax.nn.silu, "sigmoid": jax.nn.sigmoid,
    "tanh": jnp.tanh, "identity": lambda x: x}
RMS_HEAD_EPS = 1e-6


def get_activation(name: str) -> Callable[[jax.Array], jax.Array]:
  errors.check_choice("activation", name, tuple(ACTIVATIONS))
  return ACTIVATIONS[name]


def attention_scores(query_BQHD: jax.Array, key_BKHD: jax.Array,
                     bias: Optional[jax.Array] = None) -> jax.Array:
  """Scaled dot-product scores (B, H, Q, K), plus `bias` (broadcastable to it)."""
  scores_BHQK = jnp.einsum("bqhd,bkhd->bhqk", query_BQHD / math.sqrt(query_BQHD.shape[-1]),
                           key_BKHD)
  return scores_BHQK if bias is None else add_bias(scores_BHQK, bias)


def add_bias(scores_BHQK: jax.Array, bias: jax.Array) -> jax.Array:
  """scores + bias; a bias shared by the batch gets its gradient's batch sum as a matmul.

  Why: the T5 position bias is (1, H, Q, K), so its gradient is the (B, H, Q, K) score
  gradient summed over the batch. XLA:CPU runs that reduction over the leading axis through
  YNNPACK ~6x slower than the same sum written as a ones-vector matmul
  (experiments/results/training_throughput.md). Other backends keep the plain sum: on TPU
  a float32 matmul may run in bfloat16 passes.
  """
  bias = bias.astype(scores_BHQK.dtype)
  if (jax.default_backend() != "cpu" or bias.ndim != scores_BHQK.ndim
      or bias.shape[0] != 1 or scores_BHQK.shape[0] == 1):
    return scores_BHQK + bias
  return _add_batch_shared_bias(scores_BHQK, bias)


@jax.custom_vjp
def _add_batch_shared_bias(scores_BHQK, bias_1HQK):
  return scores_BHQK + bias_1HQK


def _add_batch_shared_bias_fwd(scores_BHQK, bias_1HQK):
  return scores_BHQK + bias_1HQK, bias_1HQK


def _add_batch_shared_bias_bwd(bias_1HQK, grad_BHQK):
  batch = grad_BHQK.shape[0]
  grad_bias = jnp.dot(jnp.ones((batch,), grad_BHQK.dtype), grad_BHQK.reshape(batch, -1),
                      precision=jax.lax.Precision.HIGHEST).reshape((1,) + grad_BHQK.shape[1:])
  return grad_BHQK, sum_to_shape(grad_bias, bias_1HQK.shape)  # e.g. a bias shared by heads


_add_batch_shared_bias.defvjp(_add_batch_shared_bias_fwd, _add_batch_shared_bias_bwd)


def sum_to_shape(x: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """A cotangent summed over the axes that `shape` (of the same rank) broadcasts (size 1)."""
  axes = tuple(i for i, (n, m) in enumerate(zip(shape, x.shape)) if n == 1 and m != 1)
  return jnp.sum(x, axis=axes, keepdims=True) if axes else x


def _softmax(scores_BHQK, mask, eps):
  """Over keys; masked scores act as -inf and a fully masked row gives 0. float32 at least:
  bf16 exponentials lose the tail."""
  del eps
  dtype = jnp.promote_types(scores_BHQK.dtype, jnp.float32)
  s = scores_BHQK.astype(dtype)
  if mask is not None:
    s = jnp.where(mask, s, jnp.finfo(dtype).min)
  a = jax.nn.softmax(s, axis=-1)
  if mask is not None:
    a = jnp.where(mask, a, 0.0)
  return a.astype(scores_BHQK.dtype)


def _linear(scores_BHQK, mask, eps):
  """The identity (masked pairs 0)."""
  del eps
  return scores_BHQK if mask is None else jnp.where(mask, scores_BHQK, 0.0)


def _rms_head(scores_BHQK, mask, eps):
  """Each (q, k) pair's vector of scores across heads divided by its root mean square, with
  no learnable scale. Masked pairs are zeroed *before* the RMS so that a masked key never
  changes the code of an unmasked one (it cannot: RMSHead is local to the pair, but the
  zeroing keeps padded garbage out of the statistics)."""
  s = _linear(scores_BHQK, mask, eps)
  s32 = s.astype(jnp.promote_types(s.dtype, jnp.float32))
  ms = jnp.mean(jnp.square(s32), axis=1, keepdims=True)
  return (s32 * jax.lax.rsqrt(ms + eps)).astype(s.dtype)


# The spec of each normalization: (scores (B, H, Q, K), mask broadcast to it or None, eps)
# -> latent code (B, H, Q, K). A new entry runs on the reference everywhere until a fast
# path declares it (`Computes`).
NORMALIZATIONS: dict[str, Callable] = {"softmax": _softmax, "linear": _linear,
                                       "rms_head": _rms_head}


def normalize_scores(scores_BHQK: jax.Array, mask: Optional[jax.Array] = None,
                     normalization: str = "rms_head", eps: float = RMS_HEAD_EPS) -> jax.Array:
  """Turns scores into the latent code a_hqk (B, H, Q, K); masked pairs get exactly 0.

  `mask` is boolean, broadcastable to (B, H, Q, K), True where the query may attend.
  `NORMALIZATIONS[normalization]` says how.
  """
  errors.check_choice("normalization", normalization, NORMALIZATIONS)
  if mask is not None:
    mask = jnp.broadcast_to(mask, scores_BHQK.shape)
  return NORMALIZATIONS[normalization](scores_BHQK, mask, eps)


def apply_dropout(code_BHQK: jax.Array, rate: float, seed) -> jax.Array:
  """The latent code times `dropout.py`'s (Q, K) keep/(1-rate) mask (shared by B and H)."""
  dropout.check_rate(rate)
  if seed is None:
    raise ValueError(f"dropout_rate={rate} needs dropout_seed (an int32 scalar).")
  keep_QK = dropout.grid_keep_scale(seed, code_BHQK.shape[2], code_BHQK.shape[3], rate)
  return code_BHQK * keep_QK.astype(code_BHQK.dtype)


def _linear_value(code_BHQK, value_BKHV, phi, value_weight_HVV):
  del phi, value_weight_HVV
  return jnp.einsum("bhqk,bkhv->bqhv", code_BHQK, value_BKHV)


def _hidden_BQKV(code_BHQK, value_BKHV, phi):
  """z_qk = phi(sum_h a_hqk v_kh), (B, Q, K, V).

  The contraction is laid out with its batch axes (b, k) leading, so XLA runs one batched
  matmul without transposing around it; on CPU at the synthetic tasks' sizes (T=36, V=4)
  this and `_read_out`'s (b, q) layout train the MLP value network ~25% faster than the
  same einsums in (B, H, Q, K) order."""
  code_BKQH = jnp.transpose(code_BHQK, (0, 3, 2, 1))
  hidden_BKQV = phi(jnp.einsum("bkqh,bkhv->bkqv", code_BKQH, value_BKHV))
  return jnp.transpose(hidden_BKQV, (0, 2, 1, 3))


def _read_out(code_BHQK, hidden_BQKV):
  """y_qh = sum_k a_hqk z_qk, (B, Q, H, V)."""
  code_BQHK = jnp.transpose(code_BHQK, (0, 2, 1, 3))
  return jnp.einsum("bqhk,bqkv->bqhv", code_BQHK, hidden_BQKV)


def _mlp_value(code_BHQK, value_BKHV, phi, value_weight_HVV):
  del value_weight_HVV
  return _read_out(code_BHQK, _hidden_BQKV(code_BHQK, value_BKHV, phi))


def _deep_mlp_value(code_BHQK, value_BKHV, phi, value_weight_HVV):
  if value_weight_HVV is None:
    raise ValueError("value_network='deep_mlp' needs value_weight_HVV (H, V, V).")
  hidden_BQKV = _hidden_BQKV(code_BHQK, value_BKHV, phi)
  # sum_h a_hqk W'_h z_qk as one contraction, so that its order follows the shapes: at the
  # synthetic tasks' V=2 < H=8 each pair's (V, V) weight is built first ((B, Q, K, 4) floats,
  # not a (B, Q, K, H, V) tensor; half the layer's forward and backward time on a 2-core
  # CPU); from V >= H on, the outer product z_qk a_qk (V*H per pair) feeds one matmul with W'.
  hidden_BQKV = phi(jnp.einsum("bhqk,hvw,bqkv->bqkw", code_BHQK, value_weight_HVV,
                               hidden_BQKV, optimize="auto"))
  return _read_out(code_BHQK, hidden_BQKV)


# The spec of each value network: (code (B, H, Q, K), values (B, K, H, V), phi,
# value_weight_HVV or None) -> (B, Q, H, V). As NORMALIZATIONS, new entries run on the
# reference until a fast path declares them.
VALUE_NETWORKS: dict[str, Callable] = {"linear": _linear_value, "mlp": _mlp_value,
                                       "deep_mlp": _deep_mlp_value}


def apply_value_network(code_BHQK: jax.Array, value_BKHV: jax.Array,
                        value_network: str = "mlp", activation: str = "relu",
                        value_weight_HVV: Optional[jax.Array] = None) -> jax.Array:
  """Applies the value network configured by the latent code; returns (B, Q, H, V)."""
  errors.check_choice("value_network", value_network, VALUE_NETWORKS)
  return VALUE_NETWORKS[value_network](code_BHQK, value_BKHV, get_activation(activation),
                                       value_weight_HVV)


@dataclasses.dataclass(frozen=True)
class Computes:
  """What a fast implementation computes: the names of `NORMALIZATIONS` and
  `VALUE_NETWORKS` it implements (every activation). The reference computes them all.

  Each fast path declares one (`blockwise.COMPUTES`, ...); `dispatch` checks a call against it where
  it picks the implementation, so `auto` runs anything else on the reference, an explicit fast
  implementation refuses it, and a name added to the reference is never computed as something else.
  """
  implementation: str
  normalizations: tuple[str, ...]
  value_networks: tuple[str, ...]

  def covers(self, normalization: str, value_network: str) -> bool:
    return normalization in self.normalizations and value_network in self.value_networks

  def check(self, normalization: str, value_network: str) -> None:
    """BadInput in one line unless this path computes the pair."""
    for what, name, allowed in (("normalization", normalization, self.normalizations),
                                ("value_network", value_network, self.value_networks)):
      if name not in allowed:
        raise errors.BadInput(
            f"implementation={self.implementation!r} does not compute {what}={name!r}; it "
            f"computes normalization in {self.normalizations} with value_network in "
            f"{self.value_networks} ('auto' or 'reference' compute every one).")


# The operands' axes that must agree: (operand, axis, what, the operand it must match).
_SAME_AXES = (("key", 0, "batch", "query"), ("value", 0, "batch", "query"),
              ("key", 2, "heads", "query"), ("value", 2, "heads", "query"),
              ("key", 3, "depth", "query"), ("value", 1, "length", "key"))


def check_operands(query_BQHD: jax.Array, key_BKHD: jax.Array, value_BKHV: jax.Array, *,
                   bias: Optional[jax.Array] = None, mask: Optional[jax.Array] = None,
                   eps: float = RMS_HEAD_EPS) -> None:
  """The contract's operands, on static shapes and dtypes only (free under jit): floating
  (B, Q, H, D) queries, (B, K, H, D) keys and (B, K, H, V) values, Q and K at least 1, `bias`
  and `mask` as `check_pair_operands` says, `eps` finite and > 0 (at 0, 0/0 in RMSHead).

  `errors.BadInput` in one line naming the operand and what is allowed, before any work
  (`dispatch` and each implementation check here). Otherwise the tiled paths would attend over
  the shorter of keys and values, compute integers in their tiles' dtype, and fail inside on
  an empty tile grid; and with no key, the normalization of Eq. 2 has nothing to normalize.
  """
  operands = {"query": query_BQHD, "key": key_BKHD, "value": value_BKHV}
  for name, x in operands.items():
    if x.ndim != 4:
      raise errors.BadInput(f"{name} has shape {tuple(x.shape)}; allowed: rank 4, (batch, "
                            "length, heads, width)")
    if not jnp.issubdtype(x.dtype, jnp.floating):
      raise errors.BadInput(f"{name} has dtype {x.dtype}; allowed: a floating dtype "
                            "(float32, bfloat16, float16, float64)")
  for name, axis, what, like in _SAME_AXES:
    size = operands[like].shape[axis]
    if operands[name].shape[axis] != size:
      raise errors.BadInput(f"{name} has {what} {operands[name].shape[axis]} (axis {axis}, "
                            f"shape {tuple(operands[name].shape)}); allowed: {size}, the "
                            f"{what} of {like}")
  for name in ("query", "key"):
    if not operands[name].shape[1]:
      raise errors.BadInput(f"{name} has length 0 (shape {tuple(operands[name].shape)}); "
                            "allowed: at least one position")
  check_pair_operands((query_BQHD.shape[0], query_BQHD.shape[2], query_BQHD.shape[1],
                       key_BKHD.shape[1]), bias=bias, mask=mask)
  if not (math.isfinite(eps) and eps > 0):
    raise errors.BadInput(f"eps={eps}; allowed: a finite number > 0 (RMSHead's epsilon)")


def check_pair_operands(full_shape_BHQK: tuple[int, ...], *, bias: Optional[jax.Array] = None,
                        mask: Optional[jax.Array] = None) -> None:
  """BadInput in one line unless `bias` (floating) and `mask` (bool) broadcast to the scores.

  Why bool only: an additive mask (0 = keep, -1e9 = drop) and a 0/1 one (flax's
  `make_attention_mask` / `make_causal_mask` unless given dtype=bool) share a dtype; only
  their values, unknown while tracing, tell them apart, and cast to bool the additive one
  inverted attention. A dtype rule is static and never guesses. `bias=m` masks only under
  softmax: RMSHead rescales a -1e9 score like any other (Eq. 7).
  """
  for name, x in (("bias", bias), ("mask", mask)):
    if x is not None and (x.ndim > 4 or any(
        n not in (1, size) for n, size in zip(x.shape[::-1], full_shape_BHQK[::-1]))):
      raise errors.BadInput(
          f"{name} has shape {tuple(x.shape)}; allowed: broadcastable to (B, H, Q, K) = "
          f"{tuple(full_shape_BHQK)} (at most 4 axes, aligned right, each 1 or that size)")
  if mask is not None and mask.dtype != jnp.bool_:
    raise errors.BadInput(
        f"mask has dtype {mask.dtype}; allowed: bool, True = attend (an additive mask m, 0 = "
        "keep and -inf or -1e9 = drop: mask=(m == 0), or bias=m under softmax only; flax's "
        "make_attention_mask and make_causal_mask: pass dtype=bool)")
  if bias is not None and not jnp.issubdtype(bias.dtype, jnp.floating):
    raise errors.BadInput(f"bias has dtype {bias.dtype}; allowed: a floating dtype, added to "
                          "the scores (a boolean mask is mask=)")


def isolate_nonfinite(key_BKHD: jax.Array, value_BKHV: jax.Array, mask: Optional[jax.Array],
                      q_len: int, is_causal: bool = False
                      ) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(keys, values, poisoned_BQ): NaN and Inf entries selected away (0), and (B, Q|1) which
  queries see such a key through `mask` (in any head) and, if `is_causal`, the causal mask.

  Why: a masked pair's code is exactly 0, but 0 x NaN is NaN: a NaN in a masked (future,
  padded) value reached every output through the sums over keys, a masked key's the gradients
  (dQ = dS K). A select inside those sums would need a (B, H, Q, K, V) tensor, and cuDNN's
  attention cannot be opened; this one, on the operands, costs O(B K H (D + V)) and a boolean
  (B, Q, K) reduction, and every implementation then gives exactly the outputs and gradients
  of the same call with those entries zeroed. `reveal_nonfinite` gives the queries that do see
  one NaN: nothing is hidden.
  """
  bad_BK = jnp.logical_or(jnp.any(~jnp.isfinite(key_BKHD), axis=(2, 3)),
                          jnp.any(~jnp.isfinite(value_BKHV), axis=(2, 3)))
  sees_BQK, visible = bad_BK[:, None, :], with_causal(mask, is_causal, q_len, bad_BK.shape[1])
  if visible is not None:  # (B|1, H|1, Q|1, K): seen in any head
    sees_BQK &= jnp.any(visible.reshape((1,) * (4 - visible.ndim) + visible.shape), axis=1)
  finite = lambda x: jnp.where(jnp.isfinite(x), x, jnp.zeros((), x.dtype))
  return finite(key_BKHD), finite(value_BKHV), jnp.any(sees_BQK, axis=-1)


def with_causal(mask: Optional[jax.Array], is_causal: bool, q_len: int, k_len: int):
  """`mask` and, if `is_causal`, the causal mask: query i sees the keys <= i, counted from the
  first position of both (as `jax.nn.dot_product_attention`)."""
  if not is_causal:
    return mask
  causal_QK = jnp.tril(jnp.ones((q_len, k_len), bool))
  return causal_QK if mask is None else jnp.logical_and(mask, causal_QK)


def reveal_nonfinite(out_BQHV: jax.Array, poisoned_BQ: jax.Array) -> jax.Array:
  """NaN in every output of the queries `isolate_nonfinite` found seeing a NaN or Inf."""
  return jnp.where(poisoned_BQ[:, :, None, None], jnp.nan, out_BQHV)


def attention(query_BQHD: jax.Array, key_BKHD: jax.Array, value_BKHV: jax.Array, *,
              bias: Optional[jax.Array] = None, mask: Optional[jax.Array] = None,
              normalization: str = "rms_head", value_network: str = "mlp", activation: str = "relu",
              value_weight_HVV: Optional[jax.Array] = None, eps: float = RMS_HEAD_EPS,
              dropout_rate: float = 0.0, dropout_seed: Optional[jax.Array] = None) -> jax.Array:
  """Full attention, (B, Q, H, D) x (B, K, H, D) x (B, K, H, V) -> (B, Q, H, V).

  This signature is the contract of every implementation in `ops`. `dropout_rate` > 0
  drops pairs of the latent code with `dropout.py`'s (seed, q, k) mask, shared by batch
  and heads, exactly as the tiled kernels do.
  """
  check_operands(query_BQHD, key_BKHD, value_BKHV, bias=bias, mask=mask, eps=eps)
  key_BKHD, value_BKHV, poisoned_BQ = isolate_nonfinite(key_BKHD, value_BKHV, mask,
                                                        query_BQHD.shape[1])
  scores_BHQK = attention_scores(query_BQHD, key_BKHD, bias)
  code_BHQK = normalize_scores(scores_BHQK, mask, normalization, eps)
  if dropout_rate:
    code_BHQK = apply_dropout(code_BHQK, dropout_rate, dropout_seed)
  return reveal_nonfinite(apply_value_network(code_BHQK, value_BKHV, value_network, activation,
                                              value_weight_HVV), poisoned_BQ)
