"""Table A1, SRAVEN column: every row (incl. MoE), 4 layers, 20M problems, the grid.

13 rows x lr {3e-4, 1e-3} x wd {0.1, 0.3} x warmup {1000, 3000} x 3 seeds = 312 jobs at
`size=paper` (width 1, depth 4, 156,250 steps). The "+ MoE" rows swap the feed-forward layer
for 5 experts with top-2 routing. Reported metric: `ood/accuracy` of each row's best setting,
mean +- s.e. over seeds (`launch.collect`; Table A1: softmax 56.56, linear 56.30, HYLA
69.13). The authors' ablation sweep file fixes warmup at 1000 (104 of these jobs); the
paper's appendix states the full grid, which this runs."""

from launch.sweeps import common

EXPERIMENT = "sraven"


def get_sweep():
  return common.grid_points(
      common.table_a1_configs("model={model},size=paper,width=1,depth=4"), EXPERIMENT)
