"""The model's names as plain data: Table A1's attention presets and the other named choices.

Declared once, without JAX, so that the launching machine (`runs/preflight.py`,
`config_checks.check_preset`) checks a config against the names the model builds from: a preset's
fields name entries of `attention.VALUE_NETWORKS` and `ops/reference.py`'s NORMALIZATIONS and
ACTIVATIONS (`tests/models/test_attention.py` checks each row), and `check_model_names` is the one
check of the others, called by the model (`transformer.TransformerConfig`) and preflight alike."""

from __future__ import annotations

from typing import Any, NamedTuple

from hypernet_attention import errors


class AttentionPreset(NamedTuple):
  """One row of Table A1 (its label: `launch/sweeps/common.py`): how scores become the
  latent code, and what it configures."""
  normalization: str  # reference.NORMALIZATIONS
  value_network: str  # attention.VALUE_NETWORKS
  activation: str  # reference.ACTIVATIONS; 'identity' for linear value networks


PRESETS: dict[str, AttentionPreset] = {
    "softmax": AttentionPreset("softmax", "linear", "identity"),
    "linear": AttentionPreset("linear", "linear", "identity"),
    "hyla": AttentionPreset("rms_head", "mlp", "relu"),
    "linear_rmshead": AttentionPreset("rms_head", "linear", "identity"),
    # Table A1's "Linear attention + RMSHead + nonlinear value", a row the authors' code has
    # no configuration for; our reading (experiments/reference.md): y_q = sum_h W_h^out sum_k
    # a_hqk phi(W_h^v x_k), only the read-out generated: it ablates the nonlinearity alone.
    "linear_rmshead_nonlinear_value": AttentionPreset("rms_head", "nonlinear_value", "relu"),
    "hyla_no_rmshead": AttentionPreset("linear", "mlp", "relu"),
    "hyla_linear_value": AttentionPreset("rms_head", "mlp", "identity"),
    "hyla_linear_value_no_rmshead": AttentionPreset("linear", "mlp", "identity"),
    "softmax_hyla": AttentionPreset("softmax", "mlp", "relu"),
    "hyla_deep": AttentionPreset("rms_head", "deep_mlp", "relu")}

# The model's other names, each kind declared here alone (tests/models/test_registered_names.py
# checks that each has its builder): positions, feed-forwards (name -> class of `feed_forward`)
# and the implementations whose runners `ops.dispatch` keys by these names.
POSITIONS = ("none", "t5", "rope")
# `model.activation`, the value network's (None: the preset's); `ops/reference.py`'s.
ACTIVATIONS = (None, "relu", "gelu", "silu", "sigmoid", "tanh", "identity")
FEED_FORWARDS = {"gelu_mlp": "GeluMlp", "swiglu": "SwiGlu", "moe": "MoE"}
IMPLEMENTATIONS = ("auto", "reference", "factored", "blockwise", "mosaic")
MODEL_NAMES = {"feed_forward": FEED_FORWARDS, "position": POSITIONS,
               "implementation": IMPLEMENTATIONS, "activation": ACTIVATIONS}


def check_model_names(model: Any, prefix: str = "") -> None:
  """`errors.BadInput` in one line for the first field of `MODEL_NAMES` that `model` (a
  `TransformerConfig`, or a config's `model` group: anything with these attributes) sets to
  a name not allowed; `prefix` names the group in the message ('config.model.')."""
  for field, allowed in MODEL_NAMES.items():
    if hasattr(model, field):
      errors.check_choice(prefix + field, getattr(model, field), allowed)
