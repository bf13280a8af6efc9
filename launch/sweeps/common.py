"""Axes shared by the paper's sweeps: seeds, models, Table A1's rows, the optimizer grids."""

import itertools
from typing import Any

from hypernet_attention.runs import registry

SEEDS = (0, 1, 2)
MAIN_MODELS = ("softmax", "linear", "hyla")
# Table A1's rows without MoE, as attention presets (hypernet_attention.presets.PRESETS).
TABLE_A1_PRESETS = (
    "softmax", "linear", "hyla", "linear_rmshead", "linear_rmshead_nonlinear_value",
    "hyla_no_rmshead", "hyla_linear_value", "hyla_linear_value_no_rmshead", "softmax_hyla",
    "hyla_deep")
# The "+ MoE" rows: these presets with a 5-expert, top-2 feed-forward layer.
TABLE_A1_MOE_PRESETS = MAIN_MODELS
# Table A1's rows: (preset, MoE) -> the row's name, in the table's order. The published
# numbers are each experiment's (`registry.Paper.table_a1`), as are the hyperparameter grids
# (`registry.Paper.grid`).
TABLE_A1_ROWS = {
    ("softmax", False): "Softmax attention",
    ("linear", False): "Linear attention",
    ("hyla", False): "HYLA",
    ("linear_rmshead", False): "Linear attention + RMSHead",
    ("linear_rmshead_nonlinear_value", False): "Linear attention + RMSHead + nonlinear value",
    ("hyla_no_rmshead", False): "HYLA - RMSHead",
    ("hyla_linear_value", False): "HYLA - nonlinearity",
    ("hyla_linear_value_no_rmshead", False): "HYLA - nonlinearity - RMSHead",
    ("softmax_hyla", False): "HYLA - RMSHead + softmax",
    ("hyla_deep", False): "HYLA + deep value network"}
TABLE_A1_ROWS.update({(p, True): TABLE_A1_ROWS[p, False] + " + MoE" for p in TABLE_A1_MOE_PRESETS})


# Short names of the grid's settings, in member names and tables.
SHORT = {"optimizer.learning_rate": "lr", "optimizer.weight_decay": "wd",
         "optimizer.warmup_steps": "warmup", "seed": "seed"}


def setting_text(setting: dict[str, Any]) -> str:
  """`lr 0.001, wd 0.1, warmup 100`: a grid setting in a table (None: not set)."""
  return ", ".join(f"{SHORT.get(k, k)} {v:g}" for k, v in setting.items() if v is not None)


def product(**axes: list[Any]) -> list[dict[str, Any]]:
  """The cartesian product of named axes as a list of dicts (the last axis varies fastest)."""
  names = list(axes)
  return [dict(zip(names, values)) for values in itertools.product(*axes.values())]


def grid_points(configs: list[dict[str, Any]], experiment: str) -> list[dict[str, Any]]:
  """Every config (a point without seed) x every setting of the paper's grid of `experiment`
  (its record's `paper.grid`) x every seed."""
  grid = registry.get(experiment).paper.grid
  return [{**c, **s, "seed": seed} for c in configs for s in product(**grid) for seed in SEEDS]


def table_a1_configs(config_template: str) -> list[dict[str, Any]]:
  """Table A1's 13 rows as points without seed; `config_template` has a `{model}` field."""
  rows = [{"config": config_template.format(model=m)} for m in TABLE_A1_PRESETS]
  rows += [{"config": config_template.format(model=m), "model.feed_forward": "moe"}
           for m in TABLE_A1_MOE_PRESETS]
  return rows
