"""Throughput of the real train step (`loop.Trainer.train_chunk`), without a workdir.

Used by `experiments/benchmark_training.py`; numbers go in notes and the README, not in
timed tests.
"""

from __future__ import annotations

import time
from typing import Any

import jax
import ml_collections
import numpy as np

from hypernet_attention.train import loop
from hypernet_attention.train import state as state_lib


def train_steps_per_second(config: ml_collections.ConfigDict, *, steps: int = 200,
                           repeats: int = 3) -> dict[str, Any]:
  """Median steps/s over `repeats` chunks of `steps` steps, after one compiling chunk."""
  s = loop.setup(config)
  trainer = loop.Trainer(config, s.objective, s.model, s.tx, s.mesh, s.shardings)
  state = loop.init_state(config, s.init_fn, s.shardings)
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
  return {"experiment": config.experiment, "model": config.model.attention,
          "params": state_lib.count_params(state.params),
          "batch_size": config.batch_size, "steps_per_s": steps_per_s,
          "problems_per_s": steps_per_s * config.batch_size,
          "compile_s": compile_s - float(np.median(times)),
          "final_loss": float(np.asarray(metrics["loss"])[-1])}
