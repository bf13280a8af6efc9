"""Table A1, SRAVEN column: every ablation row, 4 layers, 20M problems, 3 seeds.

39 jobs (13 rows x 3 seeds) at `size=paper` (width 1, depth 4, 156,250 steps). The "+ MoE"
rows swap the feed-forward layer for 5 experts with top-2 routing. Reported metric:
`ood/accuracy` in each job's summary.json (Table A1: softmax 56.56, linear 56.30, HYLA 69.13).
"""

from launch.sweeps import common

EXPERIMENT = "sraven_scaling"


def get_sweep():
  return common.table_a1_points("model={model},size=paper,width=1,depth=4")
