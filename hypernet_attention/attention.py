"""Multi-head attention, HYLA and every ablation of the paper in one Linen module.

Shape letters:
  B batch, Q query positions, K key positions, H heads, D per-head query/key width,
  V per-head value width, E input width (`embed`), O output width.

The module is `flax.linen.MultiHeadDotProductAttention` with two knobs turned by a preset
(the paper's Eqs. 2-7, Table A1): the *normalization* that turns scores s_hqk into the latent code
a_hqk (softmax over keys, identity, or RMSHead across heads), and the *value network* that
the latent code configures (linear = standard attention; a one-hidden-layer MLP whose two
layers are both generated = HYLA; a two-hidden-layer one = HYLA+). Parameters are named and
shaped exactly as flax's module (`query`, `key`, `value`, `out`), so weights move between the
two; HYLA+ adds `value_hidden` and the T5 position bias adds `relative_position`.

Latent code probing: when the `intermediates` collection is mutable, the (B, H, Q, K) latent
code is sown as `intermediates/.../latent_code` (after dropout, i.e. the code the value network
actually used; with `deterministic=True` there is no dropout).

Dropout, as in the authors' code (smonsays/hypernetwork-attention, checked for facts): their
attention module applies dropout (rate 0.1 by default, never overridden by their configs,
active in training steps) to the *normalized* attention weights, i.e. to the latent code,
after softmax / RMSHead / identity and before the value network, with one (Q, K) keep-mask
broadcast over batch and heads; for HYLA the same dropped code then enters both generated
layers, and the sown weights are the dropped ones. We do the same, with `ops/dropout.py`'s
mask, its seed drawn from the `dropout` rng. `broadcast_dropout=False` (a mask per batch
element and head) uses `jax.random.bernoulli` on the materialized code.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp

from hypernet_attention import errors
from hypernet_attention import partitioning
from hypernet_attention import positions
from hypernet_attention import presets
from hypernet_attention.ops import dispatch
from hypernet_attention.ops import dropout
from hypernet_attention.ops import reference

Dtype = Any
Initializer = Callable[..., jax.Array]

# 'nonlinear_value' is the one value network the ops do not know: phi is applied to each
# head's value before standard (linear) aggregation, so we run it as 'linear' on phi(v).
VALUE_NETWORKS = (*reference.VALUE_NETWORKS, "nonlinear_value")


def resolve_preset(name: str, activation: Optional[str] = None) -> presets.AttentionPreset:
  """The preset called `name`, with its activation replaced by `activation` if given.

  The override is validated but has no effect on linear value networks (they have no phi).
  """
  errors.check_choice("attention preset", name, presets.PRESETS)
  preset = presets.PRESETS[name]
  if activation is None:
    return preset
  reference.get_activation(activation)
  if preset.value_network == "linear":
    return preset
  return preset._replace(activation=activation)


def head_widths(num_heads: int, qk_features: int, v_features: int) -> tuple[int, int]:
  """Per-head (D, V) from the total widths; they must divide by the number of heads."""
  if num_heads < 1:
    raise ValueError(f"num_heads={num_heads}; allowed: a positive integer.")
  for name, width in (("qk_features", qk_features), ("v_features", v_features)):
    if width % num_heads:
      raise ValueError(f"{name}={width} is not divisible by num_heads={num_heads}; allowed: "
                       f"multiples of {num_heads}.")
  return qk_features // num_heads, v_features // num_heads


def _contract(assertion, *args, message: str) -> None:
  """A chex shape assertion that fails as one ValueError line: `message` alone."""
  assertion(*args, custom_message=message, include_default_message=False, exception_type=ValueError)


def check_inputs(inputs_q: jax.Array, inputs_k: jax.Array, inputs_v: jax.Array,
                 widths: Optional[dict[str, tuple[str, int]]] = None) -> None:
  """The call's shape contract, on static shapes only (free under jit): (B, Q, E) queries
  and (B, K, E') keys and values of the queries' batch, values as long as keys. `widths`:
  input name -> (the setting, its width) where the module fixes the last axis (NNX).

  Each failure is one ValueError naming the input, its axis and what is allowed, before a
  projection or a kernel reports it about another array (or as an unpacking error).
  """
  inputs = {"inputs_q": inputs_q, "inputs_k": inputs_k, "inputs_v": inputs_v}
  for name, x in inputs.items():
    _contract(chex.assert_rank, x, 3, message=(
        f"{name} has shape {tuple(x.shape)}; allowed: rank 3, (batch, length, features)"))
  for name, axis, what, like in (("inputs_k", 0, "batch", "inputs_q"),
                                 ("inputs_v", 0, "batch", "inputs_q"),
                                 ("inputs_v", 1, "length", "inputs_k")):
    size = inputs[like].shape[axis]
    _contract(chex.assert_axis_dimension, inputs[name], axis, size, message=(
        f"{name} has {what} {inputs[name].shape[axis]} (axis {axis}); allowed: {size}, the "
        f"{what} of {like}"))
  for name, (setting, width) in (widths or {}).items():
    _contract(chex.assert_axis_dimension, inputs[name], -1, width, message=(
        f"{name} has width {inputs[name].shape[-1]}; allowed: {setting}={width} (its last "
        "axis)"))


def latent_code_dropout(code_BHQK: jax.Array, rate: float, rng: jax.Array,
                        broadcast: bool = True) -> jax.Array:
  """Inverted dropout on the latent code: one (Q, K) mask shared across batch and heads (the
  authors' default, see the module docstring), else a mask per element (`broadcast=False`)."""
  if broadcast:
    return reference.apply_dropout(code_BHQK, rate, dropout.seed_from_rng(rng))
  keep_prob = 1.0 - rate
  keep = jax.random.bernoulli(rng, keep_prob, code_BHQK.shape)
  return code_BHQK * (keep.astype(code_BHQK.dtype) / jnp.asarray(keep_prob, code_BHQK.dtype))


# W_h^v' of Eq. 10 (HYLA+), indexed [head, input unit, output unit]. Fan-in is H*V because
# the generated layer sums over heads: sum_h a_hqk W_h^v' keeps unit scale when the latent
# code has unit RMS across heads (RMSHead).
VALUE_HIDDEN_INIT = nn.initializers.variance_scaling(
    1.0, "fan_in", "truncated_normal", in_axis=(0, 1), out_axis=2)


class Cache(NamedTuple):
  """The decoding cache's arrays: keys and values of every slot, and the next slot."""
  key_BKHD: jax.Array
  value_BKHV: jax.Array
  index: jax.Array


class Heads(NamedTuple):
  """Projected heads placed at their positions (RoPE applied; on a decode step the whole
  cache as keys and values, with `cache_mask` hiding the slots not written yet)."""
  query_BQHD: jax.Array
  key_BKHD: jax.Array
  value_BKHV: jax.Array
  query_positions_Q: jax.Array
  key_positions_K: jax.Array
  cache_mask: Optional[jax.Array]
  cache: Optional[Cache]  # the cache to write back after a decode step


class Attended(NamedTuple):
  out_BQHV: jax.Array
  latent_code_BHQK: Optional[jax.Array]  # only where the code was materialized


# The two functions below are the attention of both modules (this Linen one and
# `nnx_attention.MultiHeadAttention`): the modules own parameters, cache and rngs and pass
# themselves as `settings`, read for `preset`, `position`, `rope_max_wavelength`,
# `dropout_rate`, `broadcast_dropout`, `eps` and `implementation`.


def place_heads(settings, query_BQHD, key_BKHD, value_BKHV, cache: Optional[Cache]) -> Heads:
  """Positions (and RoPE) for a whole sequence, or one decode step written into `cache`."""
  rope = settings.position == "rope"
  if cache is None:
    query_pos, key_pos = jnp.arange(query_BQHD.shape[1]), jnp.arange(key_BKHD.shape[1])
    if rope:
      query_BQHD = positions.apply_rope(query_BQHD, query_pos, settings.rope_max_wavelength)
      key_BKHD = positions.apply_rope(key_BKHD, key_pos, settings.rope_max_wavelength)
    return Heads(query_BQHD, key_BKHD, value_BKHV, query_pos, key_pos, None, None)
  batch, max_length, _, _ = cache.key_BKHD.shape
  if query_BQHD.shape[1] != 1 or query_BQHD.shape[0] != batch:
    raise ValueError(f"decode=True expects one token per call, query of shape ({batch}, 1, ...); "
                     f"got {query_BQHD.shape[:2]}.")
  index = cache.index
  if not isinstance(index, jax.core.Tracer) and int(index) >= max_length:
    raise ValueError(
        f"decode step {int(index) + 1} does not fit the cache of length {max_length}; "
        f"allowed: at most {max_length} decode steps per cache (size it for a longer input: "
        "NNX `init_cache`, Linen `init`)")
  query_pos = index[None]
  if rope:
    query_BQHD = positions.apply_rope(query_BQHD, query_pos, settings.rope_max_wavelength)
    key_BKHD = positions.apply_rope(key_BKHD, query_pos, settings.rope_max_wavelength)
  # Start indices of one integer type (a literal 0 is int64 under jax_enable_x64).
  zero = jnp.zeros_like(index)
  start = (zero, index, zero, zero)
  key_BKHD = jax.lax.dynamic_update_slice(cache.key_BKHD, key_BKHD, start)
  value_BKHV = jax.lax.dynamic_update_slice(cache.value_BKHV, value_BKHV, start)
  cache_mask = (jnp.arange(max_length) <= index)[None, None, None, :]
  # Under jit the step is not known while tracing: a step past the cache (whose write
  # `dynamic_update_slice` would clamp onto the last slot) gives NaN, never a plausible output.
  query_BQHD = jnp.where(index < max_length, query_BQHD, jnp.nan)
  return Heads(query_BQHD, key_BKHD, value_BKHV, query_pos, jnp.arange(max_length),
               cache_mask, Cache(key_BKHD, value_BKHV, index + 1))


def attend(settings, heads: Heads, *, mask: Optional[jax.Array], bias: Optional[jax.Array],
           position_bias: Optional[jax.Array], is_causal: bool,
           value_weight_HVV: Optional[jax.Array], dropout_rng: Optional[jax.Array],
           materialize: bool) -> Attended:
  """Latent code and value network of `settings.preset` on placed heads -> (B, Q, H, V).

  `mask` and `bias` are the caller's (checked here), `position_bias` the T5 one (or None).
  `dropout_rng` (None: no dropout) drops out the latent code. `materialize` takes the slow
  path that returns the (B, H, Q, K) latent code (probing); otherwise `ops.dispatch` picks
  the fast implementation.
  """
  preset = settings.preset
  # Every path, the probing one too (which runs no implementation): a typo is never run.
  errors.check_choice("implementation", settings.implementation, presets.IMPLEMENTATIONS)
  query_BQHD, key_BKHD, value_BKHV = heads.query_BQHD, heads.key_BKHD, heads.value_BKHV
  full_shape = (query_BQHD.shape[0], query_BQHD.shape[2], query_BQHD.shape[1], key_BKHD.shape[1])
  reference.check_operands(query_BQHD, key_BKHD, value_BKHV, bias=bias, mask=mask,
                           eps=settings.eps)  # Both paths, before any work.
  if position_bias is not None:
    bias = position_bias if bias is None else bias + position_bias
  if heads.cache_mask is not None:
    mask = heads.cache_mask if mask is None else jnp.logical_and(mask, heads.cache_mask)
  is_causal = is_causal and heads.cache_mask is None  # on a decode step the cache does it
  value_network, activation = preset.value_network, preset.activation
  if value_network == "nonlinear_value":
    value_BKHV = reference.get_activation(activation)(value_BKHV)
    value_network, activation = "linear", "identity"
  if value_weight_HVV is not None:
    value_weight_HVV = jnp.asarray(value_weight_HVV, value_BKHV.dtype)

  use_dropout = dropout_rng is not None and settings.dropout_rate > 0.0
  if materialize or (use_dropout and not settings.broadcast_dropout):
    # The slow path: materialize the latent code, drop out pairs, expose it.
    mask = reference.with_causal(mask, is_causal, *full_shape[2:])
    key_BKHD, value_BKHV, poisoned_BQ = reference.isolate_nonfinite(
        key_BKHD, value_BKHV, mask, full_shape[2])
    scores_BHQK = reference.attention_scores(query_BQHD, key_BKHD, bias)
    code_BHQK = reference.normalize_scores(scores_BHQK, mask, preset.normalization, settings.eps)
    if use_dropout:
      code_BHQK = latent_code_dropout(
          code_BHQK, settings.dropout_rate, dropout_rng, settings.broadcast_dropout)
    chex.assert_shape(code_BHQK, full_shape)  # The latent code that is sown: (B, H, Q, K).
    out_BQHV = reference.apply_value_network(
        code_BHQK, value_BKHV, value_network, activation, value_weight_HVV)
    return Attended(reference.reveal_nonfinite(out_BQHV, poisoned_BQ),  # and the sown code:
                    jnp.where(poisoned_BQ[:, None, :, None], jnp.nan, code_BHQK))
  out_BQHV = dispatch.attention(
      query_BQHD, key_BKHD, value_BKHV, bias=bias, mask=mask, is_causal=is_causal,
      normalization=preset.normalization, value_network=value_network,
      activation=activation, value_weight_HVV=value_weight_HVV, eps=settings.eps,
      implementation=settings.implementation,
      dropout_rate=settings.dropout_rate if use_dropout else 0.0,
      dropout_seed=dropout.seed_from_rng(dropout_rng) if use_dropout else None)
  return Attended(out_BQHV, None)


class MultiHeadAttention(nn.Module):
  """Multi-head attention with a latent-code normalization and value network by preset.

  Attributes:
    num_heads: H.
    attention: preset name, a key of `presets.PRESETS` (Table A1's rows).
    activation: overrides the preset's value-network activation (see `resolve_preset`).
    qk_features, v_features: TOTAL query/key and value widths over heads (default: input
      width), as in flax.
    out_features: output width (default: input width).
    dropout_rate: dropout on the latent code during training (`deterministic=False`).
    broadcast_dropout: share the dropout mask across batch and heads (the authors' choice).
    position: 'none', 't5' (relative-position bias table per module) or 'rope'.
    num_buckets, max_distance, bidirectional: T5 bias settings.
    rope_max_wavelength: RoPE base.
    decode: autoregressive decoding with a key/value cache in the `cache` collection, as
      flax's module: `init` with a full-length input sizes the cache, then `apply` one
      token at a time with `mutable=['cache']`. Only meaningful for causal attention.
    implementation: passed to `ops.dispatch.attention` on the fast path.
    eps: RMSHead epsilon.
  """

  num_heads: int
  attention: str = "softmax"
  activation: Optional[str] = None
  qk_features: Optional[int] = None
  v_features: Optional[int] = None
  out_features: Optional[int] = None
  dropout_rate: float = 0.0
  broadcast_dropout: bool = True
  position: str = "none"
  num_buckets: int = 32
  max_distance: int = 128
  bidirectional: bool = False
  rope_max_wavelength: float = 10_000.0
  decode: bool = False
  dtype: Optional[Dtype] = None
  param_dtype: Dtype = jnp.float32
  kernel_init: Initializer = nn.linear.default_kernel_init
  bias_init: Initializer = nn.initializers.zeros_init()
  use_bias: bool = True
  precision: Any = None
  implementation: str = "auto"
  eps: float = reference.RMS_HEAD_EPS

  @property
  def preset(self) -> presets.AttentionPreset:
    return resolve_preset(self.attention, self.activation)

  def _dense(self, features, axis, names, name):
    return nn.DenseGeneral(
        features=features, axis=axis, dtype=self.dtype, param_dtype=self.param_dtype,
        kernel_init=partitioning.with_logical_partitioning(self.kernel_init, names),
        bias_init=partitioning.with_logical_partitioning(self.bias_init, names[-len(
            features if isinstance(features, tuple) else (features,)):]),
        use_bias=self.use_bias, precision=self.precision, name=name)

  def _cache(self, key_BKHD, value_BKHV) -> Optional[Cache]:
    """The decoding cache, as flax's module keeps it: `init` with a full-length input
    creates it (and returns None: that call attends to the input as a whole)."""
    initialized = self.has_variable("cache", "cached_key")
    key = self.variable("cache", "cached_key", jnp.zeros, key_BKHD.shape, key_BKHD.dtype)
    value = self.variable("cache", "cached_value", jnp.zeros, value_BKHV.shape, value_BKHV.dtype)
    index = self.variable("cache", "cache_index", lambda: jnp.array(0, jnp.int32))
    return Cache(key.value, value.value, index.value) if initialized else None

  @nn.compact
  def __call__(self, inputs_q: jax.Array, inputs_k: Optional[jax.Array] = None,
               inputs_v: Optional[jax.Array] = None, *, mask: Optional[jax.Array] = None,
               bias: Optional[jax.Array] = None, is_causal: bool = False,
               deterministic: bool = True) -> jax.Array:
    """(B, Q, E) queries, (B, K, E) keys/values (default: self-attention) -> (B, Q, O).

    mask: bool broadcastable to (B, H, Q, K), True = attend (flax's convention; for flax's
      `make_attention_mask`, dtype=bool: `reference.check_pair_operands` refuses floats).
    bias: float broadcastable to (B, H, Q, K), added to the scores with the position bias.
    is_causal: also hide keys after each query (ignored on decode steps, where the cache
      position does it).
    """
    preset = self.preset
    errors.check_choice("position", self.position, presets.POSITIONS)
    dropout.check_rate(self.dropout_rate)
    inputs_k = inputs_q if inputs_k is None else inputs_k
    inputs_v = inputs_k if inputs_v is None else inputs_v
    check_inputs(inputs_q, inputs_k, inputs_v)
    qk_features = self.qk_features or inputs_q.shape[-1]
    v_features = self.v_features or inputs_q.shape[-1]
    out_features = self.out_features or inputs_q.shape[-1]
    head_qk, head_v = head_widths(self.num_heads, qk_features, v_features)
    heads = self.num_heads

    proj = ("embed", "heads", "kv")
    query_BQHD = self._dense((heads, head_qk), -1, proj, "query")(inputs_q)
    key_BKHD = self._dense((heads, head_qk), -1, proj, "key")(inputs_k)
    value_BKHV = self._dense((heads, head_v), -1, proj, "value")(inputs_v)

    cache = self._cache(key_BKHD, value_BKHV) if self.decode else None
    placed = place_heads(self, query_BQHD, key_BKHD, value_BKHV, cache)
    if placed.cache is not None:
      self.put_variable("cache", "cached_key", placed.cache.key_BKHD)
      self.put_variable("cache", "cached_value", placed.cache.value_BKHV)
      self.put_variable("cache", "cache_index", placed.cache.index)

    position_bias = None
    if self.position == "t5":
      position_bias = positions.RelativePositionBias(
          num_heads=heads, num_buckets=self.num_buckets, max_distance=self.max_distance,
          bidirectional=self.bidirectional, dtype=self.dtype or jnp.float32,
          param_dtype=self.param_dtype, name="relative_position",
      )(placed.query_positions_Q, placed.key_positions_K)

    value_weight_HVV = None
    if preset.value_network == "deep_mlp":
      value_weight_HVV = self.param(
          "value_hidden",
          partitioning.with_logical_partitioning(VALUE_HIDDEN_INIT, ("heads", "kv", None)),
          (heads, head_v, head_v), self.param_dtype)
    use_dropout = not deterministic and self.dropout_rate > 0.0
    attended = attend(
        self, placed, mask=mask, bias=bias, position_bias=position_bias, is_causal=is_causal,
        value_weight_HVV=value_weight_HVV,
        dropout_rng=self.make_rng("dropout") if use_dropout else None,
        materialize=self.is_mutable_collection("intermediates"))
    if attended.latent_code_BHQK is not None:
      self.sow("intermediates", "latent_code", attended.latent_code_BHQK)
    return self._dense(out_features, (-2, -1), ("heads", "kv", "embed"), "out")(attended.out_BQHV)
