"""Per-experiment task, loss and metrics, picked by `config.experiment`.

Metrics are returned per example (shape (B,)) so that evaluation can sum them over many
batches and divide once; training logs their batch means.

Shape letters: B batch, T tokens, K query features (SRAVEN), F values per feature.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import optax


@dataclasses.dataclass(frozen=True)
class Objective:
  """What the loop needs to know about an experiment."""
  task: Any
  # outputs (B, T, output_dim), batch dict -> per-example metrics {name: (B,)}, incl. 'loss'.
  metrics_fn: Callable[[jax.Array, Mapping[str, jax.Array]], dict[str, jax.Array]]
  main_metric: str  # Reported per split in summary.json: e.g. 'test/accuracy'.
  model_overrides: dict[str, Any]  # Fields of TransformerConfig the task fixes.

  def encode(self, batch):
    return self.task.encode(batch)


def split_seed(config: ml_collections.ConfigDict) -> int:
  """The seed of the task's held-out split: `task.split_seed`, or the run's `seed` when it
  is None (the paper's practice: each seed re-draws its split, so error bars over seeds
  include split variance)."""
  # `task.seed`: the same switch in config.json files written before `split_seed` existed.
  fixed = config.task.get("split_seed", config.task.get("seed"))
  return config.seed if fixed is None else fixed


def _make_task(cls, config: ml_collections.ConfigDict):
  """The task class built from `config.task`; its `split_seed` becomes the task's `seed`."""
  kwargs = config.task.to_dict()
  kwargs.pop("split_seed", None)
  kwargs.pop("seed", None)
  allowed = [p for p in inspect.signature(cls).parameters if p != "seed"] + ["split_seed"]
  unknown = sorted(set(kwargs) - set(allowed))
  if unknown:
    raise ValueError(f"unknown task config keys {unknown} for {cls.__name__}; allowed: {allowed}")
  return cls(**kwargs, seed=split_seed(config))


def _sraven(config: ml_collections.ConfigDict) -> Objective:
  from hypernet_attention.tasks import sraven  # pylint: disable=g-import-not-at-top
  task = _make_task(sraven.SRaven, config)

  def metrics_fn(logits_BTF, batch):
    _, targets_BK = task.encode(batch)
    num_k = targets_BK.shape[1]
    logits_BKF = logits_BTF[:, -num_k:].astype(jnp.float32)
    ce_BK = optax.softmax_cross_entropy_with_integer_labels(logits_BKF, targets_BK)
    correct_BK = jnp.argmax(logits_BKF, -1) == targets_BK
    out = {"loss": ce_BK.mean(-1), "accuracy": correct_BK.all(-1).astype(jnp.float32)}
    for k in range(num_k):
      out[f"accuracy_feature{k}"] = correct_BK[:, k].astype(jnp.float32)
    return out

  return Objective(task, metrics_fn, "accuracy",
                   dict(input_kind="dense", output_dim=task.num_values))


def _fuzzy_logic(config: ml_collections.ConfigDict) -> Objective:
  from hypernet_attention.tasks import fuzzy_logic  # pylint: disable=g-import-not-at-top
  task = _make_task(fuzzy_logic.FuzzyLogic, config)

  def metrics_fn(outputs_BT1, batch):
    _, target_B = task.encode(batch)
    pred_B = outputs_BT1[:, -1, 0].astype(jnp.float32)
    return {"loss": jnp.square(pred_B - target_B),
            "r2": task.r2_per_sequence(pred_B, batch).astype(jnp.float32)}

  return Objective(task, metrics_fn, "r2", dict(input_kind="dense", output_dim=1))


# Keyed by `hypernet_attention.train.registry` names (a test checks that they agree).
OBJECTIVES = {"sraven": _sraven, "fuzzy_logic": _fuzzy_logic}


def build(config: ml_collections.ConfigDict) -> Objective:
  if config.experiment not in OBJECTIVES:
    raise ValueError(f"unknown experiment {config.experiment!r}; allowed: {sorted(OBJECTIVES)}")
  return OBJECTIVES[config.experiment](config)
