"""Fig. 2C: fuzzy-logic OOD R^2 vs number of in-context examples and held-out fraction.

3 models x N {16, 32, 64, 96} x held-out fraction {0.3, 0.5, 0.7} x lr {1e-3, 3e-3} x
wd {0.03, 0.1} x 3 seeds = 432 jobs at `size=paper` (the authors' sweeps/logic.yaml).
Each (model, N, fraction) cell reports its best setting (`launch.collect`)."""

from launch.sweeps import common

EXPERIMENT = "fuzzy_logic"


def get_sweep():
  configs = [{"config": f"model={p['model']},size=paper", "task.num_examples": p["n"],
              "task.holdout_fraction": p["holdout"]}
             for p in common.product(model=list(common.MAIN_MODELS), n=[16, 32, 64, 96],
                                     holdout=[0.3, 0.5, 0.7])]
  return common.grid_points(configs, EXPERIMENT)
