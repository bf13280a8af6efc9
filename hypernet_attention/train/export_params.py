"""A finished run's final parameters, kept apart from its workdir: what later analysis needs.

A workdir holds full train states (parameters, Adam's two moments, for every kept step) and
lives on the machine that trained it; an accelerator window's machine is given back bare. The
paper's central evidence (latent codes that decode the operation, Fig. 2 and Fig. 5F) is
computed from parameters alone, so the campaign keeps exactly those beside each cell file:

  <out>/config.json, population_summary.json, summary.json   the run's own records
  <out>/<member>/config.json, summary.json                    each member's (populations)
  <out>/final_params/                                          Orbax checkpoint of the params
                                                               tree (members stacked)
  <out>/final_params.json                                      {"step", "members", "bytes"}

`restore.restore_params(out, member=i)` and `experiments/probe_latents.py --workdir=out/<member>`
read it as they read a workdir (its one step is the run's last; step 0 rebuilds the
initialization from the seed). SRAVEN at paper size keeps ~1.6 MB per member in float32."""

from __future__ import annotations

import os
import shutil
from typing import Any, Optional
import uuid

from hypernet_attention import errors
from hypernet_attention.runs import run_files
from hypernet_attention.train import checkpointing
from hypernet_attention.train import restore

# The run's own small records, copied as they are (at the top and in each member's folder).
RECORDS = (run_files.CONFIG, run_files.SUMMARY, run_files.POPULATION_SUMMARY)


def folder_bytes(directory: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f))
             for d, _, files in os.walk(directory) for f in files)


def _copy_records(src: str, dst: str) -> None:
  os.makedirs(dst, exist_ok=True)
  for name in RECORDS:
    if os.path.exists(os.path.join(src, name)):
      shutil.copy2(os.path.join(src, name), os.path.join(dst, name))


def is_export(directory: str) -> bool:
  """Whether `directory` is a folder this module wrote: its `final_params.json` record and
  nothing but the entries `export` writes (the records, `final_params/`, the record's member
  folders). Only such a folder may be replaced; a user's file beside them makes it not one."""
  record = run_files.read_json(os.path.join(directory, run_files.FINAL_PARAMS_RECORD))
  if (not isinstance(record, dict) or not {"step", "members", "bytes"} <= set(record)
      or not isinstance(record["members"], list)):
    return False
  written = {*RECORDS, run_files.FINAL_PARAMS, run_files.FINAL_PARAMS_RECORD,
             *map(str, record["members"])}
  return (os.path.isdir(os.path.join(directory, run_files.FINAL_PARAMS))
          and set(os.listdir(directory)) <= written)


def check_output_dir(workdir: str, out_dir: str) -> str:
  """`out_dir` made absolute, or `BadInput` in one line when writing it could lose anything:
  a file there or above it; the run's workdir, a folder inside it or one holding it (its
  checkpoints); an existing folder that is neither empty nor a previous export."""
  out = os.fspath(run_files.check_output_dir(out_dir, "--output_dir"))
  if os.path.islink(out):  # Replaced by a rename, which would move the link, not its target.
    raise errors.BadInput(f"--output_dir={out_dir!r} is a symbolic link (to "
                          f"{os.readlink(out)!r}); allowed: a real folder path (its target)")
  real_out, real_workdir = os.path.realpath(out), os.path.realpath(workdir)
  common = os.path.commonpath([real_out, real_workdir])
  if common in (real_out, real_workdir):
    where = ("is" if real_out == real_workdir else
             "lies inside" if common == real_workdir else "holds")
    raise errors.BadInput(f"--output_dir={out_dir!r} {where} the run's workdir {workdir!r}; "
                          "allowed: a folder outside it that holds no part of it")
  if os.path.isdir(out) and os.listdir(out) and not is_export(out):
    raise errors.BadInput(f"--output_dir={out_dir!r} is a folder with files of its own, not "
                          "one export_params wrote; allowed: a new or empty folder, or a "
                          "previous export (replaced)")
  return out


def _new_sibling(out: str, what: str) -> str:
  """A folder beside `out` that this call creates (a name no one else has: `os.mkdir`
  refuses an existing one), so that removing it never removes anyone else's."""
  sibling = os.path.join(os.path.dirname(out), f".{os.path.basename(out)}.{what}-"
                         f"{os.getpid()}-{uuid.uuid4().hex[:8]}")
  os.mkdir(sibling)
  return sibling


def _replace(tmp: str, out: str) -> None:
  """Moves the finished folder `tmp` to `out`; a previous export there goes aside first and
  is removed only once the new one is in place (back in place if the move fails)."""
  if not os.path.isdir(out) or not os.listdir(out):
    os.replace(tmp, out)  # New, or an empty folder: one rename.
    return
  old = _new_sibling(out, "old")
  os.replace(out, old)  # Over the empty folder just made.
  try:
    os.replace(tmp, out)
  except OSError:
    os.replace(old, out)
    raise
  shutil.rmtree(old)


def export(workdir: str, out_dir: str, max_bytes: Optional[int] = None) -> dict[str, Any]:
  """Writes the final parameters of the finished run in `workdir` to `out_dir`: a new or
  empty folder, or a previous export, replaced only once the new folder is complete (in a
  temporary sibling). Returns its `final_params.json` record.

  Raises `BadInput` (nothing written) for an `out_dir` that `check_output_dir` refuses, an
  unfinished run, or a folder that would exceed `max_bytes`."""
  out_dir = check_output_dir(workdir, out_dir)
  if not run_files.is_finished(workdir):
    raise errors.BadInput(f"{workdir!r} is not a finished run (no summary.json); allowed: "
                          "the workdir of a run that ended")
  config, step, params = restore.all_params(workdir)
  members = run_files.member_names(config)
  parent = os.path.dirname(out_dir)
  os.makedirs(parent, exist_ok=True)
  tmp = _new_sibling(out_dir, "tmp")
  try:
    _copy_records(workdir, tmp)
    for name in members:
      _copy_records(os.path.join(workdir, name), os.path.join(tmp, name))
    checkpointing.save_params(os.path.join(tmp, run_files.FINAL_PARAMS), params)
    record = {"step": int(step), "members": members,
              "bytes": folder_bytes(os.path.join(tmp, run_files.FINAL_PARAMS))}
    run_files.write_json(os.path.join(tmp, run_files.FINAL_PARAMS_RECORD), record)
    size = folder_bytes(tmp)
    if max_bytes is not None and size > max_bytes:
      raise errors.BadInput(f"the final parameters of {workdir!r} take {size / 2**20:.1f} "
                            f"MiB, over the {max_bytes / 2**20:.0f} MiB allowed; not kept")
    _replace(tmp, out_dir)
    return record
  finally:
    shutil.rmtree(tmp, ignore_errors=True)  # Ours; gone already when the export succeeded.
