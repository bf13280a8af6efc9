"""`launch.collect` on a root holding two sweeps: rows are paired only within their sweep;
unreadable runs are skipped by name; a `--sweep` of another experiment is refused."""

import json
import os

import pytest

from hypernet_attention import errors
from launch import collect

# (num_examples: the setting that tells the two sweeps apart, attention, seed) -> OOD r2.
OOD = {(32, "softmax", 0): 0.50, (32, "softmax", 1): 0.60,
       (32, "hyla", 0): 0.70, (32, "hyla", 1): 0.90,
       (16, "softmax", 0): 0.20, (16, "softmax", 1): 0.10,
       (16, "hyla", 0): 0.30, (16, "hyla", 1): 0.40}


def _write(root, name, config, summary):
  workdir = os.path.join(root, name)
  os.makedirs(workdir)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config if isinstance(config, str) else json.dumps(config))
  if summary is not None:
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      f.write(summary if isinstance(summary, str) else json.dumps(summary))
  return workdir


@pytest.fixture
def root(tmp_path):
  for (examples, attention, seed), ood in OOD.items():
    config = {"experiment": "fuzzy_logic", "seed": seed, "task": {"num_examples": examples},
              "model": {"attention": attention, "feed_forward": "gelu_mlp"},
              "optimizer": {"learning_rate": 1e-3, "weight_decay": 0.1, "warmup_steps": 10}}
    _write(tmp_path, f"n{examples}_{attention}_{seed}", config,
           {"ood/r2": ood, "test/r2": 0.9, "wall_time_s": 1.0})
  return str(tmp_path)


def test_rows_are_paired_only_within_their_sweep(root):
  pairs = {p.label: p for p in collect.paired(collect.tabulate(collect.load_runs(root)))}
  assert sorted(pairs) == ["HYLA, task.num_examples=16", "HYLA, task.num_examples=32"]
  # By hand: HYLA minus the softmax run of the same sweep and seed, x100.
  assert pairs["HYLA, task.num_examples=32"].diff.values == pytest.approx((20.0, 30.0))
  assert pairs["HYLA, task.num_examples=16"].diff.values == pytest.approx((10.0, 30.0))
  assert pairs["HYLA, task.num_examples=16"].diff.mean == pytest.approx(20.0)


def test_unreadable_runs_are_skipped_by_name(root):
  broken_summary = _write(root, "broken_summary", {"experiment": "fuzzy_logic", "seed": 0},
                          '{"ood/r2": 0.')
  broken_config = _write(root, "broken_config", '{"experiment": "fuz', None)
  warnings = []
  runs = collect.load_runs(root, warn=warnings.append)
  assert len(runs) == len(OOD)
  assert warnings == [
      f"warning: skipping {broken_config}: {broken_config}/config.json is not readable JSON "
      "(Unterminated string starting at: line 1 column 16 (char 15)); it was left as it is: "
      "restore or remove it",
      f"warning: skipping {broken_summary}: {broken_summary}/summary.json is not readable "
      "JSON (Expecting ',' delimiter: line 1 column 13 (char 12)); it was left as it is: "
      "restore or remove it"]


def test_sweep_of_another_experiment_is_refused(root):
  with pytest.raises(errors.BadInput, match=(
      r"--sweep=table_a1_sraven_local is a 'sraven' sweep but the runs under the root are "
      r"\['fuzzy_logic'\]")):
    collect.report(root, "table_a1_sraven_local", "ood", os.path.join(root, "out"))
  assert not os.path.exists(os.path.join(root, "out"))
