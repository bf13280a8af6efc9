"""TensorBoard after a resume (issue 25, point 9): constants are logged once, at step 0, and
population members log what single runs log (steps/s, hyperparameters).

Before, a resumed run wrote SRAVEN's accuracy ceilings again at the resume step, which
TensorBoard draws as a flat line from step 0 to it, and members had no `steps_per_sec`.
"""

import os

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from hypernet_attention.runs import curves
from hypernet_attention.train import loop

import train_testlib as tl

pytestmark = pytest.mark.e2e  # Drives the whole training loop (tests/pytest.ini).

CEILING = "test/accuracy_ceiling"


def _hparams_records(logdir: str) -> int:
  events = event_accumulator.EventAccumulator(logdir)
  events.Reload()
  return len(events.PluginTagToContent("hparams"))


def _check_logdir(logdir: str) -> None:
  scalars = curves.read_scalars(logdir)
  assert CEILING in scalars, sorted(scalars)
  for tag, (steps, _) in scalars.items():
    if tag.endswith("_ceiling"):
      assert steps.tolist() == [0], (tag, steps)  # Not again at the resume step (4).
  steps, rates = scalars["steps_per_sec"]
  assert steps.tolist() == [2, 4, 6, 8] and np.all(rates > 0), (steps, rates)
  assert _hparams_records(logdir) >= 1


def test_single_run_resumed_logs_constants_once(tmp_path):
  workdir = str(tmp_path / "run")
  config = tl.smoke("sraven", stop_after_steps=4, log_every_steps=2)
  assert loop.train_and_evaluate(config, workdir)["step"] == 4
  config = tl.smoke("sraven", log_every_steps=2)
  assert loop.train_and_evaluate(config, workdir)["step"] == 8
  _check_logdir(workdir)


def test_population_members_log_like_single_runs(tmp_path):
  workdir = str(tmp_path / "population")
  members = ({"seed": 0}, {"seed": 1})
  for stop in (4, None):
    config = tl.smoke("sraven", stop_after_steps=stop, log_every_steps=2)
    config.population.members = members
    loop.train_and_evaluate(config, workdir)
  for name in ("member0", "member1"):
    _check_logdir(os.path.join(workdir, name))
