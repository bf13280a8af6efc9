"""Throughput of the real train step (`loop.Trainer.train_chunk`), without a workdir.

Used by `experiments/benchmark_training.py`; numbers go in notes and the README, not in
timed tests. For sequence models it also reports tokens/s and model FLOPs utilization:

  model FLOPs per token = 6 N + 12 L T E   (PaLM, Chowdhery et al. 2022, App. B)

N = parameters except the input embedding (a lookup), L layers, T sequence length,
E = total query/key width. The same formula for every attention variant, so HYLA's extra
value-network work is not credited: MFU compares useful work at equal model size.
MFU = FLOPs per token x tokens/s / the device's peak (`PEAK_TFLOPS` by device kind, or
given).
"""

from __future__ import annotations

import time
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from hypernet_attention.train import data
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
  row = {"experiment": config.experiment, "model": config.model.attention,
         "params": state_lib.count_params(state.params),
         "batch_size": config.batch_size, "steps_per_s": steps_per_s,
         "problems_per_s": steps_per_s * config.batch_size,
         "compile_s": compile_s - float(np.median(times)),
         "final_loss": float(np.asarray(metrics["loss"])[-1])}
  example = jax.eval_shape(lambda b: s.objective.encode(b)[0],
                           s.objective.source.example(config.batch_size))
  if s.model.config.input_kind == "embed":  # Token sequences: tokens/s and MFU.
    seq_len = example.shape[1]
    row["tokens_per_s"] = steps_per_s * config.batch_size * seq_len
    row["flops_per_token"] = flops_per_token(s.model.config, state.params, seq_len)
  return row


# Dense peak TFLOP/s of one device (bfloat16 matrix units), by `device_kind`.
PEAK_TFLOPS = {"NVIDIA H100 80GB HBM3": 989.4, "NVIDIA H200": 989.4, "NVIDIA A100-SXM4-80GB":
               312.0, "TPU v5 lite": 197.0, "TPU v5p": 459.0, "TPU v4": 275.0}


def flops_per_token(model_config, params: Any, seq_len: int) -> float:
  """6 N + 12 L T E (see the module docstring)."""
  params = nn.meta.unbox(params)
  embedding = params.get("embedding", {}).get("embedding")
  n = state_lib.count_params(params) - (0 if embedding is None else embedding.size)
  if model_config.tied_embedding:  # The table is also the read-out's matrix.
    n += 0 if embedding is None else embedding.size
  return 6.0 * n + 12.0 * model_config.num_layers * seq_len * model_config.qk_dim


def mfu(row: dict[str, Any], peak_tflops: float | None) -> float | None:
  """Model FLOPs utilization of a benchmark row over all devices, None without a peak."""
  peak = peak_tflops or PEAK_TFLOPS.get(jax.devices()[0].device_kind)
  if not peak or "tokens_per_s" not in row:
    return None
  return row["flops_per_token"] * row["tokens_per_s"] / (peak * 1e12 * jax.device_count())


def input_tokens_per_second(config: ml_collections.ConfigDict, seconds: float = 10.0
                            ) -> float:
  """Tokens/s this process's host input pipeline delivers alone (no model), after the
  first batch; tokens = rows x row length of every feature-0 array read."""
  s = loop.setup(config)
  if s.objective.source.on_device:
    raise ValueError(f"experiment {config.experiment!r} generates its data on device; "
                     "allowed: experiments with a host input pipeline (c4_lm).")
  iterator = s.objective.source.train(config.seed, data.local_batch_size(config.batch_size),
                                      jax.process_index(), jax.process_count())
  next(iterator)
  tokens, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    tokens += next(iterator)["targets"].size
  return tokens / (time.perf_counter() - start)
