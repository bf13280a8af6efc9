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
initialization from the seed). SRAVEN at paper size keeps ~1.6 MB per member in float32.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Optional

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


def export(workdir: str, out_dir: str, max_bytes: Optional[int] = None) -> dict[str, Any]:
  """Writes the final parameters of the finished run in `workdir` to `out_dir` (replacing
  it only once the new folder is complete); returns its `final_params.json` record.

  Raises ValueError (nothing written) if the run is unfinished or the folder would exceed
  `max_bytes`.
  """
  if not run_files.is_finished(workdir):
    raise ValueError(f"{workdir!r} is not a finished run (no summary.json); allowed: the "
                     "workdir of a run that ended")
  config, step, params = restore.all_params(workdir)
  members = list(run_files.member_names(config)) if run_files.is_population(config) else []
  parent = os.path.dirname(os.path.abspath(out_dir))
  tmp = os.path.join(parent, f".{os.path.basename(out_dir)}.tmp-{os.getpid()}")
  shutil.rmtree(tmp, ignore_errors=True)
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
      raise ValueError(f"the final parameters of {workdir!r} take {size / 2**20:.1f} MiB, "
                       f"over the {max_bytes / 2**20:.0f} MiB allowed; not kept")
    if os.path.exists(out_dir):
      shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return record
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
