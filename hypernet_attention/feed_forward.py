"""Feed-forward layers of the transformer block: GeLU MLP, SwiGLU and a top-k MoE.

Shape letters:
  B batch, T positions, E model width (`embed`), M hidden width (`mlp`), X experts."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from hypernet_attention import errors
from hypernet_attention import presets

Dtype = Any


def layer(kind: str, **settings) -> nn.Module:
  """The class `presets.FEED_FORWARDS` (the one table) maps `kind` to, given the `settings` it
  declares (`num_experts`, `top_k`: MoE's); a name not mapped to a class here is refused."""
  errors.check_choice("feed_forward", kind, presets.FEED_FORWARDS)
  cls = globals().get(presets.FEED_FORWARDS[kind])
  if cls is None:
    raise ValueError(f"feed_forward {kind!r} maps to {presets.FEED_FORWARDS[kind]!r}, "
                     "which is no class of feed_forward.py.")
  return cls(**{k: v for k, v in settings.items() if k in cls.__dataclass_fields__})


def dense(features, names, dtype, param_dtype, use_bias=True, name=None):
  """`nn.Dense` with its kernel and bias boxed with logical axis `names` (the bias: the last)."""
  return nn.Dense(
      features, use_bias=use_bias, dtype=dtype, param_dtype=param_dtype,
      kernel_init=nn.with_logical_partitioning(nn.linear.default_kernel_init, names),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), names[-1:]), name=name)


class _Mlp(nn.Module):
  hidden_dim: int
  dtype: Dtype = None
  param_dtype: Dtype = jnp.float32


class GeluMlp(_Mlp):
  """E -> M -> E with GeLU, biases on both layers (the paper's synthetic-task models)."""

  @nn.compact
  def __call__(self, x_BTE: jax.Array) -> jax.Array:
    h_BTM = nn.gelu(dense(self.hidden_dim, ("embed", "mlp"), self.dtype, self.param_dtype,
                          name="up")(x_BTE))
    return dense(x_BTE.shape[-1], ("mlp", "embed"), self.dtype, self.param_dtype,
                 name="down")(h_BTM)


class SwiGlu(_Mlp):
  """silu(W_gate x) * (W_up x) -> W_down, no biases (as the authors' SwiGLU block)."""

  @nn.compact
  def __call__(self, x_BTE: jax.Array) -> jax.Array:
    proj = lambda f, names, name: dense(f, names, self.dtype, self.param_dtype,
                                        use_bias=False, name=name)
    gate_BTM = nn.silu(proj(self.hidden_dim, ("embed", "mlp"), "gate")(x_BTE))
    up_BTM = proj(self.hidden_dim, ("embed", "mlp"), "up")(x_BTE)
    return proj(x_BTE.shape[-1], ("mlp", "embed"), "down")(gate_BTM * up_BTM)


def top_k_gates(logits_BTX: jax.Array, top_k: int) -> jax.Array:
  """Softmax over the k largest router logits; the other experts get exactly 0."""
  top_values, top_index = jax.lax.top_k(logits_BTX, top_k)
  top_weights = jax.nn.softmax(top_values.astype(jnp.float32), axis=-1)
  one_hot_BTKX = jax.nn.one_hot(top_index, logits_BTX.shape[-1], dtype=top_weights.dtype)
  return jnp.einsum("btk,btkx->btx", top_weights, one_hot_BTKX).astype(logits_BTX.dtype)


class MoE(nn.Module):
  """Mixture of experts: f(x) = sum_i softmax(top_k(W_gate x))_i W_i^down gelu(W_i^up x).

  Table A1's MoE rows (the rebuttal's ablation used 5 experts, top-2). Each expert is a GeLU MLP
  of width `hidden_dim`. Capacity: there is none, no token is ever dropped. Every expert
  runs on every token and the gates, zero outside each token's top k, weight the results.
  That is exact, has no capacity factor to tune, and at the paper's sizes (X=5, short
  sequences) costs X/k times the compute of a routed kernel, which is acceptable for a
  reference. The router probabilities are sown as `intermediates/router_gates`."""

  num_experts: int
  top_k: int
  hidden_dim: int
  dtype: Dtype = None
  param_dtype: Dtype = jnp.float32

  @nn.compact
  def __call__(self, x_BTE: jax.Array) -> jax.Array:
    if not 1 <= self.top_k <= self.num_experts:
      raise ValueError(f"top_k={self.top_k} with num_experts={self.num_experts}; allowed: "
                       "1 <= top_k <= num_experts.")
    width = x_BTE.shape[-1]
    logits_BTX = dense(self.num_experts, ("embed", "experts"), self.dtype, self.param_dtype,
                       use_bias=False, name="router")(x_BTE)
    gates_BTX = top_k_gates(logits_BTX, self.top_k)
    self.sow("intermediates", "router_gates", gates_BTX)
    param = lambda name, names, shape, fn: self.param(
        name, nn.with_logical_partitioning(fn, names), shape, self.param_dtype)
    per_expert = nn.initializers.variance_scaling(
        1.0, "fan_in", "truncated_normal", in_axis=1, out_axis=2, batch_axis=(0,))
    up_XEM = param("up_kernel", ("experts", "embed", "mlp"),
                   (self.num_experts, width, self.hidden_dim), per_expert)
    up_bias_XM = param("up_bias", ("experts", "mlp"), (self.num_experts, self.hidden_dim),
                       nn.initializers.zeros_init())
    down_XME = param("down_kernel", ("experts", "mlp", "embed"),
                     (self.num_experts, self.hidden_dim, width), per_expert)
    down_bias_XE = param("down_bias", ("experts", "embed"), (self.num_experts, width),
                         nn.initializers.zeros_init())
    x_BTE, up_XEM, up_bias_XM, down_XME, down_bias_XE = nn.dtypes.promote_dtype(
        x_BTE, up_XEM, up_bias_XM, down_XME, down_bias_XE, dtype=self.dtype)
    hidden_BTXM = nn.gelu(jnp.einsum("bte,xem->btxm", x_BTE, up_XEM) + up_bias_XM)
    expert_BTXE = jnp.einsum("btxm,xme->btxe", hidden_BTXM, down_XME) + down_bias_XE
    return jnp.einsum("btx,btxe->bte", gates_BTX.astype(expert_BTXE.dtype), expert_BTXE)
