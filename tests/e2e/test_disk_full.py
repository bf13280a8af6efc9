"""A full disk during training: one line naming the path and the system's reason, exit 1,
and every file written before it intact (the last finalized checkpoint resumes).

The full disk is real: a small tmpfs in a private mount namespace (`unshare -rm`, no root
needed where user namespaces are allowed), or /dev/full behind a run file's name.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest

import train_testlib as tl

PROGRAM = os.path.join("experiments", "fuzzy_logic.py")
CONFIG = "--config=experiments/configs/fuzzy_logic.py:model=hyla,size=smoke"
TIMESTAMPED = re.compile(r"\d\d:\d\d:\d\d ")  # The console's progress lines.


def _train(workdir: str, *flags: str) -> list[str]:
  return [sys.executable, PROGRAM, CONFIG, f"--workdir={workdir}", *flags]


def _unprivileged_mounts() -> bool:
  if shutil.which("unshare") is None:
    return False
  return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


def _only_line(stderr: str) -> str:
  """The one line that is not a progress line; fails if there are more (a traceback, Orbax's
  logs of the failed save)."""
  others = [line for line in stderr.splitlines() if not TIMESTAMPED.match(line)]
  assert len(others) == 1, "\n".join(others[-40:])
  assert "Traceback" not in stderr and "ERROR" not in stderr, stderr[-3000:]
  return others[0]


@pytest.mark.skipif(not _unprivileged_mounts(), reason="needs `unshare -rm` (user namespaces)")
def test_disk_full_during_a_save_is_one_line_and_the_run_resumes(tmp_path):
  """A 700 KiB disk holds step 4's checkpoint (~380 KiB) and not step 8's: one line, exit 1,
  step 4 finalized; the same command on a larger disk resumes from it and finishes."""
  disk, out = tmp_path / "disk", tmp_path / "out"
  disk.mkdir()
  out.mkdir()
  command = " ".join(_train(f"{disk}/run", "--config.num_train_steps=16"))
  script = (f"mount -t tmpfs -o size=700k tmpfs {disk} || exit 9\n"
            f"{command} 2> {out}/first.err; echo $? > {out}/first.rc\n"
            f"ls {disk}/run/checkpoints > {out}/steps\n"
            f"mount -o remount,size=64m {disk} || exit 9\n"  # Space freed.
            f"{command} 2> {out}/second.err; echo $? > {out}/second.rc\n"
            f"test -f {disk}/run/summary.json && echo yes > {out}/summary\n")
  result = tl.run(["unshare", "-rm", "sh", "-c", script], cwd=tl.REPO, env=tl.subprocess_env(),
                  capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-2000:]
  first = (out / "first.err").read_text()
  assert (out / "first.rc").read_text().strip() == "1", first[-3000:]
  line = _only_line(first)
  assert re.fullmatch(
      r"fuzzy_logic\.py: error: checkpoint write failed while writing step \d+ in "
      rf"{disk}/run/checkpoints: No space left on device; finalized steps \[4[^\]]*\] are "
      rf"intact .*then resume with: python .*fuzzy_logic\.py .*--workdir={disk}/run", line), line
  assert "4" in (out / "steps").read_text().split()
  second = (out / "second.err").read_text()
  assert (out / "second.rc").read_text().strip() == "0", second[-3000:]
  assert re.search(r"Resuming .* from step (4|8) of 16", second), second[-3000:]
  assert (out / "summary").exists()


def test_disk_full_writing_the_summary_is_one_line(tmp_path):
  """summary.json's temporary file on a full device (/dev/full): one line naming it, exit 1;
  the checkpoints stay, and the rerun (the disk has room again) writes the summary."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "summary.json.tmp").symlink_to("/dev/full")
  first = tl.run(_train(str(workdir), "--config.num_train_steps=4"), cwd=tl.REPO,
                 env=tl.subprocess_env(), capture_output=True, text=True)
  assert first.returncode == 1, first.stderr[-3000:]
  line = _only_line(first.stderr)
  assert line == (f"fuzzy_logic.py: error: {workdir}/summary.json: No space left on device; "
                  "files written before are kept: fix the cause, then resume with: python "
                  f"{PROGRAM} {CONFIG} --config.num_train_steps=4 --workdir={workdir}"), line
  assert not (workdir / "summary.json.tmp").exists()  # The link, not /dev/full, is removed.
  assert os.path.exists("/dev/full") and os.listdir(workdir / "checkpoints") == ["4"]
  second = tl.run(_train(str(workdir), "--config.num_train_steps=4"), cwd=tl.REPO,
                  env=tl.subprocess_env(), capture_output=True, text=True)
  assert second.returncode == 0, second.stderr[-3000:]
  assert (workdir / "summary.json").exists()
