"""Cells cut off by a window's end: their progress so far, and their state to resume from.

An accelerator window can end before a cell does (a paper-size SRAVEN population of 3 takes
~8 minutes alone on an H200; a window has ~10). The cell's checkpoint lives on a machine
that is given back bare, so without this the window's training is lost. When a cell stops
(SIGTERM, exit 75) the runner saves, beside the cell files under `partial/`:

  <cell>.json    its progress: steps done, and per member the metrics of every evaluation
                 so far (the report shows them as a cut-off row, never as a result).
  <cell>.tar.gz  its workdir with only the newest checkpoint, if that packs into
                 `MAX_STATE_BYTES` (a device window returns files of up to 16 MiB).

A later runner on any machine unpacks the state into `<root>/<cell>` when that workdir has
no checkpoint, and the cell resumes from it exactly (the training loop's resume); once the
cell finishes, both files are deleted. Commit them: the repository is the one store that
every window sees."""

from __future__ import annotations

import functools
import json
import os
import tarfile
import tempfile
from typing import Any, Optional
import zlib

from hypernet_attention import errors
from hypernet_attention.runs import run_files
from launch.campaign import cells as cells_lib
from launch.campaign import collect_cell
from launch.campaign import plan
from launch.campaign import records
from launch.campaign import schema

DIR = "partial"
MAX_STATE_BYTES = 16 * 2**20
SCHEMA = 1


def paths(results_dir: str, cell: str) -> tuple[str, str]:
  """(progress JSON, resume-state tarball) of `cell`."""
  base = os.path.join(results_dir, DIR, cell)
  return base + ".json", base + ".tar.gz"


def _curves_so_far(member_dir: str) -> dict[str, Any]:
  """A member's curves, {} where none can be read: a cell stopped before its first log has
  none, and its checkpoint must be saved whatever its event files hold."""
  try:
    return collect_cell.member_curves(member_dir)
  except (OSError, ValueError, KeyError):
    return {}


def progress_record(cell: cells_lib.Cell, workdir: str, device: dict[str, Any]) -> dict[str, Any]:
  """Steps done and every member's curves so far (a train cell cut off mid-run)."""
  members = [{"name": name, "curves": _curves_so_far(os.path.join(workdir, name))}
             for name in cell.member_names]
  runs = collect_cell.segments(workdir)
  return {"schema": SCHEMA, "cell": cell.name, "stage": cell.stage,
          "experiment": cell.experiment, "model": cell.model, "title": cell.title,
          "step": plan.checkpointed_step(workdir), "num_steps": cell.num_steps,
          "device": device, "commit": collect_cell.commits(runs),
          "wall_s": sum(r["wall_s"] for r in runs), "members": members}


def _pack(workdir: str, name: str, target: str) -> None:
  """`workdir`'s files, of its checkpoints only the newest, as `target` (tar.gz, under the
  folder `name`, so it unpacks as `<root>/<name>`)."""
  newest = str(plan.checkpointed_step(workdir))

  def keep(info: tarfile.TarInfo) -> Optional[tarfile.TarInfo]:
    parts = info.name.split("/")
    if len(parts) >= 3 and parts[1] == run_files.CHECKPOINTS and parts[2] != newest:
      return None
    return info

  with tarfile.open(target, "w:gz") as tar:
    tar.add(workdir, arcname=name, filter=keep)


def save(cell: cells_lib.Cell, workdir: str, results_dir: str, device: dict[str, Any]) -> str:
  """Writes `cell`'s progress and (if small enough) its resume state; returns what it did."""
  progress_path, state_path = paths(results_dir, cell.name)
  os.makedirs(os.path.dirname(progress_path), exist_ok=True)
  record = progress_record(cell, workdir, device)
  run_files.write_bytes(progress_path, json.dumps(record, indent=1, sort_keys=True,
                                                  allow_nan=False).encode())
  if not record["step"]:
    return f"progress in {progress_path}; no checkpoint to resume from"
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(state_path), prefix=f".{cell.name}.")
  os.close(fd)
  try:
    _pack(workdir, cell.name, tmp)
    size = os.path.getsize(tmp)
    if size > MAX_STATE_BYTES:
      return (f"progress in {progress_path}; resume state not kept: {size / 2**20:.1f} MiB "
              f"packed, over the {MAX_STATE_BYTES / 2**20:.0f} MiB a window can return")
    os.chmod(tmp, 0o644)
    os.replace(tmp, state_path)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)
  return f"progress and resume state (step {record['step']:,}) in {state_path}"


def check_state(cell: cells_lib.Cell, state_path: str) -> tarfile.TarFile:
  """`state_path` opened, once it is shown to be `cell`'s own resume state: a readable
  tar.gz whose every path lies under `<cell>/` and whose `config.json` is the cell's run.
  Anything else is one BadInput naming the file and what to do (nothing is unpacked)."""
  delete = (f"delete it (git rm {state_path} and its .json beside it) to start "
            f"{cell.name} afresh, or restore it from git")
  try:
    tar = tarfile.open(state_path, "r:gz")
    members = tar.getmembers()
  except (OSError, EOFError, tarfile.TarError, zlib.error) as e:
    raise errors.BadInput(f"resume state {state_path} is unreadable ({e}); {delete}") from None
  try:
    bad = [m.name for m in members
           if not (m.name == cell.name or m.name.startswith(cell.name + "/"))
           or ".." in m.name.split("/") or not (m.isfile() or m.isdir())]
    if bad:
      raise errors.BadInput(f"resume state {state_path} holds {bad[0]!r}, outside "
                            f"{cell.name}/ or not a plain file; {delete}")
    try:
      config = json.load(tar.extractfile(f"{cell.name}/{run_files.CONFIG}"))
    except (KeyError, AttributeError, OSError, EOFError, tarfile.TarError, zlib.error,
            UnicodeDecodeError, json.JSONDecodeError) as e:
      raise errors.BadInput(f"resume state {state_path} has no readable "
                            f"{cell.name}/{run_files.CONFIG} ({e}); {delete}") from None
    different = cells_lib.run_differences(cell, config)
    if different:
      raise errors.BadInput(f"resume state {state_path} is not {cell.name}'s run: its "
                            f"{run_files.CONFIG} differs in {different[0]} (recorded -> the "
                            f"cell's); {delete}")
  except BaseException:
    tar.close()
    raise
  return tar


def restore(cell: cells_lib.Cell, workdir: str, results_dir: str) -> Optional[int]:
  """Unpacks `cell`'s saved state into `workdir` if that has no checkpoint; the step it
  resumes from, or None (nothing restored). A state that is not the cell's own, or not
  readable, is a BadInput (`check_state`), before anything is unpacked."""
  _, state_path = paths(results_dir, cell.name)
  if not os.path.exists(state_path) or plan.checkpointed_step(workdir):
    return None
  root = os.path.dirname(workdir.rstrip(os.sep))
  os.makedirs(root, exist_ok=True)
  with check_state(cell, state_path) as tar:
    try:
      tar.extractall(root, filter="data")
    except (OSError, EOFError, tarfile.TarError, zlib.error) as e:
      raise errors.BadInput(f"resume state {state_path} is truncated or corrupt ({e}); "
                            f"delete it (git rm) to start {cell.name} afresh") from None
  return plan.checkpointed_step(workdir)


def forget(results_dir: str, cell: str) -> None:
  """Deletes `cell`'s progress and state (it finished: its cell file supersedes them)."""
  for path in paths(results_dir, cell):
    if os.path.exists(path):
      os.unlink(path)


# One progress record; BadInput naming the file and its first bad field (corrupt, truncated, a
# field missing, of the wrong type or out of range), so --dry_run and --report say which file.
read = functools.partial(schema.progress_file, schema=SCHEMA)


def read_all(results_dir: str) -> dict[str, dict[str, Any]]:
  """Every progress record under `<results_dir>/partial/`, by cell name."""
  return records.read_all(os.path.join(results_dir, DIR), read)
