"""Axes shared by the paper's sweeps."""

import itertools
from typing import Any

SEEDS = (0, 1, 2)
MAIN_MODELS = ("softmax", "linear", "hyla")
# Table A1's rows without MoE, as attention presets (hypernet_attention.attention.PRESETS).
TABLE_A1_PRESETS = (
    "softmax", "linear", "hyla", "linear_rmshead", "linear_rmshead_nonlinear_value",
    "hyla_no_rmshead", "hyla_linear_value", "hyla_linear_value_no_rmshead", "softmax_hyla",
    "hyla_deep")
# The "+ MoE" rows: these presets with a 5-expert, top-2 feed-forward layer.
TABLE_A1_MOE_PRESETS = MAIN_MODELS


def product(**axes: list[Any]) -> list[dict[str, Any]]:
  """The cartesian product of named axes as a list of dicts (the last axis varies fastest)."""
  names = list(axes)
  return [dict(zip(names, values)) for values in itertools.product(*axes.values())]


def table_a1_points(config_template: str) -> list[dict[str, Any]]:
  """Every Table A1 row x seed; `config_template` has a `{model}` field."""
  points = [{"config": config_template.format(model=p["model"]), "seed": p["seed"]}
            for p in product(model=list(TABLE_A1_PRESETS), seed=list(SEEDS))]
  points += [{"config": config_template.format(model=p["model"]),
              "model.feed_forward": "moe", "seed": p["seed"]}
             for p in product(model=list(TABLE_A1_MOE_PRESETS), seed=list(SEEDS))]
  return points
