"""`launch.collect` on synthetic sweep roots: best setting, mean and s.e., missing jobs."""

import csv
import json
import math
import os

import pytest

from launch import collect
from launch import jobs
from launch import sweeps

# (attention, lr, seed) -> (ood r2, test r2), made up so that the OOD and the test metric
# pick different settings for HYLA.
RESULTS = {
    ("hyla", 1e-3, 0): (0.70, 0.90), ("hyla", 1e-3, 1): (0.80, 0.92),
    ("hyla", 1e-3, 2): (0.75, 0.91),
    ("hyla", 3e-3, 0): (0.88, 0.80), ("hyla", 3e-3, 1): (0.70, 0.82),  # Seed 2 unfinished.
    ("softmax", 1e-3, 0): (0.60, 0.95), ("softmax", 1e-3, 1): (0.50, 0.96),
    ("softmax", 3e-3, 0): (0.40, 0.97), ("softmax", 3e-3, 1): (0.30, 0.98),
}


def _write_run(root, attention, lr, seed, result=None):
  point = {"config": f"model={attention},size=paper", "optimizer.learning_rate": lr,
           "optimizer.weight_decay": 0.1, "seed": seed}
  workdir = os.path.join(root, jobs.point_name(point))
  os.makedirs(workdir)
  config = {"experiment": "fuzzy_logic", "seed": seed, "stop_after_steps": None,
            "mesh": {"data": -1}, "task": {"num_examples": 32, "split_seed": None},
            "model": {"attention": attention, "feed_forward": "gelu_mlp"},
            "optimizer": {"learning_rate": lr, "weight_decay": 0.1, "warmup_steps": 100}}
  if seed != 1:  # Runs written before a resume-free key existed lack it: same cells.
    config["debug_nans"] = seed == 2
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(config, f)
  if result is not None:
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      json.dump({"ood/r2": result[0], "test/r2": result[1], "wall_time_s": 60.0}, f)
    with open(os.path.join(workdir, "run_local.json"), "w") as f:
      f.write(json.dumps({"wall_s": 60.0, "cpu_s": 90.0, "returncode": 0}) + "\n")
  return point


@pytest.fixture
def root(tmp_path):
  for (attention, lr, seed), result in RESULTS.items():
    _write_run(tmp_path, attention, lr, seed, result)
  _write_run(tmp_path, "hyla", 3e-3, 2)  # Started, never finished.
  return str(tmp_path)


def _se(values):
  """Standard error by hand: sqrt(sum((v - mean)^2) / (n - 1)) / sqrt(n)."""
  n = len(values)
  mean = sum(values) / n
  return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) / math.sqrt(n)


def test_picks_best_setting_by_ood_mean_over_seeds(root):
  cells = {c.key[0]: c for c in collect.tabulate(collect.load_runs(root), "ood")}
  hyla = cells["hyla"]  # OOD mean: lr 3e-3 (0.88 + 0.70) / 2 = 0.79 > lr 1e-3 0.75.
  assert hyla.setting == {"optimizer.learning_rate": 3e-3, "optimizer.weight_decay": 0.1,
                          "optimizer.warmup_steps": 100}
  assert hyla.seeds == (0, 1) and hyla.num_settings == 2
  assert hyla.ood.mean == pytest.approx((88 + 70) / 2)
  assert hyla.ood.se == pytest.approx(_se([88.0, 70.0]))
  assert hyla.test.mean == pytest.approx((80 + 82) / 2)
  softmax = cells["softmax"]  # OOD mean 0.55 at lr 1e-3 > 0.35 at 3e-3.
  assert softmax.setting["optimizer.learning_rate"] == 1e-3
  assert softmax.ood.mean == pytest.approx(55.0)
  assert softmax.ood.se == pytest.approx(_se([60.0, 50.0]))
  assert softmax.paper == (63.28, 2.31)
  assert [c.label for c in collect.tabulate(collect.load_runs(root))] == [
      "Softmax attention", "HYLA"]  # Table A1's row order.


def test_test_selection_ignores_ood(root):
  cells = {c.key[0]: c for c in collect.tabulate(collect.load_runs(root), "test")}
  hyla = cells["hyla"]  # Test mean: lr 1e-3 0.91 > lr 3e-3 0.81.
  assert hyla.setting["optimizer.learning_rate"] == 1e-3 and hyla.seeds == (0, 1, 2)
  assert hyla.ood.mean == pytest.approx((70 + 80 + 75) / 3)
  assert hyla.ood.se == pytest.approx(_se([70.0, 80.0, 75.0]))
  assert cells["softmax"].setting["optimizer.learning_rate"] == 3e-3  # 0.975 > 0.955.


def test_rows_are_paired_with_softmax_by_seed(root):
  cells = collect.tabulate(collect.load_runs(root), "ood")
  [hyla] = collect.paired(cells)
  # HYLA's best (lr 3e-3) minus softmax's best (lr 1e-3), seeds 0 and 1: 88-60, 70-50.
  assert hyla.label == "HYLA" and hyla.seeds == (0, 1) and hyla.wins == 2
  assert hyla.diff.mean == pytest.approx(24.0) and hyla.diff.se == pytest.approx(_se([28, 20]))
  # t = 24 / 4 = 6 with 1 degree of freedom (a Cauchy law): p = 1 - 2 atan(6) / pi.
  assert hyla.p_value == pytest.approx(1 - 2 * math.atan(6.0) / math.pi)
  assert collect.paired([c for c in cells if c.key[0] != "softmax"]) == []


def test_single_seed_has_no_standard_error(tmp_path):
  _write_run(tmp_path, "linear", 1e-3, 0, (0.5, 0.6))
  [cell] = collect.tabulate(collect.load_runs(str(tmp_path)))
  assert math.isnan(cell.ood.se) and str(cell.ood) == "50.00"


def test_report_writes_files_and_lists_missing_jobs(root, monkeypatch):
  sweep = type("Sweep", (), {"EXPERIMENT": "fuzzy_logic", "get_sweep": staticmethod(lambda: [
      {"config": f"model={a},size=paper", "optimizer.learning_rate": lr,
       "optimizer.weight_decay": 0.1, "seed": seed}
      for a in ("softmax", "hyla") for lr in (1e-3, 3e-3) for seed in (0, 1, 2)])})
  monkeypatch.setattr(sweeps, "load", lambda name: sweep)
  out = os.path.join(root, "out")
  text = collect.report(root, "fake_sweep", "ood", out)
  missing = text.split("Missing jobs of sweep fake_sweep (3):\n")[1].splitlines()
  assert missing == ["- model=softmax,size=paper,optimizer.learning_rate=0.001,"
                     "optimizer.weight_decay=0.1,seed=2",
                     "- model=softmax,size=paper,optimizer.learning_rate=0.003,"
                     "optimizer.weight_decay=0.1,seed=2",
                     "- model=hyla,size=paper,optimizer.learning_rate=0.003,"
                     "optimizer.weight_decay=0.1,seed=2"]
  assert "| HYLA | 2 (0,1) | lr 0.003, wd 0.1, warmup 100 (2) | 79.00 ± 9.00 |" in text
  assert "| HYLA | 2 | 24.00 ± 4.00 | 2 of 2 |" in text
  assert "9 finished runs" in text and f"{9 * 90 / 3600:.2f} h (run_local)" in text
  with open(os.path.join(out, "table_a1.csv")) as f:
    rows = list(csv.DictReader(f))
  assert [r["row"] for r in rows] == ["Softmax attention", "HYLA"]
  assert float(rows[1]["ood_mean"]) == pytest.approx(79.0)
  assert float(rows[1]["paper_mean"]) == 81.13
  assert os.path.getsize(os.path.join(out, "table_a1.png")) > 1000


def test_no_finished_run_is_a_clear_error(tmp_path):
  _write_run(tmp_path, "hyla", 1e-3, 0)
  with pytest.raises(ValueError, match="no finished run"):
    collect.report(str(tmp_path), None, "ood", str(tmp_path))
  with pytest.raises(ValueError, match="select='best'; allowed: ood, test"):
    collect.tabulate([], "best")


def _warnings():
  lines = []
  return lines, lines.append


def test_a_point_trained_twice_counts_once(root, tmp_path):
  """A population member and a single run of the same point (or two identical members of
  an old population) are one seed, with a warning naming both (issue 25, point 3)."""
  lines, warn = _warnings()
  expected = collect.tabulate(collect.load_runs(root, warn))
  assert lines == []
  name = jobs.point_name(_write_run(os.path.join(root, "x"), "hyla", 1e-3, 0, (0.1, 0.1)))
  os.rename(os.path.join(root, "x"), os.path.join(root, "pop"))
  with open(os.path.join(root, "pop", "config.json"), "w") as f:  # Its population's record.
    json.dump({"experiment": "fuzzy_logic", "population": {"members": [{"seed": 0}]}}, f)
  runs = collect.load_runs(root, warn)
  assert collect.tabulate(runs) == expected
  assert lines == [f"warning: {root}/pop/{name} is the same run as {root}/{name} (same "
                   "config); counted once"]


def test_a_frozen_member_is_a_failed_run(root):
  workdir = os.path.join(root, jobs.point_name({
      "config": "model=hyla,size=paper", "optimizer.learning_rate": 1e-3,
      "optimizer.weight_decay": 0.1, "seed": 0}))
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  summary.update({"frozen_at_step": 2, "ood/r2": 0.99, "test/r2": 0.99})
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f)
  lines, warn = _warnings()
  runs = collect.load_runs(root, warn)
  assert lines == [f"warning: {workdir} failed: its loss turned non-finite at step 2 (a "
                   "frozen population member); not counted"]
  assert all(0.99 * 100 not in c.ood.values for c in collect.tabulate(runs))
  text = collect.report(root, None, "ood", root)
  assert f"Failed runs (non-finite loss; not counted):\n- {os.path.basename(workdir)} " \
         "(frozen at step 2)" in text
