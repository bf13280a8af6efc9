"""A cell publishes only its own run, and publishes it whole (issue 53): a workdir holding
another cell's run, or the cell's run at another learning rate, is moved aside and never
published; --redo retrains; a SIGTERM or Ctrl-C at the publish point waits for the cell
file; the device window gives the runner longer than the runner gives its cells, and the
windows' output folders below a file are named in one line."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import test_campaign  # pylint: disable=g-bad-import-order

# pylint: disable=protected-access
from launch import gpu_window
from launch.campaign import cells as cells_lib
from launch.campaign import partial
from launch.campaign import records
from launch.campaign import runner

import train_testlib as tl

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CPU = {"platform": "cpu", "kind": "cpu", "count": 1, "jax_version": "test"}
HYLA = cells_lib.BY_NAME["smoke_fuzzy_hyla"]
SOFTMAX = cells_lib.BY_NAME["smoke_fuzzy_softmax"]


def _config(cell, **dotted):
  """The config.json a run of `cell` records, with `dotted` keys changed."""
  config = cells_lib.recorded_config(cell)
  for key, value in dotted.items():
    *parents, last = key.split(".")
    node = config
    for name in parents:
      node = node[name]
    node[last] = value
  return config


def _finished_run(workdir, cell, config) -> None:
  """A finished population workdir's files, as the training loop leaves them."""
  os.makedirs(workdir)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(config, f)
  with open(os.path.join(workdir, "population_summary.json"), "w") as f:
    json.dump({"members": list(cell.member_names), "step": cell.num_steps}, f)
  for name in cell.member_names:
    os.makedirs(os.path.join(workdir, name))
    with open(os.path.join(workdir, name, "summary.json"), "w") as f:
      json.dump({"step": cell.num_steps}, f)


def _old_record(rate: float = 0.004) -> dict:
  """A cell file of HYLA from an earlier run (by default a slow one: its rate says a rerun
  takes an hour, so `_no_time_to_train` starts none)."""
  return test_campaign._record(HYLA.name, "hyla", [(0, 0.5), (1, 0.6)], rate=rate)


def _no_time_to_train(root, results, redo=()) -> runner.Options:
  """A budget that starts no training (a smoke cell needs ~1 minute): what the runner does
  with a cell's old workdir is all that runs."""
  os.makedirs(results, exist_ok=True)
  return runner.Options(str(root), str(results), budget_s=30.0, stop_margin_s=0.0,
                        redo=frozenset(redo))


def _aside(root, cell) -> list[str]:
  return sorted(n for n in os.listdir(root) if n.startswith(cell.name + ".aside-"))


def test_the_config_a_cell_compares_is_the_one_its_runs_record():
  """`recorded_config` is what the entry point records (test_campaign.py checks every
  paper cell against the config flag's parse); the comparison names the first field."""
  config = cells_lib.recorded_config(HYLA)
  assert config["optimizer"]["learning_rate"] == 1e-3 and config["num_train_steps"] == 8
  assert cells_lib.run_differences(HYLA, config) == []
  assert cells_lib.run_differences(HYLA, _config(HYLA, **{"optimizer.learning_rate": 0.5})) \
      == ["optimizer.learning_rate: 0.5 -> 0.001"]
  assert cells_lib.run_differences(HYLA, cells_lib.recorded_config(SOFTMAX))[0] == \
      "model.attention: 'softmax' -> 'hyla'"
  # Fields a resume may change (where to stop, the mesh) do not make it another run.
  assert cells_lib.run_differences(HYLA, _config(HYLA, stop_after_steps=4)) == []


@pytest.mark.parametrize("case", ["another_cell", "learning_rate", "redo"])
def test_a_finished_workdir_that_is_not_the_cells_run_is_moved_aside(tmp_path, case):
  """Another cell's finished run (softmax in hyla's workdir), the cell's own run trained at
  learning rate 0.5, and (--redo) the cell's own finished run: each is moved aside in one
  line naming where (and the first differing field), never published, never deleted."""
  root, results = tmp_path / "root", tmp_path / "results"
  config = {"another_cell": cells_lib.recorded_config(SOFTMAX),
            "learning_rate": _config(HYLA, **{"optimizer.learning_rate": 0.5}),
            "redo": cells_lib.recorded_config(HYLA)}[case]
  _finished_run(str(root / HYLA.name), HYLA, config)
  results.mkdir()
  if case == "redo":  # Its cell file exists: --redo is what reruns it.
    records.publish(str(results), _old_record())
  lines = []
  options = _no_time_to_train(root, results, redo={HYLA.name} if case == "redo" else ())
  (outcome,) = runner.Campaign([HYLA], options, CPU, log=lines.append).run()
  assert outcome.status == "skipped" and "needs ~" in outcome.detail, outcome
  (aside,) = _aside(root, HYLA)
  assert json.loads((root / aside / "config.json").read_text()) == config  # Kept whole.
  assert not (root / HYLA.name).exists()
  (line,) = [line for line in lines if "moved it to" in line]
  assert str(root / aside) in line and "\n" not in line
  said = {"another_cell": "model.attention: 'softmax' -> 'hyla'",
          "learning_rate": "optimizer.learning_rate: 0.5 -> 0.001",
          "redo": f"--redo={HYLA.name} retrains the finished run"}[case]
  assert said in line, line
  path = records.path_of(str(results), HYLA.name)
  if case == "redo":
    assert records.read(path) == _old_record()  # Replaced only once the rerun ends.
  else:
    assert not os.path.exists(path)
  assert not os.path.exists(records._claim_path(str(results), HYLA.name))


def test_a_cells_own_unfinished_workdir_is_kept_and_resumed(tmp_path):
  """Its own run, cut off (a checkpoint, no summary): kept where it is, with or without
  --redo, so that a cut-off rerun resumes."""
  root = tmp_path / "root"
  workdir = root / HYLA.name
  (workdir / "checkpoints" / "4").mkdir(parents=True)
  (workdir / "config.json").write_text(json.dumps(cells_lib.recorded_config(HYLA)))
  options = _no_time_to_train(root, tmp_path / "results", redo={HYLA.name})
  (outcome,) = runner.Campaign([HYLA], options, CPU, log=lambda s: None).run()
  assert outcome.status == "skipped" and _aside(root, HYLA) == []
  assert (workdir / "checkpoints" / "4").is_dir()


def test_a_probe_does_not_read_another_runs_parameters(tmp_path):
  """A probe cell's source workdir (and kept parameters) count only if they are its source
  cell's run: softmax's run in hyla's place blocks the probe, saying why."""
  probe = cells_lib.BY_NAME["smoke_sraven_decoding_hyla"]
  source = cells_lib.BY_NAME[probe.source]
  other = cells_lib.recorded_config(source)
  other["model"]["attention"] = "softmax"
  options = runner.Options(str(tmp_path / "root"), str(tmp_path / "results"), budget_s=600.0)
  _finished_run(os.path.join(options.root, source.name), source, other)
  assert runner.source_dir(probe, options) is None
  reason = runner.blocker(probe, options)
  assert "model.attention: 'softmax' -> 'hyla'" in reason and "\n" not in reason
  _finished_run(records.kept_params_dir(options.results_dir, source.name), source,
                cells_lib.recorded_config(source))
  assert runner.source_dir(probe, options) == records.kept_params_dir(options.results_dir,
                                                                      source.name)


def test_the_windows_kill_grace_outlasts_the_runners_stop(tmp_path):
  """timeout(1) SIGKILLs the window's whole process group `kill_grace` seconds after its
  SIGTERM; the runner waits up to `stop_wait_s` for its cells, then packs their states (a
  paper-size SRAVEN state: seconds) and ends a publish in flight: the grace must cover that."""
  script = open(os.path.join(REPO, "launch", "device_window.sh")).read()
  (grace,) = re.findall(r"^kill_grace=(\d+)$", script, re.M)
  assert 'timeout -s TERM -k "$kill_grace"' in script
  stop_wait_s = runner.Options(root="r", results_dir="d", budget_s=1.0).stop_wait_s
  assert int(grace) >= stop_wait_s + 60, (grace, stop_wait_s)
  # A folder it cannot make is one line, before anything is installed or run.
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  out = tl.run(["bash", "launch/device_window.sh", "300", "b_sraven_hyla"],
                       cwd=REPO, capture_output=True, text=True,
                       env={**os.environ, "OUT": str(blocker / "out")})
  assert out.returncode == 2, out
  assert out.stdout.strip() == (f"OUT or ROOT={blocker / 'out'} cannot be a folder (a file "
                                "is in the way); allowed: a folder path")


def test_the_gpu_windows_out_below_a_file_is_named(tmp_path, capsys):
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  with pytest.raises(SystemExit) as e:
    gpu_window.main([f"--out={blocker / 'out'}", "--dry_run"])
  assert e.value.code == 2
  (line,) = [l for l in capsys.readouterr().err.splitlines() if "error:" in l]
  assert f"--out='{blocker / 'out'}' cannot be made (Not a directory" in line


def test_held_signals_reach_a_handler_when_sigint_is_ignored():
  """A runner started with SIGINT ignored (a background job of a non-interactive shell,
  nohup, some test runners' workers) gets SIGTERM and SIGINT while publishing: SIGINT comes
  first by number, and raising it into the restored SIG_IGN dropped the SIGTERM too (the
  runner then exited 0 as if never stopped). The first signal not ignored is delivered."""
  seen = []
  previous = {signal.SIGINT: signal.signal(signal.SIGINT, signal.SIG_IGN),
              signal.SIGTERM: signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))}
  try:
    with runner.signals_held():
      both = {signal.SIGTERM, signal.SIGINT}
      signal.pthread_sigmask(signal.SIG_BLOCK, both)  # Pending together, as in a real stop:
      os.kill(os.getpid(), signal.SIGTERM)  # the handlers then run in signal-number order,
      os.kill(os.getpid(), signal.SIGINT)  # SIGINT (2) before SIGTERM (15).
      signal.pthread_sigmask(signal.SIG_UNBLOCK, both)
      time.sleep(0.05)
      assert seen == []
    assert seen == [signal.SIGTERM]
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)


@pytest.mark.slow
def test_a_stop_at_the_publish_point_still_publishes_the_cell(tmp_path):
  """SIGTERM and then Ctrl-C while the runner publishes a finished cell (paused there by
  `PAUSE_ENV`): the cell file is written whole, progress.txt says finished, no resume state
  is left, the claim is released, and only then does the runner exit as stopped. The finished
  run, put in another cell's workdir, is then moved aside there, never published."""
  root, results, pause = tmp_path / "root", tmp_path / "results", tmp_path / "paused"
  log = tmp_path / "runner.out"
  with open(log, "w") as f, tl.started(
      [sys.executable, "-m", "launch.campaign", "--set=smoke", f"--cells={HYLA.name}",
       "--budget_minutes=20", f"--root={root}", f"--results_dir={results}"],
      cwd=REPO, stdout=f, stderr=subprocess.STDOUT,
      env={**os.environ, runner.PAUSE_ENV: str(pause)}) as proc:
    tl.wait_until(lambda: os.path.exists(pause), [proc],
                  f"the runner to reach the publish point ({pause})", [str(log)])
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)  # The handlers run at once; the pause would hide a premature exit.
    assert proc.poll() is None, "the runner exited at the publish point"
    os.unlink(pause)
    tl.wait_for([proc], "the stopped runner to publish and exit", [str(log)])
  out = log.read_text()
  # Stopped, by the signal noted first: both were pending at once, and Python runs the
  # handlers of pending signals in signal-number order (SIGINT's 130 before SIGTERM's 75).
  assert proc.returncode in (75, 130), out
  record = records.read(records.path_of(str(results), HYLA.name))
  assert record["members"][1]["name"] == "seed1" and record["params"], record.keys()
  progress = (root / runner.PROGRESS).read_text()
  assert f"finished: {HYLA.name}" in progress and "running:" not in progress, progress
  assert not any(os.path.exists(p) for p in partial.paths(str(results), HYLA.name))
  assert not os.path.exists(records._claim_path(str(results), HYLA.name))

  # The same finished run in softmax's workdir: moved aside, softmax's file never written.
  os.rename(root / HYLA.name, root / SOFTMAX.name)
  lines = []
  options = _no_time_to_train(root, results)
  (outcome,) = runner.Campaign([SOFTMAX], options, CPU, log=lines.append).run()
  assert outcome.status == "skipped", outcome
  assert not os.path.exists(records.path_of(str(results), SOFTMAX.name))
  (aside,) = _aside(root, SOFTMAX)
  assert (root / aside / "seed0" / "summary.json").exists()
  assert any("model.attention: 'hyla' -> 'softmax'" in line for line in lines), lines


@pytest.mark.slow
def test_redo_moves_the_finished_run_aside_and_trains_afresh(tmp_path):
  root, results = tmp_path / "root", tmp_path / "results"
  _finished_run(str(root / HYLA.name), HYLA, cells_lib.recorded_config(HYLA))
  results.mkdir()
  records.publish(str(results), _old_record(rate=10.0))
  out = tl.run(
      [sys.executable, "-m", "launch.campaign", "--set=smoke", f"--cells={HYLA.name}",
       f"--redo={HYLA.name}", "--budget_minutes=20", f"--root={root}",
       f"--results_dir={results}"], cwd=REPO, capture_output=True, text=True)
  assert out.returncode == 0, out.stdout + out.stderr
  (aside,) = _aside(root, HYLA)
  (line,) = [line for line in out.stdout.splitlines() if "moved it to" in line]
  assert str(root / aside) in line
  record = records.read(records.path_of(str(results), HYLA.name))  # The rerun's own file.
  assert [p["returncode"] for p in record["processes"]] == [0]
  assert "started: smoke_fuzzy_hyla" in out.stdout
  assert not (root / aside / "campaign.log").exists()  # The old run is as it was.
