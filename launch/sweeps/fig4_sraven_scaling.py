"""Fig. 4: SRAVEN OOD accuracy vs model width, depth and number of training problems.

3 models x width {1, 2, 4} x depth {4, 8, 16} x {10M, 20M, 40M} problems x 3 seeds =
243 jobs. The number of problems sets `num_train_steps` at batch 128; evaluation and
checkpoint intervals stay at the config's (every 15,625 steps).
"""

from launch.sweeps import common

EXPERIMENT = "sraven_scaling"
BATCH_SIZE = 128
PROBLEMS = (10_000_000, 20_000_000, 40_000_000)


def get_sweep():
  return [
      {"config": f"model={p['model']},size=paper,width={p['width']},depth={p['depth']}",
       "num_train_steps": p["problems"] // BATCH_SIZE, "seed": p["seed"]}
      for p in common.product(model=list(common.MAIN_MODELS), width=[1, 2, 4],
                              depth=[4, 8, 16], problems=list(PROBLEMS),
                              seed=list(common.SEEDS))
  ]
