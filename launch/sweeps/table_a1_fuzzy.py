"""Table A1, fuzzy-logic column: every row (incl. MoE) at N=32, 70% held out, the grid.

13 rows x lr {1e-3, 3e-3} x wd {0.03, 0.1} x 3 seeds = 156 jobs at `size=paper` (50,000 steps, batch
128; 2-3 GPU-minutes each in the paper). Reported metric: `ood/r2` x100 of each row's best setting,
mean +- s.e. over seeds (`launch.collect`; Table A1: softmax 63.28, linear 59.89, HYLA 81.13)."""

from launch.sweeps import common

EXPERIMENT = "fuzzy_logic"


def get_sweep():
  return common.grid_points(common.table_a1_configs("model={model},size=paper"), EXPERIMENT)
