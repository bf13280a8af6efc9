"""The pre-LN transformer of the paper's synthetic tasks (appendix), any attention preset.

Shape letters:
  B batch, T positions, I input features, E model width (`embed`), O output width.

Block: Z = Attn(LN(X)) + X; Y = FF(LN(Z)) + Z. Then a final LN and a read-out (Dense, or
the transposed token embedding). No residual or MLP dropout; the only dropout is the
authors' 0.1 on the attention latent code (`attention_dropout`), active only when
`deterministic=False` and a `'dropout'` rng is given.

`fuzzy_logic_config` and `sraven_config` build the paper's two synthetic-task models
(151,009 and 402,824 parameters at width 1, for softmax, linear and HYLA alike)."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from hypernet_attention import attention as attention_lib
from hypernet_attention import errors
from hypernet_attention import feed_forward
from hypernet_attention import presets

Dtype = Any
INPUT_KINDS = ("dense", "embed")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """Hyperparameters. qk_dim and v_dim are TOTAL widths over heads (as the authors')."""

  num_layers: int = 2
  emb_dim: int = 128
  num_heads: int = 8
  qk_dim: int = 16
  v_dim: int = 16
  mlp_dim: int = 256
  attention: str = "hyla"  # a key of presets.PRESETS
  activation: Optional[str] = None  # overrides the preset's value-network activation
  feed_forward: str = "gelu_mlp"  # presets.FEED_FORWARDS
  num_experts: int = 5
  top_k: int = 2
  input_kind: str = "dense"  # 'dense': float (B, T, I); 'embed': int tokens (B, T)
  vocab_size: Optional[int] = None
  output_dim: int = 1
  tied_embedding: bool = False  # read out with the embedding table (needs 'embed')
  position: str = "t5"  # presets.POSITIONS
  num_buckets: int = 16
  max_distance: int = 16
  bidirectional: bool = False
  rope_max_wavelength: float = 10_000.0
  causal: bool = False
  # The longest sequence the model is built for (the data's row length, the decode
  # cache's size); longer inputs are refused. None: no limit.
  max_len: Optional[int] = None
  attention_dropout: float = 0.1
  dtype: Dtype = jnp.float32
  param_dtype: Dtype = jnp.float32
  implementation: str = "auto"  # presets.IMPLEMENTATIONS
  decode: bool = False

  def __post_init__(self):
    attention_lib.resolve_preset(self.attention, self.activation)
    attention_lib.head_widths(self.num_heads, self.qk_dim, self.v_dim)
    presets.check_model_names(self)  # As the launching machine checks a config's model.
    errors.check_choice("input_kind", self.input_kind, INPUT_KINDS)
    if self.input_kind == "embed" and not self.vocab_size:
      raise ValueError(f"input_kind='embed' needs vocab_size; got {self.vocab_size!r}.")
    if self.tied_embedding and self.input_kind != "embed":
      raise ValueError(f"tied_embedding=True needs input_kind='embed'; got {self.input_kind!r}.")
    if self.max_len is not None and self.max_len < 1:
      raise ValueError(f"max_len={self.max_len}; allowed: a positive integer or None.")
    if self.decode and not self.causal:
      raise ValueError("decode=True needs causal=True; allowed: decode only for causal models.")
    if self.feed_forward == "moe" and not 1 <= self.top_k <= self.num_experts:
      raise ValueError(f"top_k={self.top_k}, num_experts={self.num_experts}; allowed: "
                       "1 <= top_k <= num_experts.")

  def replace(self, **changes) -> "TransformerConfig":
    return dataclasses.replace(self, **changes)


def fuzzy_logic_config(seq_len: int = 16, **changes) -> TransformerConfig:
  """Fuzzy logic (appendix): 2 layers, D=128, MLP 256, 8 heads, q/k/v 16; 151,009 params at N=16."""
  config = TransformerConfig(
      num_layers=2, emb_dim=128, num_heads=8, qk_dim=16, v_dim=16, mlp_dim=256,
      output_dim=1, num_buckets=seq_len, max_distance=seq_len)
  return config.replace(**changes)


def sraven_config(width_multiplier: int = 1, num_layers: int = 4, seq_len: int = 36,
                  num_values: int = 8, **changes) -> TransformerConfig:
  """SRAVEN (appendix): D=128w, 16w heads, q/k/v 64w, MLP 256w; 402,824 params at w=1, depth 4."""
  w = width_multiplier
  config = TransformerConfig(
      num_layers=num_layers, emb_dim=128 * w, num_heads=16 * w, qk_dim=64 * w,
      v_dim=64 * w, mlp_dim=256 * w, output_dim=num_values,
      num_buckets=seq_len, max_distance=seq_len)
  return config.replace(**changes)


def _layer_norm(config, name):
  return nn.LayerNorm(
      dtype=config.dtype, param_dtype=config.param_dtype, name=name,
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",)),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("norm",)))


class TransformerBlock(nn.Module):
  """Pre-LN block: attention (submodule `attention`) and feed-forward (`feed_forward`)."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, x_BTE, *, mask=None, deterministic=True):
    c = self.config
    h_BTE = attention_lib.MultiHeadAttention(
        num_heads=c.num_heads, attention=c.attention, activation=c.activation,
        qk_features=c.qk_dim, v_features=c.v_dim, dropout_rate=c.attention_dropout,
        position=c.position, num_buckets=c.num_buckets, max_distance=c.max_distance,
        bidirectional=c.bidirectional, rope_max_wavelength=c.rope_max_wavelength,
        decode=c.decode, dtype=c.dtype, param_dtype=c.param_dtype,
        implementation=c.implementation, name="attention",
    )(_layer_norm(c, "attention_norm")(x_BTE), mask=mask, is_causal=c.causal,
      deterministic=deterministic)
    x_BTE = x_BTE + h_BTE
    ff = feed_forward.layer(c.feed_forward, hidden_dim=c.mlp_dim, num_experts=c.num_experts,
                            top_k=c.top_k, dtype=c.dtype, param_dtype=c.param_dtype,
                            name="feed_forward")
    return x_BTE + ff(_layer_norm(c, "feed_forward_norm")(x_BTE))


class Transformer(nn.Module):
  """Input embedding -> `num_layers` blocks (`layers_{i}`) -> final LN -> read-out."""

  config: TransformerConfig

  @nn.compact
  def __call__(self, inputs: jax.Array, *, deterministic: bool = True,
               padding_mask: Optional[jax.Array] = None) -> jax.Array:
    """(B, T, I) floats ('dense') or (B, T) int tokens ('embed') -> (B, T, output_dim).

    padding_mask: optional (B, T) bool, True for real tokens; padded keys are hidden from
    every query (padded queries still produce outputs; ignore them in the loss)."""
    c = self.config
    expected_ndim = 3 if c.input_kind == "dense" else 2
    if inputs.ndim != expected_ndim:
      raise ValueError(
          f"inputs of shape {inputs.shape} for input_kind={c.input_kind!r}; allowed: "
          f"{'(B, T, input_dim) floats' if expected_ndim == 3 else '(B, T) int tokens'}.")
    if c.max_len is not None and inputs.shape[1] > c.max_len:
      raise ValueError(f"inputs of length {inputs.shape[1]} exceed max_len={c.max_len}; "
                       f"allowed: at most {c.max_len} positions.")
    mask = None
    if padding_mask is not None:
      if padding_mask.shape != inputs.shape[:2]:
        raise ValueError(f"padding_mask of shape {padding_mask.shape}; allowed: (B, T) = "
                         f"{inputs.shape[:2]}.")
      if c.decode:
        raise ValueError("padding_mask with decode=True; allowed: padding_mask=None.")
      mask = padding_mask.astype(bool)[:, None, None, :]
    embedding = None
    if c.input_kind == "dense":
      if self.has_variable("params", "input_dense"):  # Applied: one line, not flax's
        kernel = nn.meta.unbox(self.get_variable("params", "input_dense"))["kernel"]
        if kernel.shape[0] != inputs.shape[-1]:  # ScopeParamShapeError of an initializer.
          raise ValueError(f"inputs of shape {inputs.shape} (width {inputs.shape[-1]}); "
                           f"allowed: width {kernel.shape[0]}, that of these parameters "
                           f"(input_dense kernel {kernel.shape})")
      x_BTE = feed_forward.dense(c.emb_dim, ("input", "embed"), c.dtype, c.param_dtype,
                                 name="input_dense")(inputs)
    else:
      embedding = nn.Embed(
          c.vocab_size, c.emb_dim, dtype=c.dtype, param_dtype=c.param_dtype,
          embedding_init=nn.with_logical_partitioning(
              nn.linear.default_embed_init, ("vocab", "embed")), name="embedding")
      x_BTE = embedding(inputs)
    for i in range(c.num_layers):
      x_BTE = TransformerBlock(c, name=f"layers_{i}")(x_BTE, mask=mask, deterministic=deterministic)
    x_BTE = _layer_norm(c, "final_norm")(x_BTE)
    if c.tied_embedding:
      # The transposed embedding, scaled by 1/sqrt(E) as the authors' code does, so the logits
      # start at unit scale.
      return embedding.attend(x_BTE) / np.sqrt(c.emb_dim).astype(np.float32)
    return feed_forward.dense(c.output_dim, ("embed", "output"), c.dtype, c.param_dtype,
                              name="readout")(x_BTE)
