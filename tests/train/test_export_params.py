"""Kept final parameters (`train/export_params.py`): no folder the tool did not write is
deleted or overwritten, a previous export is replaced whole, and a damaged kept folder is one
line naming it."""

import hashlib
import os
import re
import sys

import pytest

from hypernet_attention import errors
from hypernet_attention.train import export_params
from hypernet_attention.train import loop
from hypernet_attention.train import restore

import train_testlib as tl

pytestmark = pytest.mark.e2e  # Trains a smoke run (tests/pytest.ini).
CLI = os.path.join(tl.REPO, "experiments", "export_params.py")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A finished smoke run (checkpoints at steps 4 and 8), alone in its parent folder."""
  workdir = str(tmp_path_factory.mktemp("export") / "wd")
  loop.train_and_evaluate(tl.smoke("sraven", **{"eval.ceiling_problems": 0}), workdir)
  return workdir


def _contents(directory: str) -> dict:
  """Relative path -> sha256 of every file under `directory` (count and contents)."""
  out = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
  return out


def test_refuses_every_folder_it_did_not_write(run, tmp_path):
  """The workdir, a folder in it, its parent, a user's folder, a file and a path below one:
  one BadInput line each, and the workdir and the user's files exactly as they were."""
  parent = os.path.dirname(run)
  user = tmp_path / "mine"
  user.mkdir()
  (user / "notes.txt").write_text("keep me")
  (tmp_path / "a_file").write_text("keep me too")
  cases = [
      (run, r"is the run's workdir"),
      (os.path.join(run, "kept"), r"lies inside the run's workdir"),
      (os.path.join(run, "checkpoints"), r"lies inside the run's workdir"),
      (parent, r"holds the run's workdir"),
      (str(user), r"is a folder with files of its own, not one export_params wrote"),
      (str(tmp_path / "a_file"), r"is a file; allowed: a folder"),
      (str(tmp_path / "a_file" / "kept"), r"is below the file"),
  ]
  workdir_before, user_before = _contents(run), _contents(str(user))
  listing = sorted(os.listdir(parent)), sorted(os.listdir(tmp_path))
  for out, message in cases:
    with pytest.raises(errors.BadInput, match=message) as refused:
      export_params.export(run, out)
    assert "\n" not in str(refused.value)
    assert _contents(run) == workdir_before, out
    assert _contents(str(user)) == user_before, out
    assert (sorted(os.listdir(parent)), sorted(os.listdir(tmp_path))) == listing, out
  assert (tmp_path / "a_file").read_text() == "keep me too"


def test_entry_point_refuses_the_workdir_in_one_line(run):
  result = tl.run([sys.executable, CLI, f"--workdir={run}", f"--output_dir={run}"],
                          env=tl.subprocess_env(), cwd=tl.REPO, capture_output=True,
                          text=True)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2, result.stderr[-2000:]
  assert f"--output_dir='{run}' is the run's workdir" in lines[-1], lines[-1]
  assert "Traceback" not in result.stderr, result.stderr[-2000:]


def test_replaces_only_a_previous_export(run, tmp_path):
  """New and empty folders are written, a previous export is replaced whole (no temporary
  sibling left), and the same export with a user's file beside it is refused."""
  empty = tmp_path / "empty"
  empty.mkdir()
  kept = str(tmp_path / "kept")
  for out in (str(empty), kept, kept):  # The second `kept` replaces the first.
    record = export_params.export(run, out)
    assert record["step"] == 8 and export_params.is_export(out)
    assert restore.restore_params(out).step == 8
  assert sorted(os.listdir(tmp_path)) == ["empty", "kept"]
  (tmp_path / "kept" / "notes.txt").write_text("mine now")
  before = _contents(kept)
  with pytest.raises(errors.BadInput, match="not one export_params wrote"):
    export_params.export(run, kept)
  assert _contents(kept) == before


# Orbax closes a failed restore's event loop with reads still in flight; one finishing later
# may print "Event loop is closed" (as in test_checkpointing.py): the restore had failed.
@pytest.mark.filterwarnings(
    "ignore:(?s).*Event loop is closed:pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage, says", [
    ("truncated", r"Encountered error while reading array index"),
    ("deleted", r"no readable tree metadata"),
])
def test_a_damaged_kept_folder_is_one_line_naming_it(run, tmp_path, damage, says):
  """The largest array file truncated to a third, or the tree's metadata deleted."""
  kept = str(tmp_path / "kept")
  export_params.export(run, kept)
  folder = os.path.join(kept, "final_params")
  if damage == "truncated":
    arrays = os.path.join(folder, "ocdbt.process_0", "d")
    path = max((os.path.join(arrays, n) for n in os.listdir(arrays)), key=os.path.getsize)
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) // 3)
  else:
    os.remove(os.path.join(folder, "_METADATA"))
  with pytest.raises(errors.BadInput, match=rf"^the kept parameters in '{re.escape(folder)}' "
                     rf"are unreadable \(a file missing or truncated: {says}.*\); allowed: "
                     "export them again") as refused:
    restore.restore_params(kept)
  assert "\n" not in str(refused.value)


@pytest.mark.parametrize("record", ['{"members": [], "bytes": 1}', '{"step": "eight"}', '[8]',
                                    '{"step": -1}'])
def test_a_damaged_kept_record_is_one_line_naming_it(run, tmp_path, record):
  """final_params.json edited or damaged (JSON, but not the record export writes): one line
  naming it (a KeyError or TypeError traceback before)."""
  kept = str(tmp_path / "kept")
  export_params.export(run, kept)
  path = os.path.join(kept, "final_params.json")
  with open(path, "w") as f:
    f.write(record)
  with pytest.raises(errors.BadInput, match=rf"^{re.escape(path)} holds .*, not a record of "
                     "kept parameters; allowed: the one export_params writes") as refused:
    restore.restore_params(kept)
  assert "\n" not in str(refused.value)


@pytest.mark.parametrize("target", ["empty", "export"])
def test_an_output_dir_that_is_a_symlink_is_refused_naming_its_target(run, tmp_path, target):
  """A link to an empty folder or to a previous export: the export's rename would replace
  the link itself (a misleading "Not a directory" line before); nothing is written."""
  real = tmp_path / "real"
  if target == "export":
    export_params.export(run, str(real))
  else:
    real.mkdir()
  before = _contents(str(real))
  link = tmp_path / "link"
  link.symlink_to(real)
  with pytest.raises(errors.BadInput, match=rf"--output_dir='{re.escape(str(link))}' is a "
                     rf"symbolic link \(to '{re.escape(str(real))}'\); allowed: a real folder"):
    export_params.export(run, str(link))
  assert link.is_symlink() and _contents(str(real)) == before

