"""Populations: member i equals the single run with its settings; outputs, resume, NaN
members, bad input; the authors' learning-rate schedule against its closed form."""

import json
import math
import os

import chex
import jax
import numpy as np
import pytest

from hypernet_attention import errors
from hypernet_attention.runs import config_checks
from hypernet_attention.train import build
from hypernet_attention.train import loop
from hypernet_attention.train import metrics as metrics_lib
from hypernet_attention.train import population
from hypernet_attention.train import restore
from hypernet_attention.train import state as state_lib
from hypernet_attention.train import trainer as trainer_lib
from launch import collect

import numerics
import train_testlib as tl

pytestmark = pytest.mark.e2e  # Drives the whole training loop (tests/pytest.ini).

STEPS = 8
# Every batchable key differs between the two members.
MEMBERS = ({"seed": 0},
           {"seed": 1, "task.split_seed": 5, "optimizer.learning_rate": 3e-3,
            "optimizer.weight_decay": 0.3, "optimizer.warmup_steps": 3})


def _single_run(config):
  s = build.setup(config_checks.validate(config))
  trainer = trainer_lib.Trainer(config, s)
  state, metrics = trainer.train_chunk(build.init_state(config, s.init_fn, s.shardings), STEPS)
  return (np.asarray(metrics.per_step["loss"]), tl.flat_params(state.params),
          trainer.evaluate(state.params))


def _max_rel(a: dict, b: dict) -> float:
  """Largest leaf-wise max |a - b| / max |b|."""
  return max(float(np.abs(a[k] - b[k]).max() / np.abs(b[k]).max()) for k in b)


def test_members_equal_single_runs():
  config = tl.smoke("sraven", **{"population.members": MEMBERS})
  p = population.setup(config_checks.validate(config))
  trainer = population.PopulationTrainer(p)
  state, metrics = trainer.train_chunk(trainer.init_state(), STEPS)
  evals = trainer.evaluate(state.params)
  singles = [_single_run(c) for c in p.member_configs]
  # vmap reorders float32 reductions (batch x tokens x width per entry). Rule of
  # tests/numerics.py: any ordering is within n * u per step, accumulated over the steps.
  n = config.batch_size * 36 * config.model.emb_dim
  bound = STEPS * n * numerics.U_FLOAT32
  for i, (losses, params, evaluation) in enumerate(singles):
    member_params = tl.flat_params(metrics_lib.member(state, i).params)
    loss_err = float(np.max(np.abs(metrics.per_step["loss"][i] - losses) / np.abs(losses)))
    assert loss_err < bound, (i, loss_err, bound)  # Measured: <= 1.2e-7.
    assert _max_rel(member_params, params) < bound  # Measured: <= 1.6e-6.
    for key, value in evaluation.items():
      assert abs(evals[i][key] - value) <= bound * max(1.0, abs(value)), key
  # A member compared with the other member's run is off by far more than the bound.
  other = tl.flat_params(metrics_lib.member(state, 1).params)
  assert _max_rel(other, singles[0][1]) > 100 * bound


def test_member_keys_refused_in_one_line():
  config = tl.smoke("sraven", **{"population.members": ({"seed": 0}, {"model.num_layers": 3})})
  with pytest.raises(errors.BadInput, match=r"members\[1\] sets 'model.num_layers'"):
    population.setup(config_checks.validate(config))
  config = tl.smoke("sraven", **{"population.members": ({"seed": 0}, {"seed": 1}),
                                 "population.member_names": ("a", "a")})
  with pytest.raises(errors.BadInput, match="member_names"):
    population.setup(config_checks.validate(config))


def _population(workdir, **updates):
  config = tl.smoke("fuzzy_logic", **updates)
  config.async_checkpoints = False
  # Member 1's first update overflows: frozen, while member 0 trains on.
  config.population.members = ({"seed": 0}, {"seed": 1, "optimizer.learning_rate": 1e38})
  config.population.member_names = ("seed=0", "seed=1,lr=1e38")
  return loop.train_and_evaluate(config, workdir)


def test_resume_outputs_and_frozen_member(tmp_path):
  whole = _population(str(tmp_path / "whole"))
  _population(str(tmp_path / "killed"), stop_after_steps=4)
  resumed = _population(str(tmp_path / "killed"))
  chex.assert_trees_all_equal(whole["state"], resumed["state"])  # Bit for bit.
  healthy, frozen = resumed["members"]
  assert "frozen_at_step" not in healthy and math.isfinite(healthy["ood/r2"])
  # Frozen at its last finite training state (whose evaluation may overflow itself).
  assert frozen["frozen_at_step"] >= 1
  assert math.isfinite(whole["members"][1].get("train/loss", 0.0))
  # Members are runs to the rest of the project: collect, restore, config.json.
  root = str(tmp_path / "killed")
  runs = [r for r in collect.load_runs(root) if r.summary is not None]
  assert [os.path.basename(r.workdir) for r in runs] == ["seed=0", "seed=1,lr=1e38"]
  assert [r.config["seed"] for r in runs] == [0, 1]
  assert runs[1].config["optimizer.learning_rate"] == 1e38
  assert not runs[0].config["population.members"]
  with open(os.path.join(root, "seed=0", "summary.json")) as f:
    assert json.load(f)["ood/r2"] == healthy["ood/r2"]
  restored = restore.restore_params(root, member=0)
  by_dir = restore.restore_params(os.path.join(root, "seed=0"))
  expected = metrics_lib.member(resumed["state"], 0).params
  for got in (restored, by_dir):
    assert got.config.seed == 0 and got.step == STEPS
    chex.assert_trees_all_equal(got.params, expected)
  with pytest.raises(ValueError, match="population of 2 members"):
    restore.restore_params(root)


def _closed_form(step, peak, warmup, total, end_fraction, authors):
  """Linear warmup from 0, then a half cosine from peak to end_fraction * peak over
  `total - warmup` steps (ours) or `total - 2 * warmup` (the authors' decay_steps =
  total - warmup, inside which optax counts the warmup); the floor after it."""
  if step < warmup:
    return peak * step / warmup
  length = total - warmup - (warmup if authors else 0)
  progress = min(step - warmup, length) / length
  end = end_fraction * peak
  return end + (peak - end) * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize("authors", [False, True])
def test_learning_rate_schedule_closed_form(authors):
  config = tl.smoke("sraven", num_train_steps=1000, **{
      "optimizer.warmup_steps": 100, "optimizer.learning_rate": 1e-3,
      "optimizer.authors_schedule": authors})
  schedule = state_lib.learning_rate_schedule(config)
  traced = state_lib.traced_learning_rate_schedule(
      config, jax.numpy.float32(1e-3), jax.numpy.int32(100))
  for step in (0, 50, 100, 101, 450, 799, 800, 900, 999, 1000):
    expected = _closed_form(step, 1e-3, 100, 1000, 0.1, authors)
    assert float(schedule(step)) == pytest.approx(expected, rel=1e-5, abs=1e-9), step
    assert float(traced(jax.numpy.int32(step))) == pytest.approx(expected, rel=1e-5, abs=1e-9)
  floor_from = 900 if authors else 1000
  assert float(schedule(floor_from)) == pytest.approx(1e-4, rel=1e-6)
  assert float(schedule(floor_from - 50)) > 1.01e-4


def test_authors_schedule_needs_a_cosine_part():
  config = tl.smoke("sraven", **{"optimizer.authors_schedule": True,
                                 "optimizer.warmup_steps": 4})
  with pytest.raises(errors.BadInput, match="num_train_steps > 2 \\* warmup_steps"):
    build.setup(config_checks.validate(config))


def test_sigterm_population_exits_75_and_resumes_bit_identical(tmp_path):
  """As tests/e2e/test_preemption.py for a single run: SIGTERM after step 8 -> checkpoint ->
  exit 75 -> the rerun ends with an uninterrupted population's parameters, bit for bit."""
  import signal  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top

  import test_preemption as tp  # pylint: disable=g-import-not-at-top
  members = ("--config.population.members=({'seed': 0}, "
             "{'seed': 1, 'optimizer.learning_rate': 0.003})")

  def start(workdir, log_path):
    log = open(log_path, "w")
    return subprocess.Popen(tp._command(workdir) + [members], env=tp._env(1), stdout=log,  # pylint: disable=protected-access
                            stderr=subprocess.STDOUT, cwd=tl.REPO), log

  workdir, reference = tmp_path / "preempted", tmp_path / "uninterrupted"
  procs = [start(workdir, tmp_path / "first.log")]
  tp._wait_for_training(procs[0][1].name, procs)  # pylint: disable=protected-access
  procs[0][0].send_signal(signal.SIGTERM)
  codes, texts = tp._finish(procs)  # pylint: disable=protected-access
  assert codes == [tp.preemption.EXIT_CODE], texts[0][-3000:]
  stopped = max(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit())
  assert 8 <= stopped < tp.STEPS and f"checkpoint saved at step {stopped}" in texts[0]
  for launch in (start(workdir, tmp_path / "second.log"),
                 start(reference, tmp_path / "reference.log")):
    codes, texts = tp._finish([launch])  # pylint: disable=protected-access
    assert codes == [0], texts[0][-3000:]
  for member in (0, 1):
    a = restore.restore_params(str(workdir), tp.STEPS, member=member)
    b = restore.restore_params(str(reference), tp.STEPS, member=member)
    chex.assert_trees_all_equal(a.params, b.params)
