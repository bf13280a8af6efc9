"""Kept parameters re-evaluated on independent draws of problems: each number with its error.

A trained cell reports its OOD metric (Table A1) from one fixed set of `eval.num_problems`
problems, and its probe (Fig. 2B, Fig. 5F) from one set of `num_problems` per split. On
fuzzy logic one set is not enough: the per-sequence R^2 (Table A1's metric) is heavy-tailed
(a sequence whose 32 targets barely vary turns a small error into R^2 of -10 or less), so two
sets of 8,192 problems differ by ~0.01-0.03 (linear attention, seed 2: 0.580 recorded, 0.53-
0.56 on eight fresh sets), as much as the seeds differ. The held-out macro-F1 of the probe
moves as much between draws (softmax seed 2, layer 1: 0.352, 0.386).

So the numbers the report uses are means over `draws` independent sets (each the size of the
original evaluation, drawn from keys apart from the training run's and the probe's), and the
*evaluation error* beside each is the standard error across draws,
  e = std(draw values, ddof=1) / sqrt(draws),
the spread of the reported mean under a fresh draw of all its problems (a re-draw moves it
by ~sqrt(2) e). The probe's draws also re-draw the cross-validation folds (seed = draw), so
the error covers both. No parameter is retrained: the parameters are the cell's kept ones
(`train/export_params.py`).

`untrained_terms` records, for fuzzy logic, the known terms that no training task of the
member's split contains (the authors' split of seed 2 trains neither term 5 nor 6).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import threadpoolctl

from hypernet_attention import errors
from hypernet_attention.probing import extract
from hypernet_attention.probing import report

REDRAW_SEED = 4321  # The draws' keys: apart from training's (run seed) and the probe's (1234).


@dataclasses.dataclass(frozen=True)
class RedrawOptions:
  """How many independent draws, of how many problems each. Measured at the paper's size
  (8 draws of 8,192): one draw's OOD R^2 spreads by sd 0.004-0.005 for HYLA and 0.019 for
  softmax and linear attention. The error is sd / sqrt(draws), so a row whose seeds' s.e. is
  s needs draws >= (3 sd / s)^2 to stay within a third of it: 8 for HYLA (s ~0.008), ~30
  for softmax and linear (s ~0.011-0.02), ~50 for linear + RMSHead (s 0.008)."""
  draws: int = 32  # Sets of `problems` problems for the OOD metric.
  problems: int = 8192  # Per draw and split: the campaign's fuzzy-logic `eval.num_problems`.
  batch_size: int = 1024
  split: str = "ood"
  probe_draws: int = 8  # Independent probe draws (codes of trained and step-0 parameters).
  probe_problems: int = 1024  # Per draw and split: the campaign's probe cells' size.

  def __post_init__(self):
    for name in ("draws", "problems", "batch_size", "probe_draws", "probe_problems"):
      if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        raise errors.BadInput(f"{name}={getattr(self, name)!r}; allowed: an integer >= 1")
    if self.problems % self.batch_size:
      raise errors.BadInput(f"problems={self.problems} is not a multiple of batch_size="
                            f"{self.batch_size}; allowed: a multiple")


def evaluation_error(values: Sequence[float]) -> dict[str, Any]:
  """{mean, se, draws} of per-draw values: `se` is the standard error of their mean across
  draws (module docstring); None with a single draw (no spread to measure)."""
  v = np.asarray(values, np.float64)
  se = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else None
  return {"mean": float(v.mean()), "se": se, "draws": [float(x) for x in v]}


def metric_draws(run, options: RedrawOptions, metric: str) -> list[float]:
  """Mean `metric` of `run` (a `restore.RestoredRun`) on each of `options.draws` sets of
  `options.problems` problems of `options.split`."""
  task, objective = run.objective.task, run.objective

  @jax.jit
  def batch_sum(params, key):
    batch = task.sample(key, options.batch_size, options.split)
    outputs = run.model.apply({"params": params}, objective.encode(batch)[0],
                              deterministic=True)
    return jnp.sum(objective.metrics_fn(outputs, batch)[metric])

  out = []
  for d in range(options.draws):
    key = jax.random.fold_in(jax.random.key(REDRAW_SEED), d)
    sums = [batch_sum(run.params, jax.random.fold_in(key, i))
            for i in range(options.problems // options.batch_size)]
    out.append(float(np.sum(jax.device_get(sums), dtype=np.float64)) / options.problems)
  return out


def probe_scores(codes: extract.Codes, seed: int) -> dict[str, float]:
  """Held-out decoding score per feature set (macro-F1, or accuracy over rules), as the
  probe cells score it, without the permutation null (its p is the cell's own)."""
  metric = report.headline(codes)[0]
  return {name: report.score_of(report.decode_codes(codes, x_NC, 0, seed)[1], metric)
          for name, x_NC in report.feature_sets(codes).items()}


def probe_draws(run, options: RedrawOptions) -> dict[str, list[float]]:
  """{feature set: [score of each draw]}: codes of fresh problems, folds of seed `draw`."""
  draws = []
  for d in range(options.probe_draws):
    codes = extract.extract_codes(run, options.probe_problems, progress=False,
                                  seed=REDRAW_SEED + 1 + d)
    with threadpoolctl.threadpool_limits(1):  # As the probe cells fit (`report.probe_run`).
      draws.append(probe_scores(codes, seed=d))
  return {name: [d[name] for d in draws] for name in draws[0]}


def untrained_terms(task) -> list[int]:
  """Known fuzzy-logic terms that no training task of `task`'s split contains."""
  known = 2 ** task.num_variables - task.num_unseen_terms
  return sorted(set(range(known)) - set(np.unique(task.combinations("train")).tolist()))


def member(params_dir: str, index: int, metric: str, options: RedrawOptions,
           probe: bool) -> dict[str, Any]:
  """Member `index` of the kept parameters in `params_dir`, re-evaluated: its `split/metric`
  over draws, or (`probe`) its decoding scores, trained and at step 0, over draws."""
  from hypernet_attention.train import restore  # pylint: disable=g-import-not-at-top
  start = time.time()
  run = restore.restore_params(params_dir, member=index)
  out: dict[str, Any] = {"step": run.step}
  if probe:
    run0 = restore.restore_params(params_dir, step=0, member=index)
    trained, step0 = probe_draws(run, options), probe_draws(run0, options)
    out["feature_sets"] = {name: {"trained": evaluation_error(trained[name]),
                                  "step0": evaluation_error(step0[name])} for name in trained}
  else:
    out[f"{options.split}/{metric}"] = evaluation_error(metric_draws(run, options, metric))
    if hasattr(run.objective.task, "num_unseen_terms"):
      out["untrained_terms"] = untrained_terms(run.objective.task)
  out["seconds"] = time.time() - start
  return out
