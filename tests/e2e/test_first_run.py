"""The README's first run: `experiments/sraven_scaling.py` with no flags is `size=demo`
(2-feature SRAVEN), and its result line reads OOD accuracy against ceiling and chance."""

import json
import os
import sys

import jax
import numpy as np
import pytest

from hypernet_attention.runs import registry
from hypernet_attention.train import objectives

import train_testlib as tl

pytestmark = pytest.mark.e2e  # Drives the whole training loop (tests/pytest.ini).


def test_demo_is_local_with_two_features_and_twice_the_steps():
  demo = registry.get("sraven").get_config("model=hyla,size=demo")
  local = registry.get("sraven").get_config("model=hyla,size=local")
  paper = registry.get("sraven").get_config("model=hyla,size=paper")
  assert (demo.task.num_features, demo.num_train_steps) == (2, 24_000)
  assert (local.task.num_features, local.num_train_steps) == (3, 12_000)
  assert (paper.task.num_features, paper.num_train_steps) == (4, 156_250)
  changed = {"task.num_features", "num_train_steps"}

  def flat(config, prefix=""):
    out = {}
    for key, value in config.items():
      if hasattr(value, "items"):
        out.update(flat(value, f"{prefix}{key}."))
      else:
        out[prefix + key] = value
    return out

  demo_flat, local_flat = flat(demo), flat(local)
  assert {k for k in demo_flat if demo_flat[k] != local_flat[k]} == changed


@pytest.mark.parametrize("num_features", [2, 3])
def test_chance_is_what_uniform_guessing_scores_under_the_accuracy_metric(num_features):
  """Random logits (a uniform guess per feature) scored by the objective's own metric."""
  config = tl.smoke("sraven", **{"task.num_features": num_features, "eval.ceiling_problems": 0})
  objective = objectives.build(config)
  chance = objective.run_metrics(config, "/nonexistent")["ood/accuracy_chance"]
  assert chance == pytest.approx(8.0 ** -num_features)
  batch = objective.task.sample(jax.random.key(0), 4096, "ood")
  inputs, _ = objective.encode(batch)
  hits = []
  for seed in range(16):
    logits = jax.random.normal(jax.random.key(seed), inputs.shape[:2] + (8,))
    hits.append(np.asarray(objective.metrics_fn(logits, batch)["accuracy"]))
  hits = np.concatenate(hits)
  standard_error = np.sqrt(chance * (1 - chance) / hits.size)
  assert abs(hits.mean() - chance) < 5 * standard_error


def test_the_entry_point_with_no_config_flag_trains_demo_and_explains_its_result(tmp_path):
  """The README's main job, shrunk to 8 steps by flags: the default config is size=demo and
  the final line names ceiling, chance and what the held-out split means. Paths print
  relative to where the user stands, as --workdir was given."""
  workdir = tmp_path / "first_run"
  overrides = {"num_train_steps": 8, "steps_per_loop": 4, "log_every_steps": 4,
               "eval_every_steps": 8, "checkpoint_every_steps": 8, "eval.num_problems": 32,
               "eval.batch_size": 16, "eval.ceiling_problems": 32,
               "optimizer.warmup_steps": 2}
  command = [sys.executable, os.path.join(tl.REPO, "experiments", "sraven_scaling.py"),
             "--workdir=first_run"] + [f"--config.{k}={v}" for k, v in overrides.items()]
  out = tl.run(command, env=tl.subprocess_env(), cwd=tmp_path, capture_output=True,
               text=True, check=True)
  with open(workdir / "config.json") as f:
    assert json.load(f)["task"]["num_features"] == 2
  with open(workdir / "summary.json") as f:
    summary = json.load(f)
  assert summary["ood/accuracy_chance"] == pytest.approx(1 / 64)
  log = out.stdout + out.stderr
  line = next(l for l in log.splitlines() if "Result:" in l)
  assert "chance 0.0156" in line and "ceiling" in line
  assert ("Summary: first_run/summary.json; TensorBoard: tensorboard --logdir first_run"
          in line), line
  assert "New run in first_run" in log and "-> first_run/checkpoints" in log, log
  assert str(tmp_path) not in log, log
  times = summary["ood/accuracy"] * 64
  assert f"{times:.0f}x chance on rule combinations held out of training" in line
