"""One entry point for attention; picks an implementation (reference, blockwise, pallas).

PLACEHOLDER being replaced by the fast-kernels work (issue 5): for now every call goes to
`reference.attention`.
"""

from __future__ import annotations

from typing import Optional

import jax

from hypernet_attention.ops import reference

IMPLEMENTATIONS = ("auto", "reference")


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
    value_weight_HVV: Optional[jax.Array] = None,
    eps: float = reference.RMS_HEAD_EPS,
    implementation: str = "auto",
) -> jax.Array:
  """(B, Q, H, D) x (B, K, H, D) x (B, K, H, V) -> (B, Q, H, V).

  `mask`: bool broadcastable to (B, H, Q, K), True = attend. `is_causal`: additionally
  apply a causal mask (requires Q == K; query i sees keys <= i), as in
  `jax.nn.dot_product_attention`; fast implementations use it to skip masked tiles.
  `bias`: float broadcastable to (B, H, Q, K), added to the scores before normalization.
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(
        f"Unknown implementation {implementation!r}; allowed: {', '.join(IMPLEMENTATIONS)}."
    )
  if is_causal:
    q_len, k_len = query_BQHD.shape[1], key_BKHD.shape[1]
    causal_QK = jax.numpy.tril(jax.numpy.ones((q_len, k_len), bool))
    mask = causal_QK if mask is None else jax.numpy.logical_and(mask, causal_QK)
  return reference.attention(
      query_BQHD, key_BKHD, value_BKHV, bias=bias, mask=mask,
      normalization=normalization, value_network=value_network, activation=activation,
      value_weight_HVV=value_weight_HVV, eps=eps,
  )
