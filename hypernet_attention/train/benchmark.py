"""Throughput of the real train step (`trainer.Trainer.train_chunk`), without a workdir.

Used by `experiments/benchmark_training.py`; numbers go in experiments/results/, not in
timed tests. Several models are timed interleaved in one process, so their ratio is robust
to a shared, noisy machine. For sequence models it also reports tokens/s and model FLOPs
utilization:

  model FLOPs per token = 6 N + 12 L T E   (PaLM, Chowdhery et al. 2022, App. B)

N = parameters except the input embedding (a lookup), L layers, T sequence length,
E = total query/key width. The same formula for every attention variant, so HYLA's extra
value-network work is not credited: MFU compares useful work at equal model size.
MFU = FLOPs per token x tokens/s / the device's peak (`PEAK_TFLOPS` by device kind, or
given).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from hypernet_attention.train import build
from hypernet_attention.train import config_lib
from hypernet_attention.train import data
from hypernet_attention.train import memory
from hypernet_attention.train import population
from hypernet_attention.train import registry
from hypernet_attention.train import run_files
from hypernet_attention.train import state as state_lib
from hypernet_attention.train import trainer as trainer_lib


def model_config(experiment: str, spec: str, size: str,
                 overrides: str = "") -> ml_collections.ConfigDict:
  """The config that `experiments/benchmark_training.py` and `profile_step.py` time.

  `spec` is an attention preset, optionally with its own overrides after '@'
  (`hyla@model.implementation=reference`); `overrides` (comma-separated dotted `key=value`
  pairs) apply to every spec, before the spec's own. Bad presets, sizes or keys raise
  ValueError / KeyError / AttributeError with a one-line message.
  """
  preset, *own = spec.split("@")
  config = registry.get(experiment).get_config(f"model={preset},size={size}")
  for item in (s for s in ",".join((overrides, *own)).split(",") if s.strip()):
    key, value = (t.strip() for t in item.split("=", 1))
    config_lib.set_dotted(config, key, value)
  return config


@dataclasses.dataclass
class _Prepared:
  """One config's trainer and state (a single run's or a population's), compiled for
  chunks of `steps` steps."""
  config: ml_collections.ConfigDict
  setup: build.Setup
  trainer: Any  # trainer.Trainer or population.PopulationTrainer.
  state: Any
  compile_s: float = 0.0
  final_loss: float = float("nan")
  members: int = 1
  bytes: int = 0  # Device bytes of the compiled chunk (XLA's memory analysis; 0: unknown).
  compiled: Any = None  # The chunk `prepare` compiled (its length: `prepare`'s `steps`).

  def run_chunk(self, steps: int) -> float:
    """Seconds for one chunk of `steps` steps (the state advances)."""
    start = time.perf_counter()
    self.state, metrics = self.trainer.train_chunk(self.state, steps)
    jax.block_until_ready(metrics)
    self.final_loss = float(np.mean(np.asarray(metrics.per_step["loss"])[..., -1]))
    return time.perf_counter() - start


def step_cost(config: ml_collections.ConfigDict) -> dict[str, float]:
  """XLA's cost analysis of one compiled training step of `config` (a 1-step chunk, since
  the analysis may count a loop's body once): FLOPs and bytes accessed, all members together.

  Why: a population's gain is capped by what a step must move. On one H200 the paper-size
  SRAVEN step of 24 members took 16.5 ms, about its bytes over the HBM bandwidth, so more
  members could not help (`experiments/results/training_throughput.md`).
  """
  analysis = prepare(config, 1).compiled.cost_analysis()
  analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  return {"flops": float(analysis.get("flops", 0.0)),
          "bytes_accessed": float(analysis.get("bytes accessed", 0.0))}


def population_config(config: ml_collections.ConfigDict,
                      members: int) -> ml_collections.ConfigDict:
  """`config` as a population of `members` seeds (0, 1, ...); 1: the single run itself."""
  config = ml_collections.ConfigDict(config.to_dict())
  if members > 1:
    config.population.members = tuple({"seed": i} for i in range(members))
  return config


def prepare(config: ml_collections.ConfigDict, steps: int) -> _Prepared:
  """Builds `config`'s trainer and state and runs one chunk (compiling it)."""
  if run_files.is_population(config):
    p = population.setup(config)
    trainer = population.PopulationTrainer(p)
    prepared = _Prepared(config, p.single, trainer, trainer.init_state(), members=p.size)
  else:
    s = build.setup(config)
    trainer = trainer_lib.Trainer(config, s.objective, s.model, s.tx, s.mesh, s.shardings)
    prepared = _Prepared(config, s, trainer, build.init_state(config, s.init_fn, s.shardings))
  # Compiled ahead and refused in one line if it cannot fit (as training's first chunk is,
  # `loop.py`), before a run that would die with an allocator's traceback.
  compile_start = time.perf_counter()
  prepared.compiled = prepared.trainer.compile_chunk(prepared.state, steps)
  fit = memory.check_fits(prepared.compiled, list(prepared.setup.mesh.devices.flat),
                          config.batch_size, prepared.members)
  prepared.bytes = fit.need.total if fit.need else 0
  ahead_s = time.perf_counter() - compile_start
  prepared.compile_s = ahead_s + prepared.run_chunk(steps)  # Runs the chunk once.
  return prepared


def train_steps_per_second(configs: Sequence[ml_collections.ConfigDict], *, steps: int = 200,
                           repeats: int = 3, labels: Sequence[str] | None = None,
                           log=print) -> list[dict[str, Any]]:
  """Median steps/s per config over `repeats` rounds of one `steps`-step chunk each.

  The configs are compiled first, then timed interleaved (A, B, C, A, B, C, ...), so a
  slow phase of a shared machine hits every model alike. `step_time_ratio` is the median
  over rounds of the config's chunk time / the first config's chunk time in that round.
  `labels` (default: the attention presets) name the configs in the progress lines.
  """
  labels = labels or [c.model.attention for c in configs]
  prepared = []
  for config, label in zip(configs, labels):
    prepared.append(prepare(config, steps))
    log(f"compiled {label}: {prepared[-1].compile_s:.1f} s, "
        f"{prepared[-1].bytes / 2**20:.1f} MiB on device")
  times = [[] for _ in prepared]
  for r in range(repeats):
    for p, t in zip(prepared, times):
      t.append(p.run_chunk(steps))
    log(f"round {r + 1}/{repeats}: " + ", ".join(
        f"{label} {steps / t[-1]:.3g}" for label, t in zip(labels, times)) + " steps/s")
  return [_row(p, steps, t, times[0]) for p, t in zip(prepared, times)]


def population_rows(config: ml_collections.ConfigDict, member_counts: Sequence[int], *,
                    steps: int, repeats: int, cost: bool = False,
                    log=print) -> list[dict[str, Any]]:
  """Aggregate member-steps/s and device bytes per member of populations of each size,
  timed interleaved with the single run (member count 1) as in `train_steps_per_second`.

  `speedup` is the median over rounds of (P x single-run chunk time / population chunk
  time): how many times more member-steps per second than training them one by one.
  `cost`: also XLA's FLOPs and bytes accessed per member-step (`step_cost`).
  """
  counts = [1] + [m for m in member_counts if m != 1]
  configs = [population_config(config, m) for m in counts]
  rows = train_steps_per_second(configs, steps=steps, repeats=repeats,
                                labels=[f"P={m}" for m in counts], log=log)
  out = []
  for m, c, row in zip(counts, configs, rows):
    if m not in member_counts:
      continue
    out.append({**row, "members": m, "member_steps_per_s": m * row["steps_per_s"],
                "speedup": m / row["step_time_ratio"]})
    if cost:
      total = step_cost(c)
      out[-1].update({f"{k}_per_member_step": v / m for k, v in total.items()})
  return out


def _row(p: _Prepared, steps: int, times: list[float], base_times: list[float]
         ) -> dict[str, Any]:
  config, s = p.config, p.setup
  median = float(np.median(times))
  steps_per_s = steps / median
  row = {"experiment": config.experiment, "model": config.model.attention,
         "params": state_lib.count_params(p.state.params),
         "batch_size": config.batch_size, "steps_per_s": steps_per_s,
         "problems_per_s": steps_per_s * config.batch_size,
         "step_time_ratio": float(np.median(np.array(times) / np.array(base_times))),
         "compile_s": p.compile_s - median, "final_loss": p.final_loss,
         "device_bytes": p.bytes, "device_bytes_per_member": p.bytes / p.members}
  example = jax.eval_shape(lambda b: s.objective.encode(b)[0],
                           s.objective.source.example(config.batch_size))
  if s.model.config.input_kind == "embed":  # Token sequences: tokens/s and MFU.
    seq_len = example.shape[1]
    row["tokens_per_s"] = steps_per_s * config.batch_size * seq_len
    row["flops_per_token"] = flops_per_token(s.model.config, p.state.params, seq_len)
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
  s = build.setup(config)
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
