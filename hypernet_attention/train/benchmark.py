"""Throughput of the real train step (`loop.Trainer.train_chunk`), without a workdir.

Used by `experiments/benchmark_training.py`; numbers go in notes and the README, not in
timed tests.
"""

from __future__ import annotations

import importlib
import os
import sys
import time
from typing import Any

import jax
import numpy as np

from hypernet_attention.train import loop
from hypernet_attention.train import state as state_lib

# experiment name -> config module under experiments/configs/.
CONFIGS = {"sraven": "sraven", "fuzzy_logic": "fuzzy_logic"}


def load_config(experiment: str, arg: str, overrides: str = ""):
  """`experiments/configs/<experiment>.py:get_config(arg)` with dotted `k=v` overrides."""
  if experiment not in CONFIGS:
    raise ValueError(f"unknown experiment {experiment!r}; allowed: {sorted(CONFIGS)}")
  repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  if repo not in sys.path:
    sys.path.insert(0, repo)
  module = importlib.import_module(f"experiments.configs.{CONFIGS[experiment]}")
  config = module.get_config(arg)
  for item in (s for s in overrides.split(",") if s.strip()):
    key, value = item.split("=", 1)
    *parents, leaf = key.strip().split(".")
    node = config
    for p in parents:
      node = node[p]
    if leaf not in node:
      raise ValueError(f"unknown config key {key!r}")
    old = node[leaf]
    node[leaf] = value if old is None or isinstance(old, str) else type(old)(value)
  return config


def train_steps_per_second(experiment: str, arg: str, *, steps: int = 200, repeats: int = 3,
                           overrides: str = "") -> dict[str, Any]:
  """Median steps/s over `repeats` chunks of `steps` steps, after one compiling chunk."""
  config = load_config(experiment, arg, overrides)
  objective, model, tx, mesh, init_fn, _, shardings = loop.setup(config)
  trainer = loop.Trainer(config, objective, model, tx, mesh, shardings)
  state = loop.init_state(config, init_fn, shardings)
  start = time.perf_counter()
  state, metrics = trainer.train_chunk(state, steps)
  jax.block_until_ready(metrics)
  compile_s = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    state, metrics = trainer.train_chunk(state, steps)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  steps_per_s = steps / float(np.median(times))
  return {"experiment": experiment, "model": config.model.attention,
          "params": state_lib.count_params(state.params),
          "batch_size": config.batch_size, "steps_per_s": steps_per_s,
          "problems_per_s": steps_per_s * config.batch_size,
          "compile_s": compile_s - float(np.median(times)),
          "final_loss": float(np.asarray(metrics["loss"])[-1])}
