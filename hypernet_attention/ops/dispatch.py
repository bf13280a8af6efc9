"""One entry point for attention; runs an implementation named, or chosen by shape (`auto`).

Implementations (all with `reference.attention`'s contract, plus `is_causal`):
  reference  the einsums of the paper; materializes (B, H, Q, K) and, for MLP value
             networks, (B, Q, K, V). Fastest for short sequences with narrow heads.
  blockwise  pure-JAX tiles with a recomputing custom VJP (`blockwise.py`); any backend.
  factored   HYLA's MLP value network through one RMSHead/dropout scalar per (q, k) pair
             (`factored.py`): per-example matmuls instead of the reference's transposed
             code and tiny batched matmuls. Short sequences with narrow heads, on CPU.
  mosaic     HYLA fused for Hopper in Pallas Mosaic GPU (`mosaic_kernel.py`): `auto` takes
             it where its modeled time, calibrated on a GPU window's rows, is under
             blockwise's (`kernel_cost.py`: by batch, heads, query tiles and pairs).
  auto       softmax + linear value network (plain softmax attention) goes to
             `jax.nn.dot_product_attention` (cuDNN flash on GPU where cuDNN supports the
             call); otherwise `choose_implementation` picks by backend and shape.
Each fast path declares what it computes (`reference.Computes`, collected in `FAST_PATHS`;
`deep_mlp`, HYLA+, has no tiled kernel): `auto` takes one only for what it declares (the
reference runs the rest); a fast path named explicitly refuses the rest in one line. Before
that, every call's operands meet `reference.check_operands`, whichever path runs them, and on
each a NaN or Inf in a masked key or value contributes nothing (`reference.isolate_nonfinite`).
"""

from __future__ import annotations

import functools
from typing import Optional

import jax
import jax.numpy as jnp

from hypernet_attention import errors
from hypernet_attention import presets
from hypernet_attention.ops import blockwise
from hypernet_attention.ops import dropout
from hypernet_attention.ops import factored
from hypernet_attention.ops import kernel_cost
from hypernet_attention.ops import mosaic_kernel
from hypernet_attention.ops import reference
from hypernet_attention.ops import sharded
from hypernet_attention.ops import tiling

# What each fast implementation computes; the reference computes every registered name.
FAST_PATHS: dict[str, reference.Computes] = {"factored": factored.COMPUTES,
                                             "blockwise": blockwise.COMPUTES}
# The fused Hopper kernels (`mosaic_kernel.py`): by name they refuse other devices, float32
# and what they do not compute in one line; `auto` takes them only where
# `mosaic_kernel.runs_here` and where `kernel_cost.mosaic_faster`.
EXPLICIT_PATHS: dict[str, reference.Computes] = {"mosaic": mosaic_kernel.COMPUTES}
# `auto`'s path for plain softmax attention (`_softmax_attention`).
SOFTMAX_ATTENTION = reference.Computes("jax.nn.dot_product_attention", ("softmax",),
                                       ("linear",))

# Thresholds chosen by measurement on a 2-core CPU; re-measure on new hardware or kernels with
# `experiments/benchmark_attention.py` (kernels, fwd+bwd) and `experiments/benchmark_training.py`
# (whole train steps). Without dropout the tiles win from about SRAVEN's length (T=36) on, and their
# lead grows with T: only very short sequences take the reference.
REFERENCE_MAX_PAIRS = 24 * 24
# With dropout (training) both paths draw the same hash mask, but at the synthetic tasks' lengths
# (SRAVEN 36, fuzzy logic 33) the tiles' overhead was not repaid in the real train step: those train
# off the tiles (the reference, or `factored` for HYLA on CPU), longer sequences on blockwise.
REFERENCE_MAX_PAIRS_DROPOUT = 36 * 36
# Where `auto` would take the reference on CPU, an MLP value network with per-pair
# normalization (HYLA, and HYLA without RMSHead) takes `factored` up to this per-head width:
# it does D times the reference's value-network multiply-adds, but as big matmuls. It was
# faster in the real train step at D = 4 (SRAVEN paper size) and D = 2 (fuzzy logic)
# (`experiments/benchmark_training.py`, write-up in
# experiments/results/training_throughput.md); wider heads untested.
FACTORED_MAX_HEAD_DIM = 8
# Blockwise's largest tiles (block_q, block_k) per backend, each measured fastest there
# (experiments/results/kernels.md, "Blockwise's tiles per backend"; TPU: whole MXU tiles); per
# length, `tiling.balanced_block` splits each sequence into equal tiles no larger than these
# (T=130: two of 65, not 128 + 2 padded to 256). Backend-specific on purpose: the CPU's
# cache-sized tiles stay in cache, and would starve a GPU's matrix units.
BLOCKS = {"cpu": (32, 64), "gpu": (256, 256), "tpu": (128, 128)}


def choose_implementation(
    q_len: int, k_len: int, normalization: str, value_network: str,
    backend: Optional[str] = None, dropout: bool = False, head_dim: Optional[int] = None,
    factorable: bool = False, fused: bool = False, batch: int = 1, heads: int = 8,
    v_dim: int = 64, causal: bool = False,
) -> str:
  """The `auto` choice for everything except plain softmax attention without dropout:
  a fast path only for what it declares (`FAST_PATHS`), the reference otherwise.

  `head_dim`, `factorable` (mask and bias as `factored.supports` needs them): whether the
  short-sequence choice may be `factored` instead of the reference. `fused`: whether the
  fused Hopper kernels can run the call here (`mosaic_kernel.runs_here`); then `batch`, `heads`,
  `v_dim` and `causal` decide, with the lengths, whether they are faster than blockwise
  (`kernel_cost.mosaic_faster`: how their CTAs fill the GPU, from a window's rows).
  """
  backend = backend or jax.default_backend()
  if q_len * k_len <= (REFERENCE_MAX_PAIRS_DROPOUT if dropout else REFERENCE_MAX_PAIRS):
    if (backend == "cpu" and factorable and head_dim is not None
        and head_dim <= FACTORED_MAX_HEAD_DIM
        and FAST_PATHS["factored"].covers(normalization, value_network)):
      return "factored"
    return "reference"
  if not FAST_PATHS["blockwise"].covers(normalization, value_network):
    return "reference"
  if fused and kernel_cost.mosaic_faster(batch, q_len, k_len, heads, v_dim, causal):
    return "mosaic"
  return "blockwise"  # XLA gives its einsums to the matrix units, on every backend.


def _softmax_attention(query, key, value, bias, mask, is_causal):
  """Softmax attention through `jax.nn.dot_product_attention` (cuDNN when it applies).

  Unlike the reference, a query row with no visible key averages all values (XLA) instead
  of returning 0; such rows only occur for padding.
  """
  full = (query.shape[0], query.shape[2], query.shape[1], key.shape[1])
  key, value, poisoned_BQ = reference.isolate_nonfinite(key, value, mask, full[2], is_causal)
  bias4, mask4 = tiling.as_rank4(bias, query.dtype), tiling.as_rank4(mask)
  use_cudnn = (
      jax.default_backend() == "gpu"
      and query.dtype in (jnp.bfloat16, jnp.float16)
      and query.shape[-1] % 8 == 0 and query.shape[-1] <= 128
      and mask4 is None
      and (bias4 is None or bias4.shape[2:] == full[2:]))
  return reference.reveal_nonfinite(jax.nn.dot_product_attention(
      query, key, value, bias=bias4, mask=mask4, is_causal=is_causal,
      implementation="cudnn" if use_cudnn else None), poisoned_BQ)


def attention(query_BQHD: jax.Array, key_BKHD: jax.Array, value_BKHV: jax.Array, *,
              bias: Optional[jax.Array] = None, mask: Optional[jax.Array] = None,
              is_causal: bool = False, normalization: str = "rms_head", value_network: str = "mlp",
              activation: str = "relu", value_weight_HVV: Optional[jax.Array] = None,
              eps: float = reference.RMS_HEAD_EPS, implementation: str = "auto",
              dropout_rate: float = 0.0, dropout_seed: Optional[jax.Array] = None) -> jax.Array:
  """(B, Q, H, D) x (B, K, H, D) x (B, K, H, V) -> (B, Q, H, V).

  `mask`: bool broadcastable to (B, H, Q, K), True = attend. `is_causal`: additionally
  apply a causal mask (query i sees keys <= i, counted from the first position of both,
  as in `jax.nn.dot_product_attention`); fast implementations use it to skip masked tiles.
  `bias`: float broadcastable to (B, H, Q, K), added to the scores before normalization.
  `dropout_rate`, `dropout_seed`: dropout on the latent code with one (Q, K) mask shared by
  batch and heads, drawn by `dropout.py`'s hash of (seed, q, k): every implementation
  drops the same pairs, and the tiled ones recompute the mask per tile.
  """
  # Every path, before any work.
  reference.check_operands(query_BQHD, key_BKHD, value_BKHV, bias=bias, mask=mask, eps=eps)
  errors.check_choice("implementation", implementation, presets.IMPLEMENTATIONS)
  errors.check_choice("normalization", normalization, reference.NORMALIZATIONS)
  errors.check_choice("value_network", value_network, reference.VALUE_NETWORKS)
  reference.get_activation(activation)
  dropout.check_rate(dropout_rate)
  if dropout_rate and dropout_seed is None:
    raise ValueError(f"dropout_rate={dropout_rate} needs dropout_seed (an int32 scalar).")
  q_len, k_len = query_BQHD.shape[1], key_BKHD.shape[1]
  if implementation == "auto":
    if (SOFTMAX_ATTENTION.covers(normalization, value_network) and not dropout_rate
        and query_BQHD.shape[-1] == value_BKHV.shape[-1]):
      return _softmax_attention(query_BQHD, key_BKHD, value_BKHV, bias, mask, is_causal)
    implementation = choose_implementation(
        q_len, k_len, normalization, value_network, dropout=bool(dropout_rate),
        head_dim=query_BQHD.shape[-1],
        factorable=factored.supports(normalization, value_network, mask, bias),
        batch=query_BQHD.shape[0], heads=query_BQHD.shape[2], v_dim=value_BKHV.shape[-1],
        causal=is_causal,
        fused=mosaic_kernel.runs_here(query_BQHD, value_BKHV, normalization, value_network,
                                      activation, bias=bias, mask=mask,
                                      dropout_rate=dropout_rate))
  elif implementation in FAST_PATHS or implementation in EXPLICIT_PATHS:
    {**FAST_PATHS, **EXPLICIT_PATHS}[implementation].check(normalization, value_network)
  kwargs = dict(normalization=normalization, value_network=value_network,
                activation=activation, eps=eps, dropout_rate=dropout_rate)
  if implementation in ("reference", "factored"):
    mask = reference.with_causal(mask, is_causal, q_len, k_len)
    if implementation == "factored":
      return factored.attention(query_BQHD, key_BKHD, value_BKHV, bias=bias, mask=mask,
                                dropout_seed=dropout_seed, **kwargs)
    return reference.attention(query_BQHD, key_BKHD, value_BKHV, bias=bias, mask=mask,
                               value_weight_HVV=value_weight_HVV,
                               dropout_seed=dropout_seed, **kwargs)
  if implementation == "blockwise":
    # The largest tiles (an unlisted backend takes the GPU's); blockwise balances them.
    block_q, block_k = BLOCKS.get(jax.default_backend(), BLOCKS["gpu"])
    kernel = functools.partial(blockwise.attention, block_q=block_q, block_k=block_k)
  elif implementation == "mosaic":
    mosaic_kernel.check_device(query_BQHD.dtype)  # One line off Hopper, not a compile error.
    kernel = mosaic_kernel.attention
  else:
    raise ValueError(f"dispatch has no runner for implementation={implementation!r}.")
  # Under a batch-sharded mesh (`jax.set_mesh`), one kernel call per device.
  return sharded.per_device(
      lambda q, k, v, b, m, seed: kernel(q, k, v, bias=b, mask=m, dropout_seed=seed,
                                         is_causal=is_causal, **kwargs),
      query_BQHD, key_BKHD, value_BKHV, bias, mask, dropout_seed)
