"""Fig. 2C: fuzzy-logic OOD R^2 vs number of in-context examples and held-out fraction.

3 models x N in {16, 32, 64, 96} x held-out fraction in {0.3, 0.5, 0.7} x 3 seeds = 108 jobs.
"""

from launch.sweeps import common

EXPERIMENT = "fuzzy_logic"


def get_sweep():
  return [
      {"config": f"model={p['model']},size=paper", "task.num_examples": p["n"],
       "task.holdout_fraction": p["holdout"], "seed": p["seed"]}
      for p in common.product(model=list(common.MAIN_MODELS), n=[16, 32, 64, 96],
                              holdout=[0.3, 0.5, 0.7], seed=list(common.SEEDS))
  ]
