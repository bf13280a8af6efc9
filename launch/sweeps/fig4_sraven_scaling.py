"""Fig. 4: SRAVEN OOD accuracy vs model width, depth and number of training problems.

3 models x width {1, 2, 4} x depth {4, 8, 16} x {10M, 20M, 40M} problems x lr {3e-4, 1e-3}
x wd {0.1, 0.3} x warmup {1000, 3000} x 3 seeds = 1,944 jobs (the authors'
sweeps/raven.yaml). The number of problems sets `num_train_steps` at batch 128; evaluation
and checkpoint intervals stay at the config's (every 15,625 steps)."""

from launch.sweeps import common

EXPERIMENT = "sraven"
BATCH_SIZE = 128
PROBLEMS = (10_000_000, 20_000_000, 40_000_000)


def get_sweep():
  configs = [{"config": f"model={p['model']},size=paper,width={p['width']},depth={p['depth']}",
              "num_train_steps": p["problems"] // BATCH_SIZE}
             for p in common.product(model=list(common.MAIN_MODELS), width=[1, 2, 4],
                                     depth=[4, 8, 16], problems=list(PROBLEMS))]
  return common.grid_points(configs, EXPERIMENT)
