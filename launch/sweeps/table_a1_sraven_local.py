"""Table A1's first three SRAVEN rows at `size=local`, one setting, for a 2-core CPU.

softmax, linear, HYLA x 3 seeds = 9 jobs at lr 1e-3, wd 0.1, warmup 500 (the config's
`size=local` defaults; the paper's 2 x 2 x 2 grid would be 72 jobs). Each seed re-draws the
held-out split, as the paper did. `size=local` is 3 features, a 52k-parameter model and 12,000
steps: 5-10 min per job on a 2-core CPU alone.

  python -m launch.run_local --sweep=table_a1_sraven_local --jobs=1

Order: softmax and HYLA at every seed first (the comparison the README's main job is about),
linear last, so that a partial run already answers whether HYLA and softmax separate."""

from launch.sweeps import common

EXPERIMENT = "sraven"


def _point(model, seed):
  return {"config": f"model={model},size=local", "optimizer.learning_rate": 1e-3,
          "optimizer.weight_decay": 0.1, "seed": seed}


def get_sweep():
  pairs = [_point(m, seed) for seed in common.SEEDS for m in ("softmax", "hyla")]
  return pairs + [_point("linear", seed) for seed in common.SEEDS]
