"""Per-experiment task, loss and metrics: `build(config)` calls the objective builder of
`config.experiment`'s record (`registry.py`).

Metrics are returned per example (shape (B,)) so that evaluation can sum them over many batches and
divide once; training logs their batch means. Everything task-specific sits in an `Objective` (data
source, encoding, model fields the task fixes, derived and per-run metrics), so the loop has no task
branches. This module is the one home of objective builders, built from what `tasks/` exposes
(tasks/ imports nothing from train/): `on_device` for every on-device task (the record's `task`
class: its `encode`, per-example `metrics` and `output_dim`), `c4_lm` for the host pipelines (their
readers). A new on-device task needs no builder: its record names its class.

Shape letters: B batch, T tokens, V vocabulary."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import os
from typing import Any, Callable, Mapping

from absl import logging
import chex
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from hypernet_attention import errors
from hypernet_attention.runs import console
from hypernet_attention.runs import registry
from hypernet_attention.runs import run_files
from hypernet_attention.train import data


@dataclasses.dataclass(frozen=True)
class Objective:
  """What the loop needs to know about an experiment; nothing else is task-specific."""
  source: data.OnDeviceSource | data.HostSource  # Where batches come from.
  encode: Callable[[Any], tuple[Any, Any]]  # batch -> (model inputs, targets)
  # outputs (B, T, output_dim), batch dict -> per-example metrics {name: (B,)}, incl. 'loss'.
  metrics_fn: Callable[[jax.Array, Mapping[str, jax.Array]], dict[str, jax.Array]]
  main_metric: str  # Reported per split in summary.json: e.g. 'test/accuracy'.
  model_overrides: dict[str, Any]  # Fields of TransformerConfig the task fixes.
  # Metrics derived from the means over a log window or an eval split (e.g. perplexity =
  # exp(mean loss)): {name: mean} -> {name: value}.
  finalize: Callable[[dict[str, float]], dict[str, float]] = lambda metrics: metrics
  # (config, workdir) -> constants reported once per run (SRAVEN's accuracy ceilings).
  run_metrics: Callable[[Any, str], dict[str, float]] = lambda config, workdir: {}
  task: Any = None  # The task object, for analysis code.


def split_seed(config: ml_collections.ConfigDict) -> int:
  """The seed of the task's held-out split: `task.split_seed`, or the run's `seed` when it
  is None (the paper's practice: each seed re-draws its split, so error bars over seeds
  include split variance)."""
  # `task.seed`: the same switch in config.json files written before `split_seed` existed.
  fixed = config.task.get("split_seed", config.task.get("seed"))
  return config.seed if fixed is None else fixed


def make_task(cls, config: ml_collections.ConfigDict):
  """The task class built from `config.task`; its `split_seed` becomes the task's `seed`."""
  kwargs = config.task.to_dict()
  kwargs.pop("split_seed", None)
  kwargs.pop("seed", None)
  allowed = [p for p in inspect.signature(cls).parameters if p != "seed"] + ["split_seed"]
  unknown = sorted(set(kwargs) - set(allowed))
  if unknown:
    raise ValueError(f"unknown task config keys {unknown} for {cls.__name__}; allowed: {allowed}")
  return cls(**kwargs, seed=split_seed(config))


def synthetic_overrides(config, source: data.OnDeviceSource, encode, **fixed):
  """Task-fixed model fields; T5 buckets = max distance = sequence length unless the
  config sets them (the authors' choice for the synthetic tasks)."""
  inputs = jax.eval_shape(lambda b: encode(b)[0], source.example(1))
  for key in ("num_buckets", "max_distance"):
    if config.model.get(key) is None:
      fixed[key] = inputs.shape[1]
  return fixed


def _accuracy_ceilings(task, config, workdir: str) -> dict[str, float]:
  """Each eval split's best achievable accuracy (SRAVEN), estimated once per run.

  Stored in the workdir (by process 0) so that a resumed run reports the same numbers
  without recomputing."""
  if config.eval.ceiling_problems <= 0:
    return {}
  stored = run_files.path(workdir) / run_files.CEILINGS
  if (ceilings := run_files.read_json(stored)) is not None:
    return ceilings
  ceilings = {}
  for i, split in enumerate(config.eval.splits):
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(config.seed), 3), i)
    ceilings[f"{split}/accuracy_ceiling"] = float(
        task.accuracy_ceiling(key, config.eval.ceiling_problems, split))
  logging.info("Accuracy ceilings (%d problems per split): %s", config.eval.ceiling_problems,
               ", ".join(f"{k.split('/')[0]} {v:.4f}" for k, v in ceilings.items()))
  if jax.process_index() == 0:
    run_files.write_json(stored, ceilings)
  return ceilings


def on_device(config: ml_collections.ConfigDict, experiment: registry.Experiment) -> Objective:
  """The objective of an on-device task: the record's `task` class built from `config.task`, its
  `encode`, `metrics` and `output_dim` (the task protocol, experiments/reference.md), and the
  record's main metric. A task with `accuracy_ceiling` reports each eval split's ceiling once per
  run, one with `chance_accuracy` the chance level."""
  if experiment.task is None:
    raise ValueError(f"experiment {experiment.name!r} names no task class; the on-device "
                     "objective needs one (`Experiment.task`)")
  task = make_task(registry.load(experiment.task), config)
  source = data.OnDeviceSource(task)
  return Objective(
      source, task.encode, task.metrics, experiment.metric,
      synthetic_overrides(config, source, task.encode, input_kind="dense",
                          output_dim=task.output_dim),
      run_metrics=functools.partial(_task_run_metrics, task), task=task)


def _task_run_metrics(task, config, workdir: str) -> dict[str, float]:
  """Accuracy ceilings (where the task estimates them) and chance (where it states it)."""
  out = _accuracy_ceilings(task, config, workdir) if hasattr(task, "accuracy_ceiling") else {}
  if hasattr(task, "chance_accuracy"):
    out.update({f"{split}/accuracy_chance": task.chance_accuracy for split in config.eval.splits})
  return out


def lm_pipeline(task_config):
  """The module of `config.task.pipeline`'s data path (`lm_text.PIPELINES`): `tasks/c4.py`
  (seqio, TensorFlow: loaded quietly first) or `tasks/c4_grain.py` (Grain, no TensorFlow).
  Both have `resolve`, `load_vocabulary`, `build_task`, `task_vocabulary` and `readers` (a host
  source's train and evaluate readers; neither imports train/); the rest is `lm_text`'s."""
  from hypernet_attention.tasks import lm_text  # pylint: disable=g-import-not-at-top
  name = lm_text.check_pipeline(task_config)
  if name == "seqio":
    console.import_tensorflow_quietly()  # seqio and c4 load TensorFlow, which logs natively.
  try:
    return importlib.import_module(lm_text.PIPELINES[name])
  except ModuleNotFoundError as e:  # The TF-free install ('.[dev]') has no seqio.
    raise errors.BadInput(
        f"config.task.pipeline={name!r} needs {e.name!r}, which is not installed; allowed: "
        "install the [lm] extra (pip install '.[lm]'), or --config.task.pipeline=grain "
        "(no TensorFlow)") from None


# `config.task.name` of uniformly random tokens (`data.RandomTokens`): the 50M step timed
# without TensorFlow, seqio or a vocabulary. For benchmarks only (`lm.check_before_data`).
SYNTHETIC_LM = "synthetic_lm"


def _random_token_source(vocab_size: int, sequence_length: int) -> data.HostSource:
  def train(seed, batch_size, process_index, process_count):
    return data.RandomTokens(seed, batch_size, sequence_length, vocab_size, process_index,
                             process_count)

  def evaluate(split, batch_size, num_batches, process_index, process_count):
    batches = train(1 + data.RANDOM_TOKEN_SPLITS.index(split), batch_size, process_index,
                    process_count)
    return [next(batches) for _ in range(num_batches)]

  return data.HostSource(train, evaluate, data.RANDOM_TOKEN_SPLITS,
                         data.token_rows_example(sequence_length))


def c4_lm(config: ml_collections.ConfigDict, experiment: registry.Experiment) -> Objective:
  """Next-token prediction. Per row: mean loss and token accuracy over weighted tokens,
  and the row's summed nats and UTF-8 bytes, from whose means `finalize` derives
  perplexity and bits per byte (a ratio of sums, not a mean of per-row ratios).
  `task.name=synthetic_lm`: random tokens over `task.vocab_size` (no bytes, no TensorFlow).
  Text comes through `config.task.pipeline` (`lm_pipeline`): seqio or Grain."""
  del experiment  # The record names no task class: the config's task does.
  if config.task.name == SYNTHETIC_LM:
    vocab_size, task = config.task.vocab_size, None
    bytes_V = jnp.zeros((vocab_size,))  # No text behind the tokens: bits per byte is absent.
    source = _random_token_source(vocab_size, config.task.sequence_length)
  else:
    from hypernet_attention.tasks import lm_text  # pylint: disable=g-import-not-at-top
    pipeline = lm_pipeline(config.task)
    lm_text.check_sequence_length(config.task.sequence_length, config.model.get("max_len"))
    task = pipeline.build_task(config.task)
    vocabulary = pipeline.task_vocabulary(task)
    vocab_size = vocabulary.vocab_size
    bytes_V = jnp.asarray(lm_text.token_byte_lengths(vocabulary))
    length = config.task.sequence_length
    source = data.HostSource(*pipeline.readers(task, length), lm_text.SPLITS,
                             data.token_rows_example(length))

  def metrics_fn(logits_BTV, batch):
    targets_BT, weights_BT = batch["targets"], batch["weights"].astype(jnp.float32)
    chex.assert_shape(logits_BTV, (*targets_BT.shape, bytes_V.shape[0]))
    chex.assert_equal_shape([targets_BT, weights_BT])
    logits_BTV = logits_BTV.astype(jnp.float32)
    nats_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV, targets_BT)
    correct_BT = (jnp.argmax(logits_BTV, -1) == targets_BT).astype(jnp.float32)
    tokens_B = jnp.maximum(weights_BT.sum(-1), 1.0)
    nats_B = (nats_BT * weights_BT).sum(-1)
    return {"loss": nats_B / tokens_B, "accuracy": (correct_BT * weights_BT).sum(-1) / tokens_B,
            "row_nats": nats_B, "row_bytes": (bytes_V[targets_BT] * weights_BT).sum(-1)}

  def finalize(metrics):
    metrics = dict(metrics)
    nats, num_bytes = metrics.pop("row_nats"), metrics.pop("row_bytes")
    metrics["perplexity"] = float(np.exp(metrics["loss"]))
    if num_bytes > 0:
      metrics["bits_per_byte"] = nats / num_bytes / np.log(2)
    return metrics

  return Objective(
      source, lambda batch: (batch["inputs"], batch["targets"]), metrics_fn, "loss",
      dict(input_kind="embed", vocab_size=vocab_size, output_dim=vocab_size),
      finalize=finalize, task=task)


def build(config: ml_collections.ConfigDict, experiment: registry.Experiment | None = None,
          budget: int | None = None, members: int = 1) -> Objective:
  """The objective of `config.experiment`'s record (`experiment`, as `config_checks.validate`
  found it); ValueError for an unknown name (naming the known ones) or a data source other
  than the record declares. First the estimate the record names (bytes from the config alone)
  for the tasks of `members` runs the host holds at once (a population's size; 0 for its
  other members, weighed with the first) is weighed against `budget` (default: half this
  host's memory, where the task tables and the ceilings' readings live): sizes that would not
  fit (e.g. SRAVEN's K! readings) are refused before the task is built."""
  experiment = experiment or registry.get(config.experiment)
  try:
    need = members * registry.load(experiment.memory)(config) if experiment.memory else 0
  except (TypeError, ValueError):
    need = 0  # Wrong types: the task's own constructor names them.
  if budget is None:
    budget = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
  if need > budget:
    sizes = ", ".join(f"task.{k}={v!r}" for k, v in config.task.items()
                      if k in ("num_features", "num_values", "grid_size"))
    raise errors.BadInput(
        f"config {sizes} with eval.ceiling_problems={config.eval.ceiling_problems}"
        + (f" for {members} members" if members > 1 else "") + f" needs ~{need / 2**30:,.1f} "
        f"GiB for the task's tables; allowed: at most {budget / 2**30:,.1f} GiB (half this "
        f"host's memory): fewer features{' or members' if members > 1 else ''}, or "
        "--config.eval.ceiling_problems=0 (the ceilings' readings grow as K!**(G-1))")
  objective = registry.load(experiment.objective)(config, experiment)
  if objective.source.on_device != experiment.on_device:
    raise ValueError(f"experiment {experiment.name!r}: its objective's data source is "
                     f"{'on device' if objective.source.on_device else 'host-side'}, its record "
                     f"says on_device={experiment.on_device}")
  return objective
