"""Axes shared by the paper's sweeps: seeds, models, Table A1's rows, the optimizer grids."""

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
# Table A1 as published (mean +- s.e. over 3 seeds, x100): (preset, MoE) ->
# (row name, {experiment: (mean, s.e.)}).
TABLE_A1_PAPER = {
    ("softmax", False): ("Softmax attention", {"fuzzy_logic": (63.28, 2.31),
                                               "sraven": (56.56, 1.05)}),
    ("linear", False): ("Linear attention", {"fuzzy_logic": (59.89, 5.22),
                                             "sraven": (56.30, 1.11)}),
    ("hyla", False): ("HYLA", {"fuzzy_logic": (81.13, 7.77), "sraven": (69.13, 1.90)}),
    ("linear_rmshead", False): ("Linear attention + RMSHead", {
        "fuzzy_logic": (68.93, 5.10), "sraven": (59.01, 2.50)}),
    ("linear_rmshead_nonlinear_value", False): (
        "Linear attention + RMSHead + nonlinear value", {"fuzzy_logic": (56.91, 4.25),
                                                        "sraven": (55.38, 0.32)}),
    ("hyla_no_rmshead", False): ("HYLA - RMSHead", {"fuzzy_logic": (81.27, 7.88),
                                                    "sraven": (62.53, 5.73)}),
    ("hyla_linear_value", False): ("HYLA - nonlinearity", {"fuzzy_logic": (84.54, 5.32),
                                                           "sraven": (56.54, 0.21)}),
    ("hyla_linear_value_no_rmshead", False): ("HYLA - nonlinearity - RMSHead", {
        "fuzzy_logic": (79.42, 7.43), "sraven": (56.33, 1.41)}),
    ("softmax_hyla", False): ("HYLA - RMSHead + softmax", {"fuzzy_logic": (70.98, 7.08),
                                                           "sraven": (38.21, 2.98)}),
    ("hyla_deep", False): ("HYLA + deep value network", {"fuzzy_logic": (87.65, 4.54),
                                                         "sraven": (66.59, 0.08)}),
    ("softmax", True): ("Softmax attention + MoE", {"fuzzy_logic": (63.83, 6.07),
                                                    "sraven": (57.68, 1.31)}),
    ("linear", True): ("Linear attention + MoE", {"fuzzy_logic": (60.09, 6.16),
                                                  "sraven": (64.34, 4.3)}),
    ("hyla", True): ("HYLA + MoE", {"fuzzy_logic": (82.37, 6.55), "sraven": (66.94, 3.94)}),
}

# The per-method hyperparameter grids (the paper's appendix, the authors' sweeps/*.yaml), as
# config overrides; every method's reported number is the best grid point's mean over seeds.
FUZZY_GRID = {"optimizer.learning_rate": [1e-3, 3e-3], "optimizer.weight_decay": [0.03, 0.1]}
SRAVEN_GRID = {"optimizer.learning_rate": [3e-4, 1e-3], "optimizer.weight_decay": [0.1, 0.3],
               "optimizer.warmup_steps": [1000, 3000]}


def product(**axes: list[Any]) -> list[dict[str, Any]]:
  """The cartesian product of named axes as a list of dicts (the last axis varies fastest)."""
  names = list(axes)
  return [dict(zip(names, values)) for values in itertools.product(*axes.values())]


def grid_points(configs: list[dict[str, Any]], grid: dict[str, list[Any]],
                seeds=SEEDS) -> list[dict[str, Any]]:
  """Every config (a point without seed) x every grid setting x every seed."""
  settings = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
  return [{**c, **s, "seed": seed} for c in configs for s in settings for seed in seeds]


def table_a1_configs(config_template: str) -> list[dict[str, Any]]:
  """Table A1's 13 rows as points without seed; `config_template` has a `{model}` field."""
  rows = [{"config": config_template.format(model=m)} for m in TABLE_A1_PRESETS]
  rows += [{"config": config_template.format(model=m), "model.feed_forward": "moe"}
           for m in TABLE_A1_MOE_PRESETS]
  return rows
