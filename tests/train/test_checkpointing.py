"""Restore safety: mismatches are errors that move nothing, only unreadable steps are
quarantined, and the read-only `restore_params` never writes."""

import logging
import os
import shutil

import chex
import pytest

from hypernet_attention.runs import config_checks
from hypernet_attention.train import build
from hypernet_attention.train import checkpointing
from hypernet_attention.train import loop
from hypernet_attention.train import restore

import train_testlib as tl

pytestmark = pytest.mark.e2e  # Drives the whole training loop (tests/pytest.ini).


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A finished smoke run (checkpoints at steps 4 and 8)."""
  workdir = str(tmp_path_factory.mktemp("ckpt") / "wd")
  summary = loop.train_and_evaluate(tl.smoke("sraven", **{"eval.ceiling_problems": 0}),
                                    workdir)
  return workdir, summary


def _abstract_state(config):
  return build.setup(config_checks.validate(config)).restore_target()


@pytest.mark.parametrize("change, message", [
    # A wider MLP: same tree, different shape.
    ({"model.mlp_dim": 128}, r"'params/layers_0/feed_forward/down/kernel' is shape \(64, 32\) "
                             r"float32 in the checkpoint but shape \(128, 32\) float32"),
    # Code that adds a layer: a parameter the checkpoint does not have.
    ({"model.num_layers": 3}, r"'params/layers_2/attention/key/bias' is absent in the "
                              r"checkpoint but shape \(4, 4\) float32 in the model"),
])
def test_mismatched_checkpoint_is_an_error_and_nothing_moves(run, tmp_path, change, message):
  workdir = str(tmp_path / "wd")
  shutil.copytree(run[0], workdir)
  before = tl.snapshot(workdir)
  ckpt = checkpointing.Checkpointer(workdir, save_every=4, keep=3)
  with pytest.raises(checkpointing.CheckpointMismatchError, match=message):
    ckpt.restore_latest(_abstract_state(tl.smoke("sraven", **change)))
  ckpt.close()
  assert tl.snapshot(workdir) == before
  assert not os.path.exists(os.path.join(workdir, "corrupt_checkpoints"))


# Orbax runs each restore in an event loop of its own and closes it when the restore
# raises, while reads of the other arrays may still be in flight; one finishing later can
# reach the closed loop ("RuntimeError: Event loop is closed", printed, never raised; seen
# on Python 3.12). The restore had already failed and the step is quarantined: nothing lost.
@pytest.mark.filterwarnings(
    "ignore:(?s).*Event loop is closed:pytest.PytestUnraisableExceptionWarning")
def test_truncated_array_files_are_quarantined(run, tmp_path):
  """Metadata intact, array data truncated: unreadable, so moved aside; step 4 restores."""
  workdir = str(tmp_path / "wd")
  shutil.copytree(run[0], workdir)
  data_files = [os.path.join(root, name)
                for root, _, files in os.walk(os.path.join(workdir, "checkpoints", "8", "state"))
                for name in files if os.path.basename(root) == "d"]
  assert data_files, "no OCDBT data files found to truncate"
  for path in data_files:
    with open(path, "r+b") as f:
      f.truncate(max(os.path.getsize(path) // 3, 1))
  ckpt = checkpointing.Checkpointer(workdir, save_every=4, keep=3)
  state = ckpt.restore_latest(_abstract_state(tl.smoke("sraven", **{"eval.ceiling_problems": 0})))
  ckpt.close()
  assert int(state.step) == 4
  assert os.listdir(os.path.join(workdir, "corrupt_checkpoints"))[0].startswith("8-")


def test_restore_params_is_read_only_and_exact(run, caplog):
  workdir, summary = run
  before = tl.snapshot(workdir)
  with caplog.at_level(logging.INFO):
    latest = restore.restore_params(workdir)
  # Read-only is what was asked for: Orbax's warnings saying so are not shown to users.
  assert not [r.getMessage() for r in caplog.records
              if r.levelno >= logging.WARNING and "orbax" in r.pathname]
  assert latest.step == 8 and latest.config.experiment == "sraven"
  chex.assert_trees_all_equal(latest.params, summary["state"].params)
  assert restore.restore_params(workdir, step=4).step == 4
  # Step 0 (never saved) is the seed's initialization: equal to a fresh init of the config.
  init = restore.restore_params(workdir, step=0)
  s = build.setup(config_checks.validate(init.config))
  chex.assert_trees_all_equal(init.params,
                              build.init_state(init.config, s.init_fn, s.shardings).params)
  assert tl.snapshot(workdir) == before


def test_restore_params_bad_input(run, tmp_path):
  workdir = run[0]
  with pytest.raises(ValueError, match=r"no checkpoint at step 5 .*available steps: \[4, 8\]"):
    restore.restore_params(workdir, step=5)
  with pytest.raises(ValueError, match="does not exist"):
    restore.restore_params(str(tmp_path / "nope"))
  with pytest.raises(ValueError, match="holds no config.json"):
    restore.restore_params(str(tmp_path))
  empty = tmp_path / "empty"
  empty.mkdir()
  shutil.copy(os.path.join(workdir, "config.json"), empty / "config.json")
  with pytest.raises(ValueError, match="no checkpoints in .*use step=0"):
    restore.restore_params(str(empty))
  (empty / "config.json").write_text('{"experiment": "sraven", "model": ')
  with pytest.raises(ValueError, match="config.json is not readable JSON"):
    restore.restore_params(str(empty))
