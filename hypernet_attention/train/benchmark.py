"""Throughput of the real train step (`trainer.Trainer.train_chunk`), without a workdir.

Used by `experiments/benchmark_training.py`; numbers go in experiments/results/, not in timed tests.
Several models are timed interleaved in one process, so their ratio is robust to a shared, noisy
machine. For sequence models it also reports tokens/s and model FLOPs utilization:

  model FLOPs per token = 6 N + 12 L T E   (PaLM, Chowdhery et al. 2022, App. B)

N = parameters except the input embedding (a lookup), L layers, T sequence length, E = total
query/key width. The same formula for every attention variant, so HYLA's extra value-network work is
not credited: MFU compares useful work at equal model size. MFU = FLOPs per token x tokens/s / the
device's peak (`PEAK_TFLOPS` by device kind, or given)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from hypernet_attention import errors
from hypernet_attention.runs import config_checks
from hypernet_attention.runs import registry
from hypernet_attention.train import build
from hypernet_attention.train import data
from hypernet_attention.train import memory
from hypernet_attention.train import population
from hypernet_attention.train import state as state_lib
from hypernet_attention.train import trainer as trainer_lib

OVERRIDES_ALLOWED = "comma-separated dotted key=value pairs, e.g. model.implementation=reference"


def parse_overrides(text: str, flag: str = "--config_overrides",
                    allowed: str = OVERRIDES_ALLOWED) -> list[tuple[str, str]]:
  """Comma-separated dotted `key=value` pairs -> [(key, value)]; `errors.BadInput` naming
  `flag` and what is `allowed` for an item that is not one (a missing '=' or key)."""
  pairs = []
  for item in filter(None, (s.strip() for s in text.split(","))):
    key, equals, value = item.partition("=")
    if not equals or not key.strip():
      raise errors.BadInput(f"{flag}: {item!r} is not key=value; allowed: {allowed}")
    pairs.append((key.strip(), value.strip()))
  return pairs


def model_config(experiment: str, spec: str, size: str,
                 overrides: str = "") -> ml_collections.ConfigDict:
  """The config that `experiments/benchmark_training.py` and `profile_step.py` time.

  `spec` is an attention preset, optionally with its own overrides after '@'
  (`hyla@model.implementation=reference`); `overrides` (comma-separated dotted `key=value`
  pairs) apply to every spec, before the spec's own. Bad presets, sizes, keys or values
  raise ValueError / KeyError / AttributeError with a one-line message (`errors.BadInput`,
  naming the flag, for the overrides)."""
  preset, *own = spec.split("@")
  config = registry.get(experiment).get_config(f"model={preset},size={size}")
  own_allowed = "preset@dotted.key=value, e.g. hyla@model.implementation=reference"
  flags = [(overrides, "--config_overrides", OVERRIDES_ALLOWED)] + [
      (o, f"--models {spec!r}", own_allowed) for o in own]
  for text, flag, allowed in flags:
    for key, value in parse_overrides(text, flag, allowed):
      try:
        config_checks.set_dotted(config, key, value)
      except (ValueError, TypeError) as e:
        raise errors.BadInput(f"{flag}: {e}") from None
  return config


@dataclasses.dataclass
class _Plan:
  """One config's trainer, compiled for chunks of `steps` steps against its abstract state
  and checked to fit in memory: nothing of the state exists yet (`plan`)."""
  config: ml_collections.ConfigDict
  setup: build.Setup
  trainer: Any  # trainer.Trainer or population.PopulationTrainer.
  init: Callable[[], Any]  # Materializes the fresh state (with its shardings).
  compiled: Any  # The chunk compiled for the abstract state (its length: `plan`'s `steps`).
  compile_s: float
  members: int = 1
  bytes: int = 0  # Device bytes of the compiled chunk (XLA's memory analysis; 0: unknown).


@dataclasses.dataclass
class _Prepared:
  """A plan with its state built, after one chunk (which ran the compiled program once)."""
  plan: _Plan
  state: Any
  compile_s: float = 0.0
  final_loss: float = float("nan")

  def run_chunk(self, steps: int) -> float:
    """Seconds for one chunk of `steps` steps (the state advances)."""
    start = time.perf_counter()
    self.state, metrics = self.plan.trainer.train_chunk(self.state, steps)
    jax.block_until_ready(metrics)
    self.final_loss = float(np.mean(np.asarray(metrics.per_step["loss"])[..., -1]))
    return time.perf_counter() - start


def step_cost(config: ml_collections.ConfigDict) -> dict[str, float]:
  """XLA's cost analysis of one compiled training step of `config` (a 1-step chunk, since
  the analysis may count a loop's body once): FLOPs and bytes accessed, all members together.

  Why: a population's gain is capped by what a step must move (a paper-size SRAVEN step runs
  at the memory bandwidth: `experiments/results/training_throughput.md`)."""
  analysis = plan(config, 1).compiled.cost_analysis()  # No state is built for it.
  analysis = analysis[0] if isinstance(analysis, (list, tuple)) else analysis
  return {"flops": float(analysis.get("flops", 0.0)),
          "bytes_accessed": float(analysis.get("bytes accessed", 0.0))}


def population_config(config: ml_collections.ConfigDict, members: int) -> ml_collections.ConfigDict:
  """`config` as a population of `members` seeds (0, 1, ...); 1: the single run itself."""
  config = ml_collections.ConfigDict(config.to_dict())
  if members > 1:
    config.population.members = tuple({"seed": i} for i in range(members))
  return config


def plan(config: ml_collections.ConfigDict, steps: int) -> _Plan:
  """`config`'s trainer with its `steps`-step chunk compiled for the abstract state and the
  memory check passed, or `errors.BadInput` in one line; no array of the state is built.

  Why abstract: a state too large for the host, built first, is ended by the kernel's OOM
  killer (which may pick another process) before any check could refuse it. XLA's memory
  analysis needs only shapes and shardings (`memory.py`); the jitted call on the real state
  later reuses the executable compiled here."""
  start = time.perf_counter()
  checked = config_checks.validate(config)  # The benchmark's config enters here.
  if checked.members:
    p = population.setup(checked)
    trainer, single, members = population.PopulationTrainer(p), p.single, p.size
    target, init = p.restore_target(), trainer.init_state
  else:
    single, members = build.setup(checked), 1
    trainer = trainer_lib.Trainer(config, single)
    target = single.restore_target()
    init = lambda: build.init_state(config, single.init_fn, single.shardings)
  compiled = trainer.compile_chunk(target, steps)
  fit = memory.check_fits(compiled, list(single.mesh.devices.flat), config.batch_size, members)
  return _Plan(config, single, trainer, init, compiled, time.perf_counter() - start,
               members, fit.need.total if fit.need else 0)


def prepare(config_or_plan: ml_collections.ConfigDict | _Plan, steps: int) -> _Prepared:
  """Builds the state of a config (planned first) or of a plan, and runs one chunk."""
  planned = (config_or_plan if isinstance(config_or_plan, _Plan) else plan(config_or_plan, steps))
  prepared = _Prepared(planned, planned.init())
  prepared.compile_s = planned.compile_s + prepared.run_chunk(steps)  # Runs the chunk once.
  return prepared


def train_steps_per_second(configs: Sequence[ml_collections.ConfigDict | _Plan], *,
                           steps: int = 200, repeats: int = 3, labels: Sequence[str] | None = None,
                           log=print) -> list[dict[str, Any]]:
  """Median steps/s per config over `repeats` rounds of one `steps`-step chunk each.

  Every config is planned (compiled and checked against memory, `plan`) before any state
  is built, so one that cannot fit is refused before the others take memory or time. They
  are then timed interleaved (A, B, C, A, B, C, ...), so a slow phase of a shared machine
  hits every model alike. `step_time_ratio` is the median over rounds of the config's chunk
  time / the first config's chunk time in that round. `labels` (default: the attention
  presets) name the configs in the progress lines."""
  labels = labels or [(c.config if isinstance(c, _Plan) else c).model.attention for c in configs]
  plans = []
  for c, label in zip(configs, labels):  # A line each: a window cut mid-compile says where.
    start = time.perf_counter()
    plans.append(c if isinstance(c, _Plan) else plan(c, steps))
    log(f"planned {label}: {time.perf_counter() - start:.1f} s")
  prepared = []
  for planned, label in zip(plans, labels):
    prepared.append(prepare(planned, steps))
    log(f"compiled {label}: {prepared[-1].compile_s:.1f} s, "
        f"{planned.bytes / 2**20:.1f} MiB on device")
  times = [[] for _ in prepared]
  for r in range(repeats):
    for p, t in zip(prepared, times):
      t.append(p.run_chunk(steps))
    log(f"round {r + 1}/{repeats}: " + ", ".join(
        f"{label} {steps / t[-1]:.3g}" for label, t in zip(labels, times)) + " steps/s")
  return [_row(p, steps, t, times[0]) for p, t in zip(prepared, times)]


def _population_counts(member_counts: Sequence[int]) -> list[int]:
  return [1] + [m for m in member_counts if m != 1]  # The single run is the baseline.


def population_plans(config: ml_collections.ConfigDict, member_counts: Sequence[int],
                     steps: int) -> list[_Plan]:
  """`plan` of the single run and of each population size (`population_rows` times them):
  a size that cannot fit is refused before any state is built."""
  return [plan(population_config(config, m), steps) for m in _population_counts(member_counts)]


def population_rows(config: ml_collections.ConfigDict, member_counts: Sequence[int], *,
                    steps: int, repeats: int, cost: bool = False,
                    plans: Sequence[_Plan] | None = None, log=print) -> list[dict[str, Any]]:
  """Aggregate member-steps/s and device bytes per member of populations of each size,
  timed interleaved with the single run (member count 1) as in `train_steps_per_second`.

  `speedup` is the median over rounds of (P x single-run chunk time / population chunk
  time): how many times more member-steps per second than training them one by one.
  `cost`: also XLA's FLOPs and bytes accessed per member-step (`step_cost`). `plans`:
  `population_plans(config, member_counts, steps)`, when the caller planned them already."""
  counts = _population_counts(member_counts)
  plans = plans or population_plans(config, member_counts, steps)
  rows = train_steps_per_second(plans, steps=steps, repeats=repeats,
                                labels=[f"P={m}" for m in counts], log=log)
  out = []
  for m, c, row in zip(counts, (p.config for p in plans), rows):
    if m not in member_counts:
      continue
    out.append({**row, "members": m, "member_steps_per_s": m * row["steps_per_s"],
                "speedup": m / row["step_time_ratio"]})
    if cost:
      total = step_cost(c)
      out[-1].update({f"{k}_per_member_step": v / m for k, v in total.items()})
  return out


def _row(p: _Prepared, steps: int, times: list[float], base_times: list[float]) -> dict[str, Any]:
  config, s = p.plan.config, p.plan.setup
  median = float(np.median(times))
  steps_per_s = steps / median
  row = {"experiment": config.experiment, "model": config.model.attention,
         "params": state_lib.count_params(p.state.params),
         "batch_size": config.batch_size, "steps_per_s": steps_per_s,
         "problems_per_s": steps_per_s * config.batch_size,
         "step_time_ratio": float(np.median(np.array(times) / np.array(base_times))),
         "compile_s": p.compile_s - median, "final_loss": p.final_loss,
         "device_bytes": p.plan.bytes, "device_bytes_per_member": p.plan.bytes / p.plan.members}
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


def input_tokens_per_second(config: ml_collections.ConfigDict, seconds: float = 10.0) -> float:
  """Tokens/s this process's host input pipeline delivers alone (no model), after the
  first batch; tokens = rows x row length of every feature-0 array read."""
  s = build.setup(config_checks.validate(config))
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
