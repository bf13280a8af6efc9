"""A smoke sweep for testing the executors and the collector end to end in seconds.

Fuzzy logic `size=smoke`, softmax and HYLA, seed 0: 2 jobs."""

EXPERIMENT = "fuzzy_logic"


def get_sweep():
  return [{"config": f"model={m},size=smoke", "optimizer.learning_rate": 1e-3, "seed": 0}
          for m in ("softmax", "hyla")]
