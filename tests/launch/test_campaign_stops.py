"""The campaign keeps every step it paid for and publishes only what it measured: cells
stopped at any moment (before their first log, twice in a row), resume states that are not
the cell's own or not readable, progress files that are damaged, and flags that would record
another device (issue "A window's work is never lost")."""

import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
import time

import pytest
import test_campaign  # pylint: disable=g-bad-import-order

# pylint: disable=protected-access
from hypernet_attention import errors
from hypernet_attention.runs import curves
from launch.campaign import cells as cells_lib
from launch.campaign import partial
from launch.campaign import records
from launch.campaign import runner

import train_testlib as tl

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CPU = {"platform": "cpu", "kind": "cpu", "count": 1, "jax_version": "test"}
HYLA = cells_lib.BY_NAME["smoke_fuzzy_hyla"]
SOFTMAX = cells_lib.BY_NAME["smoke_fuzzy_softmax"]


def _config_of(cell, learning_rate=None) -> dict:
  """The config.json a run of `cell` writes (at another learning rate, if given)."""
  config = cells_lib.recorded_config(cell)
  if learning_rate is not None:
    config["optimizer"]["learning_rate"] = learning_rate
  return config


def _state(results, name: str, files: dict[str, bytes]) -> str:
  """A resume state `partial/<name>.tar.gz` holding `files` (path -> bytes)."""
  path = partial.paths(results, name)[1]
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with tarfile.open(path, "w:gz") as tar:
    for member, data in files.items():
      info = tarfile.TarInfo(member)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return path


def _state_of(results, cell, run_of=None, learning_rate=None) -> str:
  config = json.dumps(_config_of(run_of or cell, learning_rate)).encode()
  return _state(results, cell.name, {f"{cell.name}/config.json": config,
                                     f"{cell.name}/checkpoints/4/state": b"x"})


def test_curves_of_a_run_without_scalars_are_empty_not_an_error(tmp_path):
  assert curves.read_scalars(str(tmp_path)) == {}
  with pytest.raises(ValueError, match="no scalars logged yet"):
    curves.read_scalars(str(tmp_path), ["train/loss"])


def test_a_cell_stopped_before_its_first_log_keeps_its_checkpoint(tmp_path):
  """Stopped at step 4 of 8 with no scalars yet: its progress and resume state are saved."""
  workdir = tmp_path / "root" / HYLA.name
  (workdir / "checkpoints" / "4").mkdir(parents=True)
  (workdir / "checkpoints" / "4" / "state").write_bytes(b"x" * 100)
  (workdir / "config.json").write_text(json.dumps(_config_of(HYLA)))
  results = str(tmp_path / "results")
  said = partial.save(HYLA, str(workdir), results, CPU)
  assert "step 4" in said
  progress = partial.read_all(results)[HYLA.name]
  assert progress["step"] == 4 and all(m["curves"] == {} for m in progress["members"])
  assert os.path.exists(partial.paths(results, HYLA.name)[1])


@pytest.mark.parametrize("run_of, learning_rate, field", [
    (SOFTMAX, None, "model.attention: 'softmax' -> 'hyla'"),  # softmax's run, hyla's name
    (HYLA, 0.5, "optimizer.learning_rate: 0.5 -> 0.001"),  # hyla's run at lr 0.5
])
def test_a_resume_state_of_another_run_is_refused_before_anything_is_unpacked(
    tmp_path, run_of, learning_rate, field):
  """Every field of its config.json is compared with the cell's, the first that differs
  named: another cell's run, or the cell's own at another learning rate."""
  results = str(tmp_path / "results")
  path = _state_of(results, HYLA, run_of=run_of, learning_rate=learning_rate)
  with pytest.raises(errors.BadInput, match=rf"not smoke_fuzzy_hyla's run: its config.json "
                     rf"differs in {re.escape(field)} \(recorded -> the cell's\); delete it "
                     r"\(git rm .*tar.gz"):
    partial.restore(HYLA, str(tmp_path / "root" / HYLA.name), results)
  assert not os.path.exists(tmp_path / "root" / HYLA.name)
  # Through the runner: the cell fails with that line; nothing runs, nothing is published.
  campaign = runner.Campaign([HYLA], runner.Options(str(tmp_path / "root"), results, 600.0),
                             CPU, log=lambda s: None)
  (outcome,) = campaign.run()
  assert outcome.status == "failed" and path in outcome.detail
  assert "not smoke_fuzzy_hyla's run" in outcome.detail
  assert not os.path.exists(records.path_of(results, HYLA.name))
  assert not os.path.exists(records._claim_path(results, HYLA.name))
  # The cell's own state passes the same check.
  _state_of(results, HYLA)
  assert partial.restore(HYLA, str(tmp_path / "root" / HYLA.name), results) == 4


@pytest.mark.parametrize("damage", ["garbage", "truncated", "outside", "link", "no_config"])
def test_a_damaged_resume_state_is_one_line_naming_the_file(tmp_path, damage):
  results = str(tmp_path / "results")
  path = _state_of(results, HYLA)
  if damage == "garbage":
    with open(path, "wb") as f:
      f.write(b"not a tarball at all")
  elif damage == "truncated":
    data = open(path, "rb").read()
    with open(path, "wb") as f:
      f.write(data[:len(data) // 2])
  elif damage == "outside":
    _state(results, HYLA.name, {f"{HYLA.name}/config.json": b"{}",
                                f"{HYLA.name}/../../evil": b"x"})
  elif damage == "link":
    with tarfile.open(path, "w:gz") as tar:
      info = tarfile.TarInfo(f"{HYLA.name}/config.json")
      info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
      tar.addfile(info)
  else:
    _state(results, HYLA.name, {f"{HYLA.name}/checkpoints/4/state": b"x"})
  with pytest.raises(errors.BadInput) as e:
    partial.restore(HYLA, str(tmp_path / "root" / HYLA.name), results)
  message = str(e.value)
  assert path in message and "\n" not in message and "delete it" in message
  assert not os.path.exists(tmp_path / "evil")


@pytest.mark.parametrize("content", ["{not json", "", '{"cell": "smoke_fuzzy_hyla"}',
                                     '{"cell": "smoke_fuzzy_hyla", "step": "350", '
                                     '"num_steps": 8, "members": []}', "[1, 2]"])
def test_a_damaged_progress_file_is_named_by_dry_run_and_report(tmp_path, content):
  results = tmp_path / "results"
  (results / "partial").mkdir(parents=True)
  bad = results / "partial" / "smoke_fuzzy_hyla.json"
  bad.write_text(content)
  with pytest.raises(errors.BadInput, match=str(bad)):
    partial.read_all(str(results))
  for flags in (["--dry_run", "--device_kind=cpu"], ["--report"]):
    out = tl.run(
        [sys.executable, "-m", "launch.campaign", "--set=smoke", f"--results_dir={results}",
         f"--report_path={tmp_path / 'r.md'}", *flags],
        cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0], out.stderr


@pytest.mark.parametrize("flags,says", [
    (["--budget_minutes=1", "--device_kind=NVIDIA H100 80GB HBM3"], "without --dry_run"),
    (["--budget_minutes=1", "--root={file}"], "is a file"),
    (["--report", "--report_path={dir}"], "allowed: a Markdown file path"),
    (["--report", "--report_path={file}/r.md"], "is below the file"),
    (["--dry_run", "--device_kind=cpu", "--root={file}/root"], "is below the file"),
])
def test_flags_that_would_record_what_did_not_run_are_refused(tmp_path, flags, says):
  a_file = tmp_path / "a_file"
  a_file.write_text("")
  flags = [f.format(file=a_file, dir=tmp_path) for f in flags]
  out = tl.run([sys.executable, "-m", "launch.campaign", "--set=smoke",
                        f"--results_dir={tmp_path / 'results'}", *flags],
                       cwd=REPO, capture_output=True, text=True)
  assert out.returncode == 2 and says in out.stderr, out.stderr
  assert len(out.stderr.strip().splitlines()) == 1, out.stderr
  assert not os.path.exists(tmp_path / "results" / "smoke_fuzzy_hyla.json")


# 18446744073709552000 wraps to 384 in bash arithmetic (2^64 + 384): refused as text first.
@pytest.mark.parametrize("seconds", ["0", "119", "36001", "ten", "18446744073709552000"])
def test_device_window_refuses_a_budget_it_cannot_honour(seconds):
  out = tl.run(["bash", "launch/device_window.sh", seconds, "b_sraven_hyla"],
                       cwd=REPO, capture_output=True, text=True)
  assert out.returncode == 2 and f"SECONDS={seconds}; allowed" in out.stdout, out


@pytest.mark.slow
def test_two_sigterms_leave_no_trainer_behind_and_keep_the_state(tmp_path):
  """Two SIGTERMs 0.3 s apart while a cell trains: the runner forwards the stop, waits for
  its trainer, saves what it has, and progress.txt and the claim end true."""
  root, results = tmp_path / "root", tmp_path / "results"
  log, out = root / "smoke_sraven_hyla" / runner.LOG, tmp_path / "runner.out"
  with open(out, "w") as f, tl.started(
      [sys.executable, "-m", "launch.campaign", "--set=smoke", "--cells=smoke_sraven_hyla",
       "--budget_minutes=20", f"--root={root}", f"--results_dir={results}"],
      cwd=REPO, stdout=f, stderr=subprocess.STDOUT) as proc:
    def training():
      assert proc.poll() is None, f"the runner exited: {out.read_text()}"
      return log.exists() and "step" in log.read_text()
    tl.wait_until(training, [proc], "the smoke cell to log a step", [str(log), str(out)])
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)  # The second stop lands while the first is handled.
    proc.send_signal(signal.SIGTERM)
    tl.wait_for([proc], "the stopped runner to exit", [str(out)])
  out = out.read_text()
  assert proc.returncode == 75, out
  trainers = subprocess.run(["pgrep", "-f", str(root / "smoke_sraven_hyla")],
                            capture_output=True, text=True)
  assert trainers.stdout.strip() == "", f"trainer left running: {trainers.stdout}"
  progress = (root / runner.PROGRESS).read_text()
  assert "running:" not in progress and "stopped: smoke_sraven_hyla" in progress, progress
  assert not os.path.exists(records._claim_path(str(results), "smoke_sraven_hyla"))
  step = partial.read_all(str(results)).get("smoke_sraven_hyla", {}).get("step", 0)
  assert os.path.exists(partial.paths(str(results), "smoke_sraven_hyla")[1]) == bool(step)


# Hand edits of a cell file that --dry_run and --report once met as a TypeError or KeyError
# deep in a table (or as an estimate of -166.7 minutes): (edit, what the one line says).
CELL_FILE_EDITS = {
    "number_as_string": (lambda r: r["members"][0]["final"].update({"ood/r2": "0.9"}),
                         "field members[0].final['ood/r2'] is '0.9'; allowed: a finite number"),
    "members_missing": (lambda r: r.pop("members"),
                        "field members is missing; allowed: a list of at least 1"),
    "curves_as_strings": (lambda r: r["members"][0].update(curves="[[0, 0.1]]"),
                          "field members[0].curves is '[[0, 0.1]]'; allowed: an object"),
    "another_experiment": (lambda r: r.update(experiment="sraven"),
                           "field experiment is 'sraven'; allowed: 'fuzzy_logic' (cell "
                           "a_fuzzy_hyla_seed0's definition)"),
    "negative_rate": (lambda r: r.update(member_steps_per_s=-5.0),
                      "field member_steps_per_s is -5.0; allowed: a finite number > 0 or null"),
    "negative_wall": (lambda r: r.update(wall_s=-10_000.0),
                      "field wall_s is -10000.0; allowed: a finite number >= 0"),
    "learning_rate_as_string": (
        lambda r: r["members"][0]["settings"].update({"optimizer.learning_rate": "1e-3"}),
        "field members[0].settings.optimizer.learning_rate is '1e-3'; allowed: a finite "
        "number > 0"),
    "metric_missing": (lambda r: r["members"][0]["final"].pop("ood/r2"),
                       "field members[0].final lacks 'ood/r2'; allowed: every member's "
                       "ood/r2, test/r2, unseen_terms/r2"),
    "another_members": (lambda r: r["members"][0].update(name="seed1"),
                        "field members.name is ['seed1']; allowed: ['seed0']"),
}


def _edited_cell_file(results, edit: str) -> str:
  """A cell file as the runner writes it (a_fuzzy_hyla_seed0), then edited by hand."""
  record = test_campaign._record("a_fuzzy_hyla_seed0", "hyla", [(0, 0.8)])
  os.makedirs(results, exist_ok=True)
  assert records.publish(str(results), record)
  path = records.path_of(str(results), "a_fuzzy_hyla_seed0")
  assert records.read(path) == record  # Unedited: it reads.
  CELL_FILE_EDITS[edit][0](record)
  with open(path, "w") as f:
    json.dump(record, f)
  return path


@pytest.mark.parametrize("edit", sorted(CELL_FILE_EDITS))
def test_a_hand_edited_cell_file_is_named_with_its_field(tmp_path, edit):
  path = _edited_cell_file(tmp_path / "results", edit)
  with pytest.raises(errors.BadInput) as e:
    records.read_all(str(tmp_path / "results"))
  message = str(e.value)
  assert message.startswith(f"cell file {path!r}: {CELL_FILE_EDITS[edit][1]}"), message
  assert "\n" not in message and message.endswith("delete it to rerun the cell")


@pytest.mark.parametrize("edit", ["number_as_string", "members_missing", "negative_wall"])
def test_dry_run_and_report_name_a_hand_edited_cell_file(tmp_path, edit):
  path = _edited_cell_file(tmp_path / "results", edit)
  for flags in (["--dry_run", "--device_kind=cpu"], ["--report"]):
    out = tl.run(
        [sys.executable, "-m", "launch.campaign", f"--results_dir={tmp_path / 'results'}",
         f"--report_path={tmp_path / 'r.md'}", f"--root={tmp_path / 'root'}", *flags],
        cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert path in line and CELL_FILE_EDITS[edit][1] in line, line
  assert not (tmp_path / "r.md").exists()


@pytest.mark.parametrize("edit, says", [
    (lambda r: r.update(step=-400), "field step is -400; allowed: an integer >= 0"),
    (lambda r: r.update(step=9), "field step is 9; allowed: 0 to num_steps (8)"),
    (lambda r: r["members"][0].update(curves="x"), "field members[0].curves is 'x'"),
    (lambda r: r.update(experiment="sraven"), "field experiment is 'sraven'; allowed: "
     "'fuzzy_logic'"),
    (lambda r: r["device"].pop("jax_version"), "field device.jax_version is missing"),
])
def test_a_hand_edited_progress_file_is_named_with_its_field(tmp_path, edit, says):
  """A progress file as the runner writes it (a cut-off smoke cell), then edited."""
  workdir = tmp_path / "root" / HYLA.name
  (workdir / "checkpoints" / "4").mkdir(parents=True)
  results = str(tmp_path / "results")
  partial.save(HYLA, str(workdir), results, CPU)
  path = partial.paths(results, HYLA.name)[0]
  record = partial.read(path)
  edit(record)
  with open(path, "w") as f:
    json.dump(record, f)
  with pytest.raises(errors.BadInput, match=f"^progress file {re.escape(repr(path))}: "
                     f"{re.escape(says)}"):
    partial.read_all(results)
