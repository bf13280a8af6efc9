"""Table A1, fuzzy-logic column: every ablation row at N=32, 70% held out, 3 seeds.

39 jobs (13 rows x 3 seeds) at `size=paper` (50,000 steps, batch 128). Reported metric:
`ood/r2` in each job's summary.json, x100 (Table A1: softmax 63.28, linear 59.89,
HYLA 81.13). The paper picked lr in {1e-3, 3e-3} and wd in {0.03, 0.1} per model; add those
axes with `common.product` to reproduce the search.
"""

from launch.sweeps import common

EXPERIMENT = "fuzzy_logic"


def get_sweep():
  return common.table_a1_points("model={model},size=paper")
