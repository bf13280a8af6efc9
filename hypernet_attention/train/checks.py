"""Every check a config needs before any work, in one place, with the messages users see.

`validate(config)` takes the values the config alone decides: types, ranges, finiteness,
the run's schedule and intervals, the attention preset. It runs in `build.setup` (every
training run and population member), in the language-model entry point and on the
launching machine (`check_config.py`, before anything is copied or submitted), so each
message is written once. `check_task_memory` weighs the task's tables against this host's
memory. Checks that need the devices (mesh, batch divisibility) stay with the mesh
(`sharding.py`, `data.py`); checks of a population's members with `population.py`.

JAX is not imported here (the attention presets and SRAVEN's estimate load it on first
use), so a launching machine without JAX can run `validate`.
"""

from __future__ import annotations

import math
import os
from typing import Any

import ml_collections

from hypernet_attention.errors import BadInput

# Config fields that must be positive integers wherever they appear (sizes and intervals).
POSITIVE_FIELDS = (
    "batch_size", "num_train_steps", "steps_per_loop", "log_every_steps", "eval_every_steps",
    "checkpoint_every_steps", "keep_checkpoints", "eval.num_problems", "eval.batch_size",
    "model.num_layers", "model.emb_dim", "model.num_heads", "model.qk_dim", "model.v_dim",
    "model.mlp_dim")
# Floating-point dtypes a model may compute or store its parameters in.
DTYPES = ("float32", "bfloat16", "float16")
# Real-valued fields: (key, lowest, highest, lowest allowed?, highest allowed?). Every one
# must also be finite; a value outside trains silently wrong (a negative learning rate
# ascends the gradient, a negative clip norm flips every gradient, dropout 1 drops all).
RANGES = (
    ("optimizer.learning_rate", 0.0, math.inf, False, False),
    ("optimizer.weight_decay", 0.0, math.inf, True, False),
    ("optimizer.end_lr_fraction", 0.0, 1.0, True, True),
    ("optimizer.b1", 0.0, 1.0, True, False),
    ("optimizer.b2", 0.0, 1.0, True, False),
    ("optimizer.eps", 0.0, math.inf, False, False),
    ("optimizer.grad_clip_norm", 0.0, math.inf, True, False),
    ("model.attention_dropout", 0.0, 1.0, True, False),
    ("preemption_grace_s", 0.0, math.inf, True, False),
)


def _get(config: ml_collections.ConfigDict, key: str) -> Any:
  """`config.<dotted key>`, or None where a part of the path is absent."""
  node = config
  for name in key.split("."):
    node = node.get(name) if isinstance(node, ml_collections.ConfigDict) else None
  return node


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def check_positive(config: ml_collections.ConfigDict) -> None:
  """Raises `BadInput` naming the first of `POSITIVE_FIELDS` that is not a positive int."""
  for key in POSITIVE_FIELDS:
    value = _get(config, key)
    if value is not None and (not _is_int(value) or value <= 0):
      raise BadInput(f"config.{key}={value!r} must be a positive integer")


def _interval(low: float, high: float, low_in: bool, high_in: bool) -> str:
  if high == math.inf:
    return f"a finite number {'>=' if low_in else '>'} {low:g}"
  return f"a number in {'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"


def check_ranges(config: ml_collections.ConfigDict) -> None:
  """Raises `BadInput` naming the first of `RANGES` that is not a finite number in range."""
  for key, low, high, low_in, high_in in RANGES:
    value = _get(config, key)
    if value is None:
      continue
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and (low <= value if low_in else low < value)
          and (value <= high if high_in else value < high))
    if not ok:
      raise BadInput(f"config.{key}={value!r}; allowed: "
                     f"{_interval(low, high, low_in, high_in)}")


def check_run(config: ml_collections.ConfigDict) -> None:
  """The run-level fields no single module owns: seed, schedule, stop step, eval, dtypes."""
  seed = config.get("seed")
  if not _is_int(seed) or not 0 <= seed < 2**32:
    raise BadInput(f"config.seed={seed!r}; allowed: an integer in [0, 2**32)")
  warmup, steps = _get(config, "optimizer.warmup_steps"), config.num_train_steps
  if warmup is not None and (not _is_int(warmup) or not 0 <= warmup < steps):
    raise BadInput(f"config.optimizer.warmup_steps={warmup!r}; allowed: an integer in "
                   f"[0, config.num_train_steps={steps})")
  stop = config.get("stop_after_steps")
  if stop is not None and (not _is_int(stop) or stop <= 0):
    raise BadInput(f"config.stop_after_steps={stop!r}; allowed: None (no stop) or a positive "
                   "integer")
  splits = _get(config, "eval.splits")
  if splits is not None and (isinstance(splits, str) or not tuple(splits)):
    raise BadInput(f"config.eval.splits={splits!r}; allowed: a non-empty list of split names")
  ceiling = _get(config, "eval.ceiling_problems")
  if ceiling is not None and (not _is_int(ceiling) or ceiling < 0):
    raise BadInput(f"config.eval.ceiling_problems={ceiling!r}; allowed: an integer >= 0 "
                   "(0: no ceilings)")
  for key in ("model.dtype", "model.param_dtype"):
    value = _get(config, key)
    if value is not None and str(value) not in DTYPES:
      raise BadInput(f"config.{key}={value!r}; allowed: {', '.join(DTYPES)}")


def check_intervals(config: ml_collections.ConfigDict) -> None:
  """The evaluation reads whole batches."""
  if config.eval.num_problems % config.eval.batch_size:
    raise BadInput(f"config.eval.num_problems={config.eval.num_problems} is not a multiple of "
                   f"config.eval.batch_size={config.eval.batch_size}")


def check_schedule(config: ml_collections.ConfigDict) -> None:
  """Raises `BadInput` when the authors' schedule leaves no cosine part."""
  opt = config.optimizer
  if opt.get("authors_schedule", False) and (
      config.num_train_steps - 2 * opt.warmup_steps <= 0):
    raise BadInput(
        f"optimizer.authors_schedule=True needs num_train_steps > 2 * warmup_steps (its "
        f"cosine lasts num_train_steps - 2 * warmup_steps); got num_train_steps="
        f"{config.num_train_steps}, warmup_steps={opt.warmup_steps}")


def check_preset(name: str) -> str:
  """Raises `BadInput` unless `name` is an attention preset of `hypernet_attention.attention`."""
  from hypernet_attention import attention  # pylint: disable=g-import-not-at-top
  if name not in attention.PRESETS:
    raise BadInput(f"unknown attention preset {name!r}; allowed: {sorted(attention.PRESETS)}")
  return name


def validate(config: ml_collections.ConfigDict) -> None:
  """Every config value whose type, range or finiteness the config alone decides.

  Raises `BadInput` naming the first bad key, its value and what is allowed. Task and
  device checks (sizes against memory, the mesh) follow in `build.setup`.
  """
  check_positive(config)
  check_ranges(config)
  check_run(config)
  check_intervals(config)
  check_schedule(config)


def memory_budget() -> int:
  """Bytes a run may plan for: half of this host's physical memory (the task tables and the
  accuracy-ceiling readings live on the host; a larger estimate would swap or be killed)."""
  return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2


# Experiment -> bytes its task needs on the host, from the config alone (before building it).
TASK_MEMORY = {"sraven": lambda config: _sraven().memory_estimate(
    config.task.num_features, config.task.num_values, config.task.get("grid_size", 3),
    ceiling_batch=1024 if config.eval.ceiling_problems > 0 else 0)}


def check_task_memory(config: ml_collections.ConfigDict, budget: int | None = None) -> None:
  """Refuses task sizes whose tables would not fit in memory (e.g. SRAVEN's K! readings)."""
  estimate = TASK_MEMORY.get(config.experiment)
  if estimate is None:
    return
  try:
    need = estimate(config)
  except (TypeError, ValueError):
    return  # Wrong types: the task's own constructor names them.
  budget = memory_budget() if budget is None else budget
  if need > budget:
    sizes = ", ".join(f"task.{k}={v!r}" for k, v in config.task.items()
                      if k in ("num_features", "num_values", "grid_size"))
    raise BadInput(
        f"config {sizes} with eval.ceiling_problems={config.eval.ceiling_problems} needs "
        f"~{need / 2**30:,.1f} GiB for the task's tables; allowed: at most "
        f"{budget / 2**30:,.1f} GiB (half this host's memory): fewer features, or "
        "--config.eval.ceiling_problems=0 (the ceilings' readings grow as K!**(G-1))")


def _sraven():
  from hypernet_attention.tasks import sraven  # pylint: disable=g-import-not-at-top  (JAX)
  return sraven
