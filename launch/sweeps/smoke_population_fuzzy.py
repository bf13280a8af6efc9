"""A smoke sweep that groups into populations, for testing them end to end in a minute.

Fuzzy logic `size=smoke`, softmax and HYLA, seeds 0 and 1: 4 jobs, which `launch.run_local`
runs as 2 populations of 2 members (`--single_runs`: 4 separate runs)."""

EXPERIMENT = "fuzzy_logic"


def get_sweep():
  return [{"config": f"model={m},size=smoke", "seed": seed}
          for m in ("softmax", "hyla") for seed in (0, 1)]
