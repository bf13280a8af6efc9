"""The campaign keeps every step it paid for and publishes only what it measured: cells
stopped at any moment (before their first log, twice in a row), resume states that are not
the cell's own or not readable, progress files that are damaged, and flags that would record
another device (issue "A window's work is never lost")."""

import io
import json
import os
import signal
import subprocess
import sys
import tarfile
import time

import pytest

# pylint: disable=protected-access
from hypernet_attention import errors
from hypernet_attention.runs import curves
from launch.campaign import cells as cells_lib
from launch.campaign import partial
from launch.campaign import records
from launch.campaign import runner

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CPU = {"platform": "cpu", "kind": "cpu", "count": 1, "jax_version": "test"}
HYLA = cells_lib.BY_NAME["smoke_fuzzy_hyla"]
SOFTMAX = cells_lib.BY_NAME["smoke_fuzzy_softmax"]


def _config_of(cell) -> dict:
  """The config.json a run of `cell` writes, in the fields a resume state is checked on."""
  return {"experiment": cell.experiment, "model": {"attention": cell.model},
          "num_train_steps": cell.num_steps,
          "population": {"member_names": list(cell.member_names),
                         "members": [dict(m) for m in cell.members]}}


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


def _state_of(results, cell, run_of=None) -> str:
  config = json.dumps(_config_of(run_of or cell)).encode()
  return _state(results, cell.name, {f"{cell.name}/config.json": config,
                                     f"{cell.name}/checkpoints/4/state": b"x"})


def test_curves_of_a_run_without_scalars_are_empty_not_an_error(tmp_path):
  assert curves.read_scalars(str(tmp_path)) == {}
  with pytest.raises(ValueError, match="no scalars logged yet"):
    curves.read_scalars(str(tmp_path), ["train/loss"])


def test_a_cell_stopped_before_its_first_log_keeps_its_checkpoint(tmp_path):
  """Stopped at step 350 with no scalars yet: its progress and resume state are saved."""
  workdir = tmp_path / "root" / HYLA.name
  (workdir / "checkpoints" / "350").mkdir(parents=True)
  (workdir / "checkpoints" / "350" / "state").write_bytes(b"x" * 100)
  (workdir / "config.json").write_text(json.dumps(_config_of(HYLA)))
  results = str(tmp_path / "results")
  said = partial.save(HYLA, str(workdir), results, CPU)
  assert "step 350" in said
  progress = partial.read_all(results)[HYLA.name]
  assert progress["step"] == 350 and all(m["curves"] == {} for m in progress["members"])
  assert os.path.exists(partial.paths(results, HYLA.name)[1])


def test_a_resume_state_of_another_cell_is_refused_before_anything_is_unpacked(tmp_path):
  results = str(tmp_path / "results")
  path = _state_of(results, HYLA, run_of=SOFTMAX)  # softmax's run under hyla's name
  with pytest.raises(errors.BadInput, match=r"not smoke_fuzzy_hyla's run: model.attention "
                     r"'softmax' \(the cell's: 'hyla'\).*delete it \(git rm .*tar.gz"):
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
    out = subprocess.run(
        [sys.executable, "-m", "launch.campaign", "--set=smoke", f"--results_dir={results}",
         f"--report_path={tmp_path / 'r.md'}", *flags],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and str(bad) in lines[0], out.stderr


@pytest.mark.parametrize("flags,says", [
    (["--budget_minutes=1", "--device_kind=NVIDIA H100 80GB HBM3"], "without --dry_run"),
    (["--budget_minutes=1", "--root={file}"], "is a file"),
    (["--report", "--report_path={dir}"], "allowed: a Markdown file path"),
])
def test_flags_that_would_record_what_did_not_run_are_refused(tmp_path, flags, says):
  a_file = tmp_path / "a_file"
  a_file.write_text("")
  flags = [f.format(file=a_file, dir=tmp_path) for f in flags]
  out = subprocess.run([sys.executable, "-m", "launch.campaign", "--set=smoke",
                        f"--results_dir={tmp_path / 'results'}", *flags],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
  assert out.returncode == 2 and says in out.stderr, out.stderr
  assert not os.path.exists(tmp_path / "results" / "smoke_fuzzy_hyla.json")


@pytest.mark.parametrize("seconds", ["0", "119", "36001", "ten"])
def test_device_window_refuses_a_budget_it_cannot_honour(seconds):
  out = subprocess.run(["bash", "launch/device_window.sh", seconds, "b_sraven_hyla"],
                       cwd=REPO, capture_output=True, text=True, timeout=30)
  assert out.returncode == 2 and f"SECONDS={seconds}; allowed" in out.stdout, out


@pytest.mark.slow
def test_two_sigterms_leave_no_trainer_behind_and_keep_the_state(tmp_path):
  """Two SIGTERMs 0.3 s apart while a cell trains: the runner forwards the stop, waits for
  its trainer, saves what it has, and progress.txt and the claim end true."""
  root, results = tmp_path / "root", tmp_path / "results"
  proc = subprocess.Popen(
      [sys.executable, "-m", "launch.campaign", "--set=smoke", "--cells=smoke_sraven_hyla",
       "--budget_minutes=20", f"--root={root}", f"--results_dir={results}"],
      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  log = root / "smoke_sraven_hyla" / runner.LOG
  deadline = time.time() + 240
  while time.time() < deadline and not (log.exists() and "step" in log.read_text()):
    time.sleep(0.2)
  assert log.exists(), "the cell never started"
  proc.send_signal(signal.SIGTERM)
  time.sleep(0.3)
  proc.send_signal(signal.SIGTERM)
  out, _ = proc.communicate(timeout=180)
  assert proc.returncode == 75, out
  trainers = subprocess.run(["pgrep", "-f", str(root / "smoke_sraven_hyla")],
                            capture_output=True, text=True)
  assert trainers.stdout.strip() == "", f"trainer left running: {trainers.stdout}"
  progress = (root / runner.PROGRESS).read_text()
  assert "running:" not in progress and "stopped: smoke_sraven_hyla" in progress, progress
  assert not os.path.exists(records._claim_path(str(results), "smoke_sraven_hyla"))
  step = partial.read_all(str(results)).get("smoke_sraven_hyla", {}).get("step", 0)
  assert os.path.exists(partial.paths(str(results), "smoke_sraven_hyla")[1]) == bool(step)


def test_a_cell_file_whose_numbers_are_strings_is_named(tmp_path):
  record = {"schema": records.SCHEMA, "cell": HYLA.name, "stage": "a", "kind": "train",
            "experiment": "fuzzy_logic", "device": CPU, "jax_version": "x", "commit": "c",
            "wall_s": 10.0, "members": [{"name": "seed0", "final": {"ood/r2": "0.9"}}]}
  path = tmp_path / f"{HYLA.name}.json"
  path.write_text(json.dumps(record))
  with pytest.raises(errors.BadInput, match=r"ood/r2='0.9'.*restore it from git"):
    records.read(str(path))
  record["members"][0]["final"]["ood/r2"] = 0.9
  path.write_text(json.dumps(record))
  assert records.read(str(path))["members"][0]["final"]["ood/r2"] == 0.9
