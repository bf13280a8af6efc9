"""A finished cell's workdir -> its cell file's record (small: metrics, curves, timings).

Reads what the training / probe / benchmark processes wrote (member `config.json`,
`summary.json`, TensorBoard scalars, `population_summary.json`, the probe's `metrics.json`,
the benchmark's JSON lines) and this runner's own per-process wall times
(`campaign_times.jsonl`, one line per process, so a cell resumed across windows adds up)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from typing import Any

from hypernet_attention.runs import children
from hypernet_attention.runs import machine
from hypernet_attention.runs import run_files
from launch import sweeps
from launch.campaign import cells as cells_lib
from launch.campaign import plan
from launch.campaign import records

TIMES = "campaign_times.jsonl"
# Curves kept per member: every evaluation split's metric and loss, and the training loss.
CURVE_PREFIXES = ("test/", "ood/", "unseen_terms/", "train/loss")


def commit(repo: str) -> str:
  try:
    return children.run(["git", "-C", repo, "describe", "--always", "--dirty", "--abbrev=12"],
                        capture_output=True, text=True, timeout=30, check=True).stdout.strip()
  except (OSError, subprocess.SubprocessError):
    return "unknown"


def segments(workdir: str) -> list[dict[str, Any]]:
  path = os.path.join(workdir, TIMES)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def add_segment(workdir: str, segment: dict[str, Any]) -> None:
  with open(os.path.join(workdir, TIMES), "a") as f:
    f.write(json.dumps(segment) + "\n")


def _read_json(path: str) -> Any:
  with open(path) as f:
    return json.load(f)


def member_curves(member_dir: str) -> dict[str, list[list[float]]]:
  """{tag: [[step, value], ...]} of the `CURVE_PREFIXES` scalars a member has written."""
  from hypernet_attention.runs import console  # pylint: disable=g-import-not-at-top
  from hypernet_attention.runs import curves  # pylint: disable=g-import-not-at-top
  console.import_tensorflow_quietly()  # tensorboard reads events through TF where it is.
  scalars = curves.read_scalars(member_dir)
  return {tag: [[int(s), float(v)] for s, v in zip(*series)]
          for tag, series in scalars.items() if tag.startswith(CURVE_PREFIXES)}


def commits(runs: list[dict[str, Any]]) -> str:
  """The code each process ran, in order, once each (one, unless resumed across commits)."""
  return ", ".join(dict.fromkeys(r.get("commit", "?") for r in runs))


def member_record(member_dir: str, name: str, frozen_at_step) -> dict[str, Any]:
  flat = run_files.flatten(_read_json(os.path.join(member_dir, run_files.CONFIG)))
  summary = _read_json(os.path.join(member_dir, run_files.SUMMARY))
  return {
      "name": name, "settings": {k: flat.get(k) for k in run_files.MEMBER_KEYS},
      "final": {k: v for k, v in summary.items() if isinstance(v, (int, float))},
      "frozen_at_step": frozen_at_step, "curves": member_curves(member_dir)}


def _base(cell: cells_lib.Cell, device: dict[str, Any], workdir: str) -> dict[str, Any]:
  runs = segments(workdir)
  return {
      "schema": records.SCHEMA, "cell": cell.name, "stage": cell.stage, "kind": cell.kind,
      "experiment": cell.experiment, "title": cell.title, "model": cell.model,
      "config": cell.config, "overrides": dict(cell.overrides),
      "device": {**device, "host_cpu": machine.host_cpu() if device["kind"] == "cpu" else None},
      "jax_version": device["jax_version"], "python": platform.python_version(),
      "commit": commits(runs) or commit(sweeps.REPO), "finished_utc": time.strftime(
          "%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
      "wall_s": sum(r["wall_s"] for r in runs), "processes": runs}


def train_record(cell: cells_lib.Cell, workdir: str, device: dict[str, Any]) -> dict[str, Any]:
  population = _read_json(os.path.join(workdir, run_files.POPULATION_SUMMARY))
  frozen = population.get("frozen_at_step") or [None] * len(cell.members)
  members = [member_record(os.path.join(workdir, name), name, f)
             for name, f in zip(cell.member_names, frozen)]
  record = _base(cell, device, workdir)
  steps = population["step"]
  record.update(num_steps=steps, scale=plan.scale(cell), members=members,
                member_steps_per_s=(len(members) * steps / record["wall_s"]
                                    if record["wall_s"] else None),
                member_steps_per_s_training=population.get("member_steps_per_s_overall"))
  return record


def probe_record(cell: cells_lib.Cell, workdir: str, device: dict[str, Any]) -> dict[str, Any]:
  """Per member and feature set (layer): the headline decoding scores, trained and at step
  0, the chance levels, the control task's selectivity, topographic similarity and the
  authors' own ridge metric (`hypernet_attention/probing/report.py`'s metrics.json)."""
  metrics = _read_json(os.path.join(workdir, "probe", "metrics.json"))
  keys = ("selectivity", "topographic", "ridge_r2_authors_metric")
  members = [{"name": name, "step": m["step"], "splits": m["splits"], "feature_sets": {
      layer: {"trained": block["decode"], "step0": m["step0"][layer]["decode"],
              **{k: block.get(k) for k in keys}} for layer, block in m["trained"].items()}}
             for name, m in metrics.items()]
  return {**_base(cell, device, workdir), "source": cell.source, "members": members}


def benchmark_record(cell: cells_lib.Cell, workdir: str, device: dict[str, Any]) -> dict[str, Any]:
  with open(os.path.join(workdir, "benchmark.log")) as f:
    rows = [json.loads(line) for line in f if line.startswith("{")]
  if not rows:
    raise ValueError(f"{cell.name}: the benchmark printed no result rows")
  return {**_base(cell, device, workdir), "rows": rows}


# A finished cell's record by its kind: (cell, workdir, device) -> its cell file's record.
BUILDERS = {"train": train_record, "probe": probe_record, "benchmark": benchmark_record}
