"""Fig. A5: SRAVEN OOD accuracy vs the fraction of rule combinations held out.

The paper gives neither the task nor the fractions: SRAVEN is our assumption (fuzzy logic's
held-out fraction is already an axis of Fig. 2C).

3 models x held-out fraction {0.1, 0.25, 0.5, 0.75} x lr {3e-4, 1e-3} x wd {0.1, 0.3} x
warmup {1000, 3000} x 3 seeds = 288 jobs at `size=paper`, width 1, depth 4. 0.25 is the
paper's default; the other fractions bracket it.
Every split keeps each rule in some training combination (`tasks.sraven` re-draws)."""

from launch.sweeps import common

EXPERIMENT = "sraven"
HOLDOUT_FRACTIONS = (0.1, 0.25, 0.5, 0.75)


def get_sweep():
  configs = [{"config": f"model={p['model']},size=paper,width=1,depth=4",
              "task.holdout_fraction": p["fraction"]}
             for p in common.product(model=list(common.MAIN_MODELS),
                                     fraction=list(HOLDOUT_FRACTIONS))]
  return common.grid_points(configs, EXPERIMENT)
