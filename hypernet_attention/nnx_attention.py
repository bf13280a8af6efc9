"""HYLA and every attention of Table A1 as a Flax NNX module: a drop-in for nnx.MultiHeadAttention.

Shape letters as in `attention.py`: B batch, Q/K query/key positions, H heads, D per-head
query/key width, V per-head value width, E input width, O output width, N T5 buckets.

`MultiHeadAttention` here has the constructor and call of `flax.nnx.MultiHeadAttention` plus
the paper's choices (its docstring). It is a shell around the Linen module's own math
(`attention.place_heads`, `attention.attend`): it owns parameters, the decoding cache and the
dropout stream, nothing else.

Parameters are named and shaped as in the Linen module and in Flax's own attention
(`query`, `key`, `value`, `out`, each `kernel` and `bias`; HYLA+ adds `value_hidden`, the
T5 bias `relative_position/rel_embedding`), so `linen_params` / `load_params` move weights
between this module, the Linen one, `nnx.MultiHeadAttention` and
`nn.MultiHeadDotProductAttention`; switching a trained softmax model to HYLA is
`load_params(MultiHeadAttention(..., attention="hyla"), linen_params(flax_attention))`.

Latent code probing: `sow_weights=True` (as in Flax's module) materializes the (B, H, Q, K)
latent code and sows it as `nnx.Intermediate` named `latent_code`, the name the Linen module
sows it under; read it with `nnx.capture(model, nnx.Intermediate)(x, sow_weights=True)`.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

from flax import nnx
from flax import traverse_util
import flax.linen as nn
import jax
import jax.numpy as jnp

from hypernet_attention import attention as linen_attention
from hypernet_attention import errors
from hypernet_attention import positions
from hypernet_attention import presets
from hypernet_attention.ops import dropout
from hypernet_attention.ops import reference

Dtype = Any
Params = Mapping[str, Any]


class MultiHeadAttention(nnx.Module):
  """`nnx.MultiHeadAttention` with the latent-code normalization and value network of a preset.

  Arguments as in `flax.nnx.MultiHeadAttention`, and as in `attention.MultiHeadAttention`
  for `attention`, `activation`, `v_features` (total value width, default `qkv_features`),
  `position` and its T5 / RoPE settings, `implementation` and `eps`.
  """

  def __init__(
      self,
      num_heads: int,
      in_features: int,
      qkv_features: Optional[int] = None,
      out_features: Optional[int] = None,
      *,
      attention: str = "softmax",
      activation: Optional[str] = None,
      v_features: Optional[int] = None,
      in_kv_features: Optional[int] = None,
      dtype: Optional[Dtype] = None,
      param_dtype: Dtype = jnp.float32,
      broadcast_dropout: bool = True,
      dropout_rate: float = 0.0,
      deterministic: Optional[bool] = None,
      precision: Any = None,
      kernel_init: Any = nn.linear.default_kernel_init,
      bias_init: Any = nn.initializers.zeros_init(),
      use_bias: bool = True,
      decode: Optional[bool] = None,
      position: str = "none",
      num_buckets: int = 32,
      max_distance: int = 128,
      bidirectional: bool = False,
      rope_max_wavelength: float = 10_000.0,
      implementation: str = "auto",
      eps: float = reference.RMS_HEAD_EPS,
      rngs: nnx.Rngs,
      keep_rngs: bool = True,
  ):
    self.preset = linen_attention.resolve_preset(attention, activation)
    errors.check_choice("position", position, presets.POSITIONS)
    qkv_features = qkv_features or in_features
    v_features = v_features or qkv_features
    head_qk, head_v = linen_attention.head_widths(num_heads, qkv_features, v_features)
    self.num_heads, self.in_features = num_heads, in_features
    self.qkv_features, self.v_features = qkv_features, v_features
    self.out_features = out_features or in_features
    dropout.check_rate(dropout_rate)  # Checked where the module is built, as Linen's call does.
    self.dropout_rate, self.broadcast_dropout = dropout_rate, broadcast_dropout
    self.deterministic, self.decode = deterministic, decode
    self.position, self.rope_max_wavelength = position, rope_max_wavelength
    self.max_distance, self.bidirectional = max_distance, bidirectional
    self.dtype, self.implementation, self.eps = dtype, implementation, eps

    def linear(in_shape, out_shape, axis=-1):
      return nnx.LinearGeneral(
          in_shape, out_shape, axis=axis, dtype=dtype, param_dtype=param_dtype,
          kernel_init=kernel_init, bias_init=bias_init, use_bias=use_bias,
          precision=precision, rngs=rngs)

    self.in_kv_features = in_kv_features = in_kv_features or in_features
    self.query = linear(in_features, (num_heads, head_qk))
    self.key = linear(in_kv_features, (num_heads, head_qk))
    self.value = linear(in_kv_features, (num_heads, head_v))
    self.out = linear((num_heads, head_v), self.out_features, axis=(-2, -1))
    self.relative_position = nnx.data(None)
    if position == "t5":
      positions.check_buckets(num_buckets, max_distance, bidirectional)
      # The (H, N) table named as `positions.RelativePositionBias` names it.
      self.relative_position = nnx.Dict(rel_embedding=nnx.Param(nn.linear.default_embed_init(
          rngs.params(), (num_heads, num_buckets), param_dtype)))
    self.value_hidden = nnx.data(None)
    if self.preset.value_network == "deep_mlp":
      self.value_hidden = nnx.Param(linen_attention.VALUE_HIDDEN_INIT(
          rngs.params(), (num_heads, head_v, head_v), param_dtype))
    self.rngs = rngs.dropout.fork() if keep_rngs and dropout_rate > 0 else nnx.data(None)
    self.cached_key = self.cached_value = self.cache_index = nnx.data(None)

  def init_cache(self, input_shape: tuple[int, ...], dtype: Dtype = jnp.float32) -> None:
    """Allocates the decoding cache for inputs of shape (B, max length, E), as flax's."""
    batch, max_length = input_shape[0], input_shape[1]
    head_qk, head_v = self.qkv_features // self.num_heads, self.v_features // self.num_heads
    self.cached_key = nnx.Cache(jnp.zeros((batch, max_length, self.num_heads, head_qk), dtype))
    self.cached_value = nnx.Cache(jnp.zeros((batch, max_length, self.num_heads, head_v), dtype))
    self.cache_index = nnx.Cache(jnp.array(0, jnp.int32))

  def _dropout_rng(self, deterministic, rngs) -> Optional[jax.Array]:
    if self.dropout_rate <= 0.0:
      return None
    deterministic = self.deterministic if deterministic is None else deterministic
    if deterministic is None:
      raise ValueError("No `deterministic` given, in the call or the constructor; allowed: "
                       "True/False.")
    if deterministic:
      return None
    rngs = self.rngs if rngs is None else rngs
    if rngs is None:
      raise ValueError("dropout needs `rngs` in the call when built with keep_rngs=False.")
    if isinstance(rngs, nnx.Rngs):
      rngs = rngs.dropout
    return rngs() if isinstance(rngs, nnx.RngStream) else rngs

  def _cache(self, decode: bool) -> Optional[linen_attention.Cache]:
    if not decode:
      return None
    if self.cached_key is None:
      raise ValueError("decode=True needs the cache: call `init_cache(input_shape)` first.")
    return linen_attention.Cache(
        self.cached_key[...], self.cached_value[...], self.cache_index[...])

  def __call__(self, inputs_q: jax.Array, inputs_k: Optional[jax.Array] = None,
               inputs_v: Optional[jax.Array] = None, *, mask: Optional[jax.Array] = None,
               bias: Optional[jax.Array] = None, is_causal: bool = False,
               deterministic: Optional[bool] = None,
               rngs: Union[nnx.Rngs, nnx.RngStream, jax.Array, None] = None,
               sow_weights: bool = False, decode: Optional[bool] = None) -> jax.Array:
    """(B, Q, E) queries, (B, K, E) keys/values (default: self-attention) -> (B, Q, O).

    As `nnx.MultiHeadAttention.__call__`, plus `bias` (float, broadcastable to (B, H, Q, K),
    added to the scores). `rngs` may also be a key used as is for dropout.
    `sow_weights` sows the latent code as `nnx.Intermediate` 'latent_code'.
    """
    inputs_k = inputs_q if inputs_k is None else inputs_k
    inputs_v = inputs_k if inputs_v is None else inputs_v
    linen_attention.check_inputs(inputs_q, inputs_k, inputs_v, widths={
        "inputs_q": ("in_features", self.in_features),
        "inputs_k": ("in_kv_features", self.in_kv_features),
        "inputs_v": ("in_kv_features", self.in_kv_features)})
    dropout_rng = self._dropout_rng(deterministic, rngs)
    decode = bool(self.decode if decode is None else decode)  # None in both: no cache
    placed = linen_attention.place_heads(
        self, self.query(inputs_q), self.key(inputs_k), self.value(inputs_v),
        self._cache(decode))
    if placed.cache is not None:
      self.cached_key[...] = placed.cache.key_BKHD
      self.cached_value[...] = placed.cache.value_BKHV
      self.cache_index[...] = placed.cache.index
    position_bias = None
    if self.relative_position is not None:
      position_bias = positions.relative_position_bias(
          self.relative_position.rel_embedding[...], placed.query_positions_Q,
          placed.key_positions_K, bidirectional=self.bidirectional,
          max_distance=self.max_distance, dtype=self.dtype or jnp.float32)
    attended = linen_attention.attend(
        self, placed, mask=mask, bias=bias, position_bias=position_bias, is_causal=is_causal,
        value_weight_HVV=None if self.value_hidden is None else self.value_hidden[...],
        dropout_rng=dropout_rng, materialize=sow_weights)
    # Only when asked: the dropout path materializes the code too, for its own use.
    if sow_weights and attended.latent_code_BHQK is not None:
      self.sow(nnx.Intermediate, "latent_code", attended.latent_code_BHQK)
    return self.out(attended.out_BQHV)


def linen_params(source: Union[nnx.Module, Params]) -> dict:
  """The parameters of `source` as a plain Linen params dict ({'query': {'kernel': ...}}).

  `source`: this module or `nnx.MultiHeadAttention` (their `nnx.Param`s), an `nnx.State` of them
  (gradients from `nnx.grad`), or a Linen params dict of `attention.MultiHeadAttention` or
  `nn.MultiHeadDotProductAttention` (with or without the 'params' level, logical-axis boxes
  removed)."""
  if isinstance(source, nnx.Module):
    source = nnx.state(source, nnx.Param)
  if isinstance(source, nnx.State):
    return nnx.to_pure_dict(source)
  params = nn.meta.unbox(dict(source))
  return dict(params.get("params", params)) if set(params) == {"params"} else dict(params)


def load_params(module: MultiHeadAttention, source: Union[nnx.Module, Params],
                strict: bool = True) -> MultiHeadAttention:
  """Copies `source`'s parameters (anything `linen_params` takes) into `module`; returns it.

  Names and shapes must match; floating-point values are cast to the module's own parameter
  dtypes (`param_dtype`), anything else is refused. `strict=False` lets `module` keep its
  own initial values for parameters the source lacks (HYLA+'s `value_hidden`, the T5 table,
  from a standard model).
  """
  target = traverse_util.flatten_dict(linen_params(module), sep="/")
  given = traverse_util.flatten_dict(linen_params(source), sep="/")
  extra = sorted(set(given) - set(target))
  missing = sorted(set(target) - set(given)) if strict else []
  wrong = sorted(f"{n} {tuple(jnp.shape(given[n]))} (allowed: {tuple(jnp.shape(target[n]))})"
                 for n in set(given) & set(target)
                 if jnp.shape(given[n]) != jnp.shape(target[n]))
  not_float = sorted(f"{n} {jnp.result_type(given[n])}" for n in set(given) & set(target)
                     if not jnp.issubdtype(jnp.result_type(given[n]), jnp.floating))
  if extra or missing or wrong or not_float:
    raise ValueError(
        f"Parameters do not fit the module: unknown {extra}, missing {missing}, "
        f"wrong shape {wrong}, not floating-point {not_float}; allowed: the names and shapes "
        "of linen_params(module), floating-point values.")
  # Cast to the module's own dtypes: a bf16 source must not silently turn an f32 module
  # (its `param_dtype`) into a bf16 one, nor f32 weights a bf16 module into f32.
  target.update({n: jnp.asarray(v, jnp.result_type(target[n])) for n, v in given.items()})
  state = nnx.state(module, nnx.Param)
  nnx.replace_by_pure_dict(state, traverse_util.unflatten_dict(target, sep="/"))
  nnx.update(module, state)
  return module
