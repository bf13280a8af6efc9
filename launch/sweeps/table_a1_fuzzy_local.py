"""Table A1's first three fuzzy-logic rows at `size=local`, one setting, for a 2-core CPU.

softmax, linear, HYLA x 3 seeds = 9 jobs at lr 1e-3, wd 0.1 (the config's defaults; the
paper's 2 x 2 grid would be 36 jobs, 4x the ~1.5-2 CPU-hours of this one). 8-15 min per job
on a 2-core CPU alone (`size=local`: 6,000 steps instead of 50,000).

  python -m launch.run_local --sweep=table_a1_fuzzy_local --jobs=1"""

from launch.sweeps import common

EXPERIMENT = "fuzzy_logic"


def get_sweep():
  # Seed-major order, so that a partial run has every model at the same seeds.
  return [{"config": f"model={m},size=local", "optimizer.learning_rate": 1e-3,
           "optimizer.weight_decay": 0.1, "seed": seed}
          for seed in common.SEEDS for m in common.MAIN_MODELS]
