"""Cell files: one small JSON per finished cell under `experiments/results/paper_scale/`.

A cell file is the only thing a campaign keeps in the repository: the members' settings and
final metrics, their metrics at every evaluation step, and where and how fast it ran
(device kind, jax version, commit, wall time, member-steps/s). The report (`report.py`) and
the estimates of later windows (`plan.py`) are made from these files alone, so windows on
different machines add up by committing them.

Writes are atomic and never clobber: a finished cell is published with `os.link` (fails if
the file exists), so two runners on one results folder cannot overwrite each other; only
`--redo` replaces a file, and only once its new run has finished. A runner claims a cell
with an exclusive claim file beside the results (`.<cell>.claim`, the runner's host and pid);
a claim whose process is gone (same host) is stale and taken over.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import tempfile
from typing import Any, Optional

from hypernet_attention import errors
from hypernet_attention.runs import lock
from hypernet_attention.runs import run_files
from launch.campaign import schema

SCHEMA = 1
DEFAULT_DIR = os.path.join("experiments", "results", "paper_scale")
MAX_BYTES = 1_000_000  # Nothing heavy goes into the repository.
PARAMS = "params"  # <results_dir>/params/<cell>/: a train cell's final parameters, <= 16 MiB.
# <results_dir>/redraw/<cell>.json: a cell's numbers re-evaluated from its kept parameters on
# independent draws, each with its evaluation error (experiments/redraw_cells.py).
REDRAW = "redraw"


def path_of(results_dir: str, cell: str) -> str:
  return os.path.join(results_dir, f"{cell}.json")


def kept_params_dir(results_dir: str, cell: str) -> str:
  """Where a finished train cell's final parameters are kept beside its file
  (`hypernet_attention/train/export_params.py`; the record's "params" names it)."""
  return os.path.join(results_dir, PARAMS, cell)


def check_writable(results_dir: str) -> None:
  """BadInput, before any work, if cell files cannot be written to `results_dir`."""
  if os.path.exists(results_dir) and not os.path.isdir(results_dir):
    raise errors.BadInput(f"--results_dir={results_dir!r} is a file; allowed: a directory")
  try:
    os.makedirs(results_dir, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=results_dir, prefix=".write_test"):
      pass
  except OSError as e:
    raise errors.BadInput(f"--results_dir={results_dir!r} is not writable "
                          f"({e.strerror}); allowed: a writable directory") from None


# One cell file; BadInput naming it and its first bad field if this version cannot read it.
read = functools.partial(schema.cell_file, schema=SCHEMA)


def read_all(results_dir: str, read_one=read) -> dict[str, dict[str, Any]]:
  """Every cell file of `results_dir` by cell name (all checked: one bad file fails it);
  `read_one` reads another kind of file (`partial.read_all`). Only `<cell>.json` of a cell
  the campaign defines is a cell file: a user's own notes.json there is not read."""
  if not os.path.isdir(results_dir):
    return {}
  names = sorted(n for n in os.listdir(results_dir)
                 if n.endswith(".json") and n[:-len(".json")] in schema.cells_lib.BY_NAME)
  return {os.path.splitext(n)[0]: read_one(os.path.join(results_dir, n)) for n in names}


def read_redraws(results_dir: str) -> dict[str, dict[str, Any]]:
  """Every re-evaluation file of `results_dir` by cell name ({} if none)."""
  return read_all(os.path.join(results_dir, REDRAW), read_one=run_files.read_json)


def _redrawn(block: dict[str, Any], redrawn: dict[str, Any], key: str) -> dict[str, Any]:
  """`block` with `key` (a number of it) replaced by the re-evaluation's mean; the recorded
  number and the evaluation error (s.e. across draws) kept beside it."""
  return {**block, key: redrawn["mean"], "recorded": {**block.get("recorded", {}),
                                                        key: block.get(key)},
          "eval_se": {**block.get("eval_se", {}), key: redrawn["se"]}}


def with_redraws(records: dict[str, dict[str, Any]], redraws: dict[str, dict[str, Any]]
                 ) -> dict[str, dict[str, Any]]:
  """`records` with every re-evaluated number in place of the one-draw number it steadies
  (train cells: their members' `final` metrics; probe cells: the held-out decoding score of
  each layer, trained and at step 0) and, per member, the split facts it records
  (`untrained_terms`); cells without a re-evaluation as they are."""
  out = dict(records)
  for cell, redraw in redraws.items():
    if cell not in records:
      continue
    members = []
    for m in records[cell]["members"]:
      r = redraw["members"].get(m["name"], {})
      m = dict(m, **{k: r[k] for k in ("untrained_terms",) if k in r})
      if "final" in m:
        for key in [k for k, v in r.items() if k in m["final"] and isinstance(v, dict)]:
          m.update(final=_redrawn(m["final"], r[key], key))
      for layer, d in r.get("feature_sets", {}).items():
        block = dict(m["feature_sets"][layer])
        for which in ("trained", "step0"):
          score = "macro_f1" if "macro_f1" in block[which] else "accuracy"
          inner = block[which] if score == "macro_f1" else block[which]["scores"]
          inner = _redrawn(inner, d[which], score)
          block[which] = inner if score == "macro_f1" else {**block[which], "scores": inner}
        m = dict(m, feature_sets={**m["feature_sets"], layer: block})
      members.append(m)
    out[cell] = {**records[cell], "members": members, "redraw": redraw["options"]}
  return out


def publish(results_dir: str, record: dict[str, Any], replace: bool = False) -> bool:
  """Writes `record` as its cell's file; False (nothing written) if one exists and not
  `replace`. The file appears whole or not at all."""
  data = json.dumps(record, indent=1, sort_keys=True, allow_nan=False).encode()
  if len(data) > MAX_BYTES:
    raise ValueError(f"cell {record['cell']}: {len(data):,} bytes; the limit is {MAX_BYTES:,}")
  final = path_of(results_dir, record["cell"])
  fd, tmp = tempfile.mkstemp(dir=results_dir, prefix=f".{record['cell']}.")
  try:
    os.fchmod(fd, 0o644)
    with os.fdopen(fd, "wb") as f:
      f.write(data + b"\n")
      f.flush()
      os.fsync(f.fileno())
    if replace:
      os.replace(tmp, final)
      return True
    try:
      os.link(tmp, final)  # Atomic and exclusive: never overwrites another runner's file.
      return True
    except FileExistsError:
      return False
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)


def _claim_path(results_dir: str, cell: str) -> str:
  return os.path.join(results_dir, f".{cell}.claim")


def _alive(claim: dict[str, Any]) -> bool:
  if claim.get("host") != socket.gethostname():
    return True  # Another machine's claim: cannot check, so respect it.
  try:  # Same host: alive unless its process is gone (or a zombie, unreaped).
    return lock.pid_alive(int(claim["pid"]))
  except (ValueError, KeyError, TypeError):  # A damaged claim holds nothing.
    return False


def claim(results_dir: str, cell: str) -> Optional[dict[str, Any]]:
  """Claims `cell` for this process. None on success; else the live claim that holds it."""
  path = _claim_path(results_dir, cell)
  mine = {"host": socket.gethostname(), "pid": os.getpid()}
  for _ in range(2):
    try:
      fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      try:
        with open(path) as f:
          held = json.load(f)
      except (OSError, json.JSONDecodeError):
        held = {}
      if held and _alive(held):
        return held
      os.unlink(path)  # Stale (its process is gone) or half-written: take it over.
      continue
    with os.fdopen(fd, "w") as f:
      json.dump(mine, f)
    return None
  return {"host": "?", "pid": "?"}


def release(results_dir: str, cell: str) -> None:
  try:
    os.unlink(_claim_path(results_dir, cell))
  except FileNotFoundError:
    pass
