"""The paper-scale campaign (`launch/campaign/`): cells, cell files, estimates, the budget,
resume of a cut-off cell, the report from the files alone, and bad input."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from hypernet_attention import errors
from hypernet_attention.runs import machine
from hypernet_attention.runs import registry
from hypernet_attention.runs import run_files
from launch import jobs
from launch.campaign import cells as cells_lib
from launch.campaign import collect_cell
from launch.campaign import partial
from launch.campaign import plan
from launch.campaign import records
from launch.campaign import report
from launch.campaign import runner

import train_testlib as tl

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CPU = {"platform": "cpu", "kind": "cpu", "count": 1, "jax_version": "test"}


def test_cells_cover_table_a1_in_priority_order():
  stages = [c.stage for c in cells_lib.CELLS]
  assert stages == sorted(stages)  # a before b before ... h
  # Table A1: 13 rows x grid x 3 seeds = 156 fuzzy-logic + 312 SRAVEN runs, each once.
  runs = [(c.experiment, c.config, tuple(sorted(dict(c.overrides).items())),
           tuple(sorted(m.items())))
          for c in cells_lib.CELLS if c.stage in "abde" for m in c.members]
  fuzzy = [r for r in runs if r[0] == "fuzzy_logic"]
  assert (len(fuzzy), len(runs) - len(fuzzy)) == (156, 312)
  first = cells_lib.CELLS[:3]
  assert [c.model for c in first] == ["hyla", "softmax", "linear"]
  assert all(c.num_steps == 50_000 and len(c.members) == 1 for c in first)
  # Stage d starts with fuzzy logic's ablation rows at the default setting, 3 seeds each,
  # the three that separate HYLA's two changes first; e then holds the rest of their grids.
  d = [c for c in cells_lib.CELLS if c.stage == "d"]
  assert [c.model for c in d[:3]] == ["linear_rmshead", "hyla_no_rmshead", "hyla_linear_value"]
  assert all(c.experiment == "fuzzy_logic" and c.member_names == ("seed0", "seed1", "seed2")
             and dict(c.overrides)["optimizer.learning_rate"] == 1e-3 for c in d[:3])
  b = cells_lib.BY_NAME["b_sraven_hyla"]
  assert b.num_steps == 156_250 and "width=1,depth=4" in b.config
  assert dict(b.overrides)["optimizer.warmup_steps"] == 1000


def test_default_members_become_one_population_flag():
  args = jobs.job_args(cells_lib.BY_NAME["a_fuzzy_hyla_seed0"].point(), "fuzzy_logic", "W")
  assert args["config.population.members"] == "({'seed': 0},)"
  assert args["config.population.member_names"] == "('seed0',)"
  assert args["config.optimizer.learning_rate"] == "0.001"
  h = jobs.job_args(cells_lib.BY_NAME["h_fuzzy_hyla_authors_split_seed2"].point(),
                    "fuzzy_logic", "W")
  assert h["config.task.split_draw"] == "authors"
  assert h["config.population.members"] == "({'seed': 2},)"


# ml_collections loads a config file with the deprecated importlib load_module, once a cell.
@pytest.mark.filterwarnings("ignore:the load_module:DeprecationWarning")
def test_every_train_cell_s_flags_are_accepted_by_its_entry_point(monkeypatch):
  """Each cell's command line, parsed by the config flag as the entry point parses it: an
  override the config cannot take (an untyped None field, a wrong key) fails here, not five
  seconds into a campaign (stage h's `task.split_draw` did)."""
  from absl import flags as absl_flags
  from ml_collections import config_flags
  train = [c for c in cells_lib.CELLS if c.kind == "train"]
  assert {c.stage for c in train} == set("abdefh")
  for cell in train:
    argv = runner.command(cell, "W", runner.Options(root="R", results_dir="F", budget_s=1.0))[1:]
    monkeypatch.setattr(sys, "argv", argv)  # config_flags finds overrides in sys.argv.
    monkeypatch.chdir(REPO)
    flag_values = absl_flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, flag_values=flag_values)
    absl_flags.DEFINE_string("workdir", None, "", flag_values=flag_values)
    flag_values(argv)
    config = flag_values.config
    for key, value in cell.point().items():
      if key != "config":
        assert str(_get(config, key)) == str(value), (cell.name, key)
    # What a run of the cell records is what the runner compares a workdir against.
    assert cells_lib.run_differences(cell, run_files.config_to_json(config)) == [], cell.name


def _get(config, dotted_key):
  for part in dotted_key.split("."):
    config = config[part]
  return config


def _record(cell, model, seeds_values, stage="a", experiment="fuzzy_logic", kind="train",
            device="cpu", rate=10.0):
  metric = "r2" if experiment == "fuzzy_logic" else "accuracy"
  members = [{"name": f"seed{s}", "frozen_at_step": None,
              "settings": {"seed": s, "task.split_seed": None,
                           "optimizer.learning_rate": 1e-3, "optimizer.weight_decay": 0.1,
                           "optimizer.warmup_steps": 100 if experiment == "fuzzy_logic"
                           else 1000},
              "final": {f"ood/{metric}": v, f"test/{metric}": v + 0.05,
                        f"unseen_terms/{metric}": 0.1},
              "curves": {f"ood/{metric}": [[0, 0.0], [50_000, v]]}}
             for s, v in seeds_values]
  return {"schema": records.SCHEMA, "cell": cell, "stage": stage, "kind": kind,
          "experiment": experiment, "model": model, "config": f"model={model},size=paper",
          "overrides": {}, "title": cell, "device": {"kind": device, "host_cpu": None},
          "jax_version": "test", "python": "3", "commit": "abc", "wall_s": 100.0,
          "processes": [], "num_steps": 50_000, "scale": 1.0, "members": members,
          "member_steps_per_s": rate}


def test_publish_never_clobbers_and_redo_replaces(tmp_path):
  first = _record("a_fuzzy_hyla_seed0", "hyla", [(0, 0.8)])
  assert records.publish(str(tmp_path), first)
  second = _record("a_fuzzy_hyla_seed0", "hyla", [(0, 0.1)])
  assert not records.publish(str(tmp_path), second)  # Another runner's file stays.
  path = records.path_of(str(tmp_path), "a_fuzzy_hyla_seed0")
  assert records.read(path)["members"][0]["final"]["ood/r2"] == 0.8
  assert records.publish(str(tmp_path), second, replace=True)
  assert records.read(path)["members"][0]["final"]["ood/r2"] == 0.1
  assert sorted(os.listdir(tmp_path)) == ["a_fuzzy_hyla_seed0.json"]  # No temporaries left.


@pytest.mark.parametrize("content, message", [
    ('{"schema": 1, "cell": "a_fuzzy_hyla_seed0"', "unreadable"),
    ('{"schema": 1}', "field cell is missing; allowed: a string"),
    ('[1, 2]', "holds \\[1, 2\\]; allowed: an object"),
    ('{"schema": 2}', "schema 2; allowed: 1"),
])
def test_a_corrupt_cell_file_is_named(tmp_path, content, message):
  (tmp_path / "a_fuzzy_hyla_seed0.json").write_text(content)
  with pytest.raises(errors.BadInput, match=f"a_fuzzy_hyla_seed0.json.*{message}"):
    records.read_all(str(tmp_path))


def test_a_users_own_json_in_the_results_dir_is_not_a_cell_file(tmp_path):
  """notes.json beside the cell files once stopped every campaign run (BadInput: not a
  cell file); a damaged file named as a cell still is one."""
  (tmp_path / "notes.json").write_text('{"todo": "rerun the softmax cells"}')
  assert records.read_all(str(tmp_path)) == {}
  (tmp_path / "a_fuzzy_hyla_seed0.json").write_text("{}")
  with pytest.raises(errors.BadInput, match="a_fuzzy_hyla_seed0.json"):
    records.read_all(str(tmp_path))


def test_claims_exclude_a_live_runner_and_take_over_a_dead_one(tmp_path):
  other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    claim = tmp_path / ".a_fuzzy_hyla_seed0.claim"
    claim.write_text(json.dumps({"host": os.uname().nodename, "pid": other.pid}))
    assert records.claim(str(tmp_path), "a_fuzzy_hyla_seed0")["pid"] == other.pid
  finally:
    other.kill()
    other.wait()
  assert records.claim(str(tmp_path), "a_fuzzy_hyla_seed0") is None  # Its runner is gone.
  assert json.loads(claim.read_text())["pid"] == os.getpid()
  records.release(str(tmp_path), "a_fuzzy_hyla_seed0")
  assert not claim.exists()


def test_a_probe_of_a_run_finished_without_parameters_is_told_how_to_get_them(tmp_path):
  """Fig. 2B's later seeds decode runs that finished before parameters were kept: the plan
  names the rerun; a source that never ran is only 'blocked'."""
  cell_set = [c for c in cells_lib.CELLS if c.name in (
      "c_fuzzy_decoding_hyla_seed1", "c_sraven_decoding_linear")]
  assert len(cell_set) == 2
  records = {"a_fuzzy_hyla_seed1": _record("a_fuzzy_hyla_seed1", "hyla", [(1, 0.9)])}
  text = report.plan_text(cell_set, records, "cpu", str(tmp_path / "root"), None,
                          results_dir=str(tmp_path / "results"))
  lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("c_")}
  assert "rerun it with `--redo=a_fuzzy_hyla_seed1`" in lines["c_fuzzy_decoding_hyla_seed1"]
  assert "blocked: needs b_sraven_linear's" in lines["c_sraven_decoding_linear"]
  assert "--redo" not in lines["c_sraven_decoding_linear"]


def test_the_dry_run_plans_what_redo_would_rerun(tmp_path):
  """--redo with --dry_run: the finished cell is in the plan as a rerun (it said "1 of 1
  cells done" and planned nothing, though the real run would retrain it)."""
  cell_set = [cells_lib.BY_NAME["a_fuzzy_hyla_seed1"]]
  records = {"a_fuzzy_hyla_seed1": _record("a_fuzzy_hyla_seed1", "hyla", [(1, 0.9)])}
  plan_of = lambda redo: report.plan_text(cell_set, records, "cpu", str(tmp_path / "root"), 300,
                                          results_dir=str(tmp_path / "results"), redo=redo)
  assert "1 of 1 cells done" in plan_of(frozenset()) and "a_fuzzy" not in plan_of(frozenset())
  rerun = plan_of(frozenset({"a_fuzzy_hyla_seed1"}))
  assert "0 of 1 cells done" in rerun
  assert any(line.startswith("a_fuzzy_hyla_seed1") and "fits; rerun (--redo)" in line
             for line in rerun.splitlines()), rerun


def test_estimates_use_measured_cells_then_references_and_resume_points(tmp_path):
  cell = cells_lib.BY_NAME["a_fuzzy_hyla_seed1"]
  reference = plan.estimate(cell, "cpu", [])
  rates, _ = registry.get("fuzzy_logic").paper.reference_rates["cpu"]
  rate = rates["hyla"] / plan.EVAL_OVERHEAD
  assert reference.minutes == pytest.approx((50_000 / rate + plan.COMPILE_S["cpu"]) / 60)
  measured = plan.estimate(cell, "cpu", [_record("a_fuzzy_hyla_seed0", "hyla", [(0, 0.8)],
                                                 rate=25.0)])
  assert measured.minutes == pytest.approx(50_000 / 25.0 / 60)
  assert "measured" in measured.source
  (tmp_path / "checkpoints" / "30000").mkdir(parents=True)
  resumed = plan.estimate(cell, "cpu", [], str(tmp_path))
  assert resumed.done_steps == 30_000
  assert resumed.minutes < reference.minutes / 2
  assert plan.estimate(cell, plan.H100, []).minutes < reference.minutes / 10
  # A cut-off cell's saved state (partial/) counts where its workdir has no checkpoint yet
  # (another machine); a checkpoint in the workdir wins.
  saved = plan.estimate(cell, "cpu", [], str(tmp_path / "elsewhere"),
                        _progress(cell.name, 40_000, device="TPU v5e"))
  assert saved.done_steps == 40_000
  assert saved.minutes == pytest.approx(
      (10_000 / rate + plan.COMPILE_S["cpu"]) / 60)
  assert plan.estimate(cell, "cpu", [], str(tmp_path),
                       _progress(cell.name, 40_000)).done_steps == 30_000
  ((_, here, cpu, _),) = report.remaining({}, [cell], str(tmp_path / "elsewhere"), "cpu",
                                          {cell.name: _progress(cell.name, 45_000)})
  assert here.done_steps == cpu.done_steps == 45_000


def _progress(cell, step, wall_s=1000.0, device="cpu"):
  """The fields of a cut-off cell's progress record (`partial.py`) that estimates read."""
  return {"cell": cell, "step": step, "wall_s": wall_s, "device": {"kind": device}}


def test_estimates_prefer_the_preset_then_the_cells_own_run_over_its_family():
  """HYLA+ (Eq. 10) steps slower than HYLA: a finished HYLA cell's rate would promise a
  HYLA+ cell too soon. Its own preset's finished cells come first, then its own cut-off run
  on this device kind (steps x members / wall seconds so far), then its family."""
  cell = cells_lib.BY_NAME["d_fuzzy_hyla_deep_default"]
  members = len(cell.members)
  hyla = _record("d_fuzzy_hyla_default", "hyla", [(0, 0.9)], stage="d", rate=30.0)
  family = plan.estimate(cell, "cpu", [hyla])
  assert family.minutes == pytest.approx(50_000 * members / 30.0 / 60)
  assert "1 hyla cell(s)" in family.source
  own = _progress(cell.name, 10_000, wall_s=4000.0)  # 2.5 steps/s on this cpu
  resumed = plan.estimate(cell, "cpu", [hyla], saved=own)
  assert resumed.minutes == pytest.approx(40_000 / 2.5 / 60)
  assert resumed.done_steps == 10_000 and "its own 10,000 steps" in resumed.source
  # Its run on another device kind says nothing of this one's rate (only of where it is).
  elsewhere = plan.estimate(cell, "cpu", [hyla], saved=_progress(cell.name, 10_000,
                                                                 device=plan.H100))
  assert elsewhere.minutes == pytest.approx(40_000 * members / 30.0 / 60)
  deep = _record("a_fuzzy_hyla_deep_seed0", "hyla_deep", [(0, 0.9)], rate=6.0)
  preset = plan.estimate(cell, "cpu", [hyla, deep], saved=own)
  assert preset.minutes == pytest.approx(40_000 * members / 6.0 / 60)
  assert "1 hyla_deep cell(s)" in preset.source


def _redraw(cell, seeds_draws, untrained=None):
  """A re-evaluation file of `cell` (experiments/redraw_cells.py): {seed: per-draw OOD R^2}."""
  members = {}
  for s, draws in seeds_draws.items():
    v = np.asarray(draws, np.float64)
    members[f"seed{s}"] = {"ood/r2": {"mean": v.mean(), "se": stats.sem(v), "draws": draws},
                           **({} if untrained is None else {"untrained_terms": untrained})}
  return {"cell": cell, "kind": "train", "options": {"draws": 4}, "members": members}


def test_report_from_the_files_alone(tmp_path):
  hyla = [(0, 0.81), (1, 0.74), (2, 0.90)]
  softmax = [(0, 0.60), (1, 0.66), (2, 0.61)]
  recs = {}
  for model, values in (("hyla", hyla), ("softmax", softmax)):
    for s, v in values:
      name = f"a_fuzzy_{model}_seed{s}"
      recs[name] = _record(name, model, [(s, v)])
  # Stage h (the authors' splits): its own section, never in the main rows above.
  authors = [(2, 0.55), (0, 0.93)]
  for s, v in authors:
    name = f"h_fuzzy_hyla_authors_split_seed{s}"
    recs[name] = _record(name, "hyla", [(s, v)], stage="h")
  # Seed 1 of softmax re-evaluated on 4 draws: the table uses their mean and its s.e.
  draws = [0.62, 0.70, 0.64, 0.68]
  redraws = {"a_fuzzy_softmax_seed1": _redraw("a_fuzzy_softmax_seed1", {1: draws}),
             "h_fuzzy_hyla_authors_split_seed2": _redraw(
                 "h_fuzzy_hyla_authors_split_seed2", {2: [0.55, 0.56]}, untrained=[5, 6])}
  softmax[1] = (1, float(np.mean(draws)))
  path = tmp_path / "paper_scale.md"
  line = report.write(recs, str(path), redraws=redraws)
  assert f"8 of {len(cells_lib.CELLS)} cells done, 6 of 468" in line
  text = path.read_text()
  # HYLA's row: mean +- s.e. over 3 seeds, x100, from an independent formula.
  v = np.array([x for _, x in hyla]) * 100
  assert f"{v.mean():.2f} ± {v.std(ddof=1) / np.sqrt(3):.2f}" in text
  # Softmax's row: seed 1 is the draws' mean; the row's evaluation error is the s.e. of the
  # mean of its members' values, only seed 1 of which is re-evaluated: not known ('-').
  w = np.array([x for _, x in softmax]) * 100
  softmax_row = next(r for r in text.splitlines() if r.startswith("| Softmax attention |"))
  assert f"{w.mean():.2f} ± {w.std(ddof=1) / np.sqrt(3):.2f}" in softmax_row
  header = next(r for r in text.splitlines() if r.startswith("| row |")).split(" | ")
  assert softmax_row.split(" | ")[header.index("eval. error")] == "-"
  # The paired difference and its p (t = mean / (sd / sqrt(n)), 2 degrees of freedom).
  d = v - w
  t = d.mean() / (d.std(ddof=1) / np.sqrt(3))
  p = 2 * stats.t.sf(abs(t), df=2)
  assert f"| hyla - softmax | 3 | {d.mean():.2f} ± {d.std(ddof=1) / np.sqrt(3):.2f} | " \
         f"3 of 3 | {p:.3f} |" in text
  assert "81.13 ± 7.77" in text  # The paper's HYLA.
  # Ours - paper, Welch's t from the summaries (paper: s.e. over 3 seeds), by hand.
  var_ours, var_paper = v.var(ddof=1) / 3, 7.77**2
  t = (v.mean() - 81.13) / np.sqrt(var_ours + var_paper)
  df = (var_ours + var_paper)**2 / (var_ours**2 / 2 + var_paper**2 / 2)
  assert f"| {v.mean() - 81.13:+.1f} ({2 * stats.t.sf(abs(t), df):.2f}) |" in text
  h = text.split("authors' own held-out splits")[1]
  a = np.array([v for _, v in authors]) * 100
  a[0] = np.mean([55, 56])  # Seed 2 re-evaluated.
  # Table A1's columns (one builder): seed 2's value with its evaluation error beside it.
  row = next(r for r in h.splitlines() if r.startswith("| HYLA |")).split(" | ")
  column = next(r for r in h.splitlines() if r.startswith("| row |")).split(" | ").index
  assert row[column("n")] == "2"
  assert row[column("ood (ours)")] == f"{a.mean():.2f} ± {a.std(ddof=1) / np.sqrt(2):.2f}"
  assert row[column("OOD per seed")] == (
      f"seed 0: 93.0, seed 2: 55.5 ± {100 * stats.sem([0.55, 0.56]):.1f}")
  assert row[column("paper OOD")] == "81.13 ± 7.77"
  assert row[column("eval. error")] == "-"  # Seed 0 was evaluated on one draw only.
  assert "seed 0: not re-evaluated; seed 2: terms 5, 6 in no training task" in h
  assert (tmp_path / "paper_scale" / "figures" / "curves_fuzzy_logic.png").stat().st_size > 0
  assert "a_fuzzy_linear_seed0" in text  # Still to run.


def test_table_a1_gives_evaluation_error_order_and_every_dense_pair(tmp_path):
  """Each row's evaluation error (x100: the s.e. of its mean over members from each member's
  s.e. across draws), whether the paper's order against every other row holds, and the
  component pairs of Table A1's dense rows, those not run shown pending."""
  rows = {"hyla": [0.90, 0.93, 0.91], "softmax": [0.62, 0.60, 0.63],
          "linear": [0.63, 0.62, 0.64], "linear_rmshead": [0.65, 0.66, 0.64]}
  recs, redraws = {}, {}
  for model, values in rows.items():
    name = f"d_fuzzy_{model}_default" if model == "linear_rmshead" else f"a_fuzzy_{model}_x"
    recs[name] = _record(name, model, list(enumerate(values)),
                         stage="d" if model == "linear_rmshead" else "a")
  draws = {s: [v - 0.01, v + 0.01, v + 0.02] for s, v in enumerate(rows["hyla"])}
  redraws["a_fuzzy_hyla_x"] = _redraw("a_fuzzy_hyla_x", draws)
  partials = {"d_fuzzy_softmax_hyla_default": {"step": 30_000, "num_steps": 50_000}}
  text = report.table_a1(records.with_redraws(recs, redraws), "fuzzy_logic")
  hyla = next(r for r in text.splitlines() if r.startswith("| HYLA |")).split(" | ")
  column = text.splitlines()[0].split(" | ").index
  se = [np.std(d, ddof=1) / np.sqrt(len(d)) for d in draws.values()]
  error = 100 * np.sqrt(np.sum(np.square(se))) / 3
  means = np.array([np.mean(d) for d in draws.values()]) * 100
  ratio = error / (means.std(ddof=1) / np.sqrt(3))  # Of the seeds' s.e.
  assert hyla[column("eval. error")] == f"{error:.2f} ({ratio:.2f} s.e.)"
  assert hyla[column("ood (ours)")] == str(collect_stat([np.mean(d) for d in draws.values()]))
  # Paper: HYLA 81.1 > RMSHead 68.9 > softmax 63.3 > linear 59.9. Ours: linear above softmax.
  assert hyla[-1] == "3 of 3 |"
  linear = next(r for r in text.splitlines() if r.startswith("| Linear attention |"))
  assert linear.split(" | ")[-1] == "2 of 3 (flips: Softmax attention) |"
  ablation = report.ablation_text(recs, "fuzzy_logic", partials)
  lines = {tuple(r.split(" | ")[:2]): r for r in ablation.splitlines()[2:]}
  assert len(lines) == len(report.ABLATION_PAIRS)
  assert "pending: d_fuzzy_hyla_no_rmshead_default" in lines["| RMSHead", "hyla - hyla_no_rmshead"]
  assert ("d_fuzzy_softmax_hyla_default (at step 30,000 of 50,000)"
          in lines["| softmax for RMSHead", "softmax_hyla - hyla"])
  rms = lines["| RMSHead", "linear_rmshead - linear"].split(" | ")
  d = (np.array(rows["linear_rmshead"]) - np.array(rows["linear"])) * 100
  assert rms[3] == f"{d.mean():.2f} ± {d.std(ddof=1) / np.sqrt(3):.2f}"
  assert rms[-2:] == [f"{68.93 - 59.89:+.2f} ± {np.hypot(5.10, 5.22):.2f}", "same |"]


def collect_stat(values):
  return report.collect.Stat.of(values)


def test_a_tiny_paired_p_is_printed_not_rounded_to_zero():
  hyla, softmax = [0.900, 0.912, 0.921], [0.600, 0.611, 0.6205]
  recs = {}
  for model, values in (("hyla", hyla), ("softmax", softmax)):
    for s, v in enumerate(values):
      recs[f"a_fuzzy_{model}_seed{s}"] = _record(f"a_fuzzy_{model}_seed{s}", model, [(s, v)])
  p = stats.ttest_rel(np.array(hyla), np.array(softmax)).pvalue
  assert p < 0.001  # The case this is about (t over 2 degrees of freedom).
  row = report.paired(recs, "fuzzy_logic", "hyla", "softmax")
  assert f"| 3 of 3 | {p:.1e} |" in row and "0.000" not in row


def test_cut_off_cells_are_shown_apart_with_their_evaluations(tmp_path):
  recs = {"a_fuzzy_hyla_seed0": _record("a_fuzzy_hyla_seed0", "hyla", [(0, 0.8)])}
  curves = {"seed0": [[15625, 0.20], [31250, 0.25]], "seed1": [[15625, 0.30], [31250, 0.41]]}
  partials = {"b_sraven_hyla": {
      "cell": "b_sraven_hyla", "stage": "b", "experiment": "sraven", "model": "hyla",
      "step": 40_000, "num_steps": 156_250, "wall_s": 300.0,
      "device": {"kind": "NVIDIA H200", "jax_version": "0.11.2"},
      "members": [{"name": n, "curves": {"ood/accuracy": c}} for n, c in curves.items()]}}
  report.write(recs, str(tmp_path / "r.md"), partials)
  text = (tmp_path / "r.md").read_text()
  cut = text.split("## Cut off by a window's end")[1].split("##")[0]
  assert ("| b_sraven_hyla | 40,000 of 156,250 | NVIDIA H200 (jax 0.11.2) | 5.0 min | "
          f"15,625: {(20 + 30) / 2:.1f} (20.0, 30.0); 31,250: {(25 + 41) / 2:.1f} "
          "(25.0, 41.0) |") in cut
  table = text.split("## Table A1, SRAVEN")[1].split("##")[0]
  assert "33.0" not in table  # The cut-off mean never enters Table A1.
  assert (tmp_path / "paper_scale" / "figures" / "curves_sraven.png").stat().st_size > 0


def _campaign(tmp_path, cells, budget_s=3600.0, **kw):
  options = runner.Options(root=str(tmp_path / "root"), results_dir=str(tmp_path / "results"),
                           budget_s=budget_s, poll_s=0.5, **kw)
  os.makedirs(options.results_dir, exist_ok=True)
  return runner.Campaign(cells, options, CPU, log=lambda s: None)


def test_the_budget_is_honoured_before_any_work(tmp_path):
  campaign = _campaign(tmp_path, [cells_lib.BY_NAME["a_fuzzy_hyla_seed0"]], budget_s=600)
  (outcome,) = campaign.run()
  assert outcome.status == "skipped" and "needs ~" in outcome.detail
  assert "a larger --budget_minutes starts it" in outcome.detail  # and how to run it anyway
  assert not os.path.exists(tmp_path / "root" / "a_fuzzy_hyla_seed0")


def test_each_process_records_the_cpu_its_float_results_depend_on(tmp_path, monkeypatch):
  # Issue 43: two VMs whose "model name" is "AMD EPYC" trained the same commit and config
  # to different bits; family/model and the instruction sets tell such hosts apart.
  cpuinfo = tmp_path / "cpuinfo"
  core = ("model name\t: AMD EPYC\ncpu family\t: 25\nmodel\t\t: 17\nstepping\t: 1\n"
          "flags\t\t: fpu sse2 avx avx2 fma avx512f avx512_bf16\n\n")
  cpuinfo.write_text(core * 2)
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false")
  host = machine.host(str(cpuinfo))
  assert host["cpu"] == "AMD EPYC (family 25, model 17, stepping 1)"
  assert host["isa"] == ["avx2", "fma", "avx512f", "avx512_bf16"]
  assert host["xla_flags"] == "--xla_cpu_multi_thread_eigen=false" and host["cores"] >= 1
  assert machine.host(str(tmp_path / "absent"))["isa"] == []  # Not Linux: no error.


# A smoke cell long enough to be cut off mid-way: 4-step chunks, a checkpoint every 4.
LONG_SMOKE = dataclasses.replace(
    cells_lib.BY_NAME["smoke_fuzzy_hyla"], name="smoke_fuzzy_hyla_long", num_steps=200,
    overrides=(("num_train_steps", 200), ("eval_every_steps", 100)))


class _StopAfterFirstStep(runner.Campaign):
  """Cuts the cell off (as the budget's end would) once it has logged a step."""

  def write_progress(self):
    super().write_progress()
    for run in self.running.values():
      if runner._step_of(run.log_path) and not self.stopping:  # pylint: disable=protected-access
        self.stop_all("test")


@pytest.mark.slow
def test_a_cut_off_cell_resumes_and_a_done_cell_is_skipped(tmp_path, monkeypatch):
  # A cell the campaign defines (only those have cell and progress files), for this test.
  monkeypatch.setitem(cells_lib.BY_NAME, LONG_SMOKE.name, LONG_SMOKE)
  cut = _StopAfterFirstStep(
      [LONG_SMOKE], dataclasses.replace(_campaign(tmp_path, []).options), CPU, log=lambda s: None)
  (outcome,) = cut.run()
  assert outcome.status == "stopped", outcome
  workdir = tmp_path / "root" / LONG_SMOKE.name
  stopped_at = plan.checkpointed_step(str(workdir))
  assert 0 < stopped_at < 200
  assert not os.path.exists(records.path_of(str(tmp_path / "results"), LONG_SMOKE.name))
  # Its progress and resume state are saved beside the cell files (what a window returns).
  progress_path, state_path = partial.paths(str(tmp_path / "results"), LONG_SMOKE.name)
  progress = partial.read_all(str(tmp_path / "results"))[LONG_SMOKE.name]
  assert progress["step"] == stopped_at and progress["num_steps"] == 200
  assert [m["name"] for m in progress["members"]] == ["seed0", "seed1"]
  assert f"step {stopped_at:,}" in outcome.detail and os.path.exists(state_path)

  # Another machine: no workdir, only the repository's files. It resumes from the state.
  os.rename(workdir, tmp_path / "first_machine")
  (outcome,) = _campaign(tmp_path, [LONG_SMOKE]).run()
  assert outcome.status == "finished", outcome
  assert not os.path.exists(progress_path) and not os.path.exists(state_path)
  record = records.read(records.path_of(str(tmp_path / "results"), LONG_SMOKE.name))
  assert [p["returncode"] for p in record["processes"]] == [75, 0]
  assert all(p["host"] == machine.host() for p in record["processes"])
  assert record["commit"] == record["processes"][0]["commit"] != "?"  # The code that trained.
  assert record["wall_s"] == pytest.approx(sum(p["wall_s"] for p in record["processes"]))
  # Both sides lower-cased: the log's own capitals aside, a temporary folder may have some.
  assert f"resuming population {workdir} from step {stopped_at}".lower() in (
      workdir / runner.LOG).read_text().lower()
  member = record["members"][1]
  assert member["name"] == "seed1" and member["settings"]["seed"] == 1
  assert [s for s, _ in member["curves"]["ood/r2"]] == [100, 200]
  assert member["final"]["step"] == 200

  (outcome,) = _campaign(tmp_path, [LONG_SMOKE]).run()  # Done: nothing runs again.
  assert outcome.status == "done"
  assert len(record["processes"]) == len(collect_cell.segments(str(workdir)))


@pytest.mark.slow
def test_probe_and_benchmark_cells(tmp_path):
  smoke = [cells_lib.BY_NAME[n] for n in
           ("smoke_sraven_decoding_hyla", "smoke_sraven_hyla", "smoke_c4_step")]
  first = _campaign(tmp_path, smoke).run()
  assert [o.status for o in first] == ["skipped", "finished", "finished"], first
  assert "needs smoke_sraven_hyla's kept parameters" in first[0].detail
  results = str(tmp_path / "results")
  # The train cell kept its members' final parameters beside its file: exactly those the run
  # ended with, without the optimizer state, restorable once its workdir is gone.
  trained = records.read(records.path_of(results, "smoke_sraven_hyla"))
  kept = os.path.join(results, trained["params"])
  assert kept == records.kept_params_dir(results, "smoke_sraven_hyla")
  workdir = str(tmp_path / "root" / "smoke_sraven_hyla")
  import chex  # pylint: disable=g-import-not-at-top

  from hypernet_attention.train import restore  # pylint: disable=g-import-not-at-top
  for member in (0, 1):
    ended, again = (restore.restore_params(d, member=member) for d in (workdir, kept))
    assert again.step == ended.step == cells_lib.SMOKE_STEPS
    chex.assert_trees_all_equal(again.params, ended.params)
  assert restore.restore_params(os.path.join(kept, "seed1")).config.seed == 1
  state_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in
                    os.walk(os.path.join(workdir, "checkpoints", str(cells_lib.SMOKE_STEPS)))
                    for f in fs)
  assert 0 < sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(kept)
                 for f in fs) < state_bytes / 2  # Params alone: Adam's moments are 2/3.
  shutil.rmtree(workdir)  # Another machine: only the committed files (cell + params).
  (probe,) = _campaign(tmp_path, smoke[:1]).run()
  assert probe.status == "finished", probe
  decoding = records.read(records.path_of(results, "smoke_sraven_decoding_hyla"))
  assert [m["name"] for m in decoding["members"]] == ["seed0", "seed1"]
  assert len(decoding["members"][0]["feature_sets"]) >= 2  # One per layer at least.
  bench = records.read(records.path_of(results, "smoke_c4_step"))
  assert [r["label"] for r in bench["rows"]] == ["softmax", "hyla"]
  assert all(r["experiment"] == "c4_lm" and r["tokens_per_s"] > 0 for r in bench["rows"])
  table = report.benchmark_text(records.read_all(results)).splitlines()
  assert [line.split(" | ")[3:6] for line in table[2:]] == [
      ["random tokens", "softmax", "16"], ["random tokens", "hyla", "16"]]
  text = report.decoding_text(records.read_all(results))
  assert "smoke_sraven_decoding_hyla | seed0" in text


def _cli(*args, cwd=REPO):
  return tl.run([sys.executable, "-m", "launch.campaign", *args], cwd=cwd,
                        capture_output=True, text=True)


@pytest.mark.parametrize("args, message", [
    (["--cells=z_*", "--budget_minutes=5"], "--cells='z_*' matches no cell"),
    (["--budget_minutes=0"], "--budget_minutes=0.0; allowed: a number of minutes > 0"),
    (["--budget_minutes=nan"], "--budget_minutes=nan"),
    ([], "--budget_minutes is required"),
    (["--budget_minutes=5", "--redo=a_fuzzy_hyla_seed9"], "--redo=a_fuzzy_hyla_seed9"),
    (["--budget_minutes=5", "--results_dir=/dev/null/x"], "not writable"),
])
def test_bad_input_is_one_line_before_any_work(tmp_path, args, message):
  out = _cli(*args, f"--root={tmp_path / 'root'}", "--set=paper", "--device_kind=cpu")
  assert out.returncode == 2, out.stderr
  assert message in out.stderr
  assert len(out.stderr.strip().splitlines()) == 1, out.stderr
  assert not (tmp_path / "root").exists()


def test_a_corrupt_cell_file_stops_the_runner_and_is_kept(tmp_path):
  bad = tmp_path / "a_fuzzy_hyla_seed0.json"
  bad.write_text("{not json")
  out = _cli("--budget_minutes=5", f"--results_dir={tmp_path}", f"--root={tmp_path / 'root'}")
  assert out.returncode == 2 and "a_fuzzy_hyla_seed0.json" in out.stderr
  assert bad.read_text() == "{not json"
  assert not (tmp_path / "root").exists()


def test_failed_cell_outcome_quotes_the_tools_one_line_error(tmp_path):
  """A cell that exits with an error names the tool's own last line (its one-line refusal),
  not only the log's path: the g cell's unreadable gs:// vocabulary, say."""
  log = tmp_path / "benchmark.log"
  log.write_text("Traceback? no\nW0000 some native warning\n"
                 "benchmark_training.py: error: vocabulary file 'gs://x' cannot be read here\n\n")
  assert runner._last_line(str(log)) == (
      "benchmark_training.py: error: vocabulary file 'gs://x' cannot be read here")
  log.write_text("x" * 1000 + "\n")
  assert runner._last_line(str(log), limit=10) == "x" * 10 + "..."
  assert runner._last_line(str(tmp_path / "absent.log")) == "no log"


def test_decoding_verdict_needs_every_control():
  """'decodes' only above the best chance level, the untrained code and the permutation null."""
  def layer(score, step0, p):
    chance = {"always_positive": 0.28, "stratified": 0.16}
    return {"trained": {"macro_f1": score, "chance": chance, "p_value": p},
            "step0": {"macro_f1": step0, "chance": chance}}
  assert report._verdict(layer(0.40, 0.30, 0.01)) == "**decodes**"
  assert report._verdict(layer(0.27, 0.20, 0.01)) == "no"   # below always-positive chance
  assert report._verdict(layer(0.40, 0.45, 0.01)) == "no"   # below the untrained code
  assert report._verdict(layer(0.40, 0.30, 0.20)) == "no"   # permutation null not rejected
  multiclass = layer(0.40, 0.30, {"accuracy": 0.01, "balanced_accuracy": 0.5})
  assert report._verdict(multiclass) == "**decodes**"       # SRAVEN: the accuracy's p


def test_a_moe_cell_is_planned_from_moe_cells_else_at_its_dense_rate_times_moe_cost():
  """A MoE cell was planned at its dense family's rate (118 min) and ran ~4x slower: dense
  cells' rates are not its own."""
  cell = cells_lib.BY_NAME["d_fuzzy_linear_moe_default"]
  dense = _record("d_fuzzy_linear_rmshead_default", "linear_rmshead", [(0, 0.6)], rate=20.0)
  minutes = 50_000 * len(cell.members) / 20.0 / 60
  from_dense = plan.estimate(cell, "cpu", [dense])
  assert from_dense.minutes == pytest.approx(minutes * plan.MOE_STEP_COST)
  assert "MoE" in from_dense.source
  moe = dict(_record("d_fuzzy_softmax_moe_default", "linear", [(0, 0.6)], rate=4.0),
             overrides={"model.feed_forward": "moe"})
  assert plan.estimate(cell, "cpu", [dense, moe]).minutes == pytest.approx(minutes * 5)
  plain = cells_lib.BY_NAME["d_fuzzy_linear_rmshead_default"]  # MoE rates are not its own
  assert plan.estimate(plain, "cpu", [moe]).source != plan.estimate(plain, "cpu", [dense]).source


def test_probe_estimate_learns_from_finished_probe_cells():
  """A probe cell's estimate is twice the longest finished one like it, else the allowance."""
  cell = next(c for c in cells_lib.CELLS if c.name == "c_fuzzy_decoding_hyla_seed0")
  assert plan.estimate(cell, "cpu", []).source == "allowance"
  done = [{"kind": "probe", "experiment": cell.experiment, "device": {"kind": "cpu"},
           "wall_s": 60.0},
          {"kind": "probe", "experiment": cell.experiment, "device": {"kind": "cpu"},
           "wall_s": 90.0},
          {"kind": "probe", "experiment": cell.experiment, "device": {"kind": "TPU v5e"},
           "wall_s": 900.0}]
  est = plan.estimate(cell, "cpu", done)
  assert est.minutes == pytest.approx(3.0) and est.source == "measured: 2 cell(s) on cpu"


def test_decoding_table_shows_a_constant_code_as_undefined():
  """A layer whose code is one constant (fuzzy layer 0 at a fixed query) has no topographic
  rho: the table says '-' rather than failing the whole report."""
  chance = {"always_positive": 0.28}
  block = {"macro_f1": 0.0, "chance": chance, "p_value": 1.0}
  record = {"kind": "probe", "cell": "c_x", "experiment": cells_lib.FUZZY, "model": "hyla",
            "device": {"kind": "cpu"}, "jax_version": "0",
            "members": [{"name": "hyla", "step": 10, "feature_sets": {"layer 0": {
                "trained": block, "step0": block, "selectivity": {"selectivity": 0.0},
                "topographic": {"held-out tasks": {"rho": None, "p_value": None}}}}}]}
  (row,) = [line for line in report.decoding_text({"c_x": record}).splitlines()
            if line.startswith("| c_x")]
  assert row.split(" | ")[3:5] == ["layer 0", "0.000"] and " | no | " in row
  assert row.split(" | ")[-2] == "-"


def test_decoding_uses_the_redrawn_scores_with_their_error():
  """A re-evaluated probe: each layer's score is the draws' mean, with its s.e. and the one
  recorded draw beside it, and the verdict is read from the redrawn trained and step-0 codes
  (recorded: 0.352 vs untrained 0.353, 'no'; redrawn: 0.40 vs 0.35, decodes)."""
  def block(f1):
    return {"macro_f1": f1, "chance": {"always_positive": 0.28}, "p_value": 0.0099}
  record = {"kind": "probe", "cell": "c_x", "experiment": cells_lib.FUZZY, "model": "softmax",
            "device": {"kind": "cpu"}, "jax_version": "0", "members": [
                {"name": "softmax", "step": 10, "feature_sets": {"layer 1": {
                    "trained": block(0.352), "step0": block(0.353), "selectivity": {},
                    "topographic": {}}}}]}
  trained, step0 = [0.39, 0.41, 0.40, 0.40], [0.34, 0.36, 0.35, 0.35]
  redraw = {"cell": "c_x", "kind": "probe", "options": {}, "members": {"softmax": {
      "feature_sets": {"layer 1": {"trained": {"mean": np.mean(trained), "se": stats.sem(trained)},
                                   "step0": {"mean": np.mean(step0), "se": stats.sem(step0)}}}}}}
  (row,) = [line for line in report.decoding_text(records.with_redraws(
      {"c_x": record}, {"c_x": redraw})).splitlines() if line.startswith("| c_x")]
  cols = row.split(" | ")
  assert cols[4] == f"{np.mean(trained):.3f} ± {stats.sem(trained):.3f} (one draw: 0.352)"
  assert cols[5] == f"{np.mean(step0):.3f} ± {stats.sem(step0):.3f} (one draw: 0.353)"
  assert cols[8] == "**decodes**"
  (plain,) = [line for line in report.decoding_text({"c_x": record}).splitlines()
              if line.startswith("| c_x")]
  assert plain.split(" | ")[8] == "no"


def test_decoding_paired_by_seed_and_term():
  """HYLA minus softmax's held-out decoding: per seed over the same terms (exact Wilcoxon:
  with every one of n differences positive, two-sided p = 2 / 2^n), across seeds the paired
  t-test (t = mean / (sd / sqrt(n)) on the macro-F1 differences, by hand)."""
  def probe(model, seed, per_term, skipped=()):
    terms = [None if t in skipped else f for t, f in enumerate(per_term)]
    macro = float(np.mean([f for f in terms if f is not None]))
    code = {"trained": {"macro_f1": macro, "per_term_f1": terms}}
    return {"kind": "probe", "cell": f"c_fuzzy_decoding_{model}_seed{seed}", "model": model,
            "members": [{"name": model, "feature_sets": {
                "layer 0": {"trained": {"macro_f1": 0.0, "per_term_f1": [0.0] * 7}},
                "layer 1": code}}]}
  base = np.linspace(0.2, 0.5, 7)
  lift = {0: 0.02 * np.arange(1, 8), 1: 0.01 * np.arange(1, 8), 2: np.full(7, -0.01)}
  cells = [probe("softmax", s, base) for s in lift]
  cells += [probe("hyla", s, base + lift[s], skipped=(3,) if s == 0 else ()) for s in lift]
  text = report.decoding_paired_text({c["cell"]: c for c in cells}, pairs=[("hyla", "softmax")])
  rows = {r.split(" | ")[2]: r.split(" | ") for r in text.splitlines() if "hyla - softmax" in r}
  assert {r.split(" | ")[1] for r in text.splitlines() if "hyla - " in r} == {"layer 1"}
  assert rows["seed 0"][6] == "6 of 6 terms"  # term 3 skipped by HYLA's probe: not paired
  assert float(rows["seed 0"][7].split()[0]) == pytest.approx(2 / 2**6, abs=1e-3)
  assert rows["seed 1"][6] == "7 of 7 terms"
  assert float(rows["seed 1"][7].split()[0]) == pytest.approx(2 / 2**7, abs=1e-3)
  assert rows["seed 2"][6] == "0 of 7 terms"
  macro = lambda m, s: next(c for c in cells if c["cell"].endswith(f"{m}_seed{s}"))[
      "members"][0]["feature_sets"]["layer 1"]["trained"]["macro_f1"]
  d = np.array([macro("hyla", s) - macro("softmax", s) for s in lift])
  t = d.mean() / (d.std(ddof=1) / np.sqrt(3))
  p = 2 * stats.t.sf(abs(t), df=2)
  summary = rows["**3 seed(s)**"]
  assert summary[5].startswith(f"{100 * d.mean():+.2f}".lstrip("+")) and summary[6] == "2 of 3"
  assert float(summary[7].split()[0]) == pytest.approx(p, rel=2e-3)
  assert report.decoding_paired_text({c["cell"]: c for c in cells[:3]}) == ""  # no pair
