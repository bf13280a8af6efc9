"""A run's workdir as the training code uses it: the guard (`check`) and `cached_json`.

The files themselves (names, paths local or gs://, JSON, "finished", "population") are
`run_files.py`, which needs no JAX; their names are kept here for the training code.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from etils import epath
import ml_collections

from hypernet_attention.runs.run_files import CEILINGS  # noqa: F401
from hypernet_attention.runs.run_files import CHECKPOINTS  # noqa: F401

# Re-exported: the training code reads them from here.
from hypernet_attention.runs.run_files import CONFIG  # noqa: F401
from hypernet_attention.runs.run_files import CORRUPT_CHECKPOINTS  # noqa: F401
from hypernet_attention.runs.run_files import FINAL_PARAMS  # noqa: F401
from hypernet_attention.runs.run_files import FINAL_PARAMS_RECORD  # noqa: F401
from hypernet_attention.runs.run_files import POPULATION_SUMMARY  # noqa: F401
from hypernet_attention.runs.run_files import RESUME_FREE_KEYS  # noqa: F401
from hypernet_attention.runs.run_files import SUMMARY  # noqa: F401
from hypernet_attention.runs.run_files import config_to_json  # noqa: F401
from hypernet_attention.runs.run_files import find_runs  # noqa: F401
from hypernet_attention.runs.run_files import flatten  # noqa: F401
from hypernet_attention.runs.run_files import is_finished  # noqa: F401
from hypernet_attention.runs.run_files import is_remote  # noqa: F401
from hypernet_attention.runs.run_files import path  # noqa: F401
from hypernet_attention.runs.run_files import read_config  # noqa: F401
from hypernet_attention.runs.run_files import read_json  # noqa: F401
from hypernet_attention.runs.run_files import read_summary  # noqa: F401
from hypernet_attention.runs.run_files import write_bytes  # noqa: F401
from hypernet_attention.runs.run_files import write_json  # noqa: F401
from hypernet_attention.runs.run_files import write_summary  # noqa: F401


def _is_off(value: Any) -> bool:
  """A switch added after a run started, at its off value (False, None, empty), which
  does not change that run: its config.json may lack the key and still resume."""
  return value is None or value is False or value in ((), [], "", {})


def _config_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
  old_flat, new_flat = flatten(old), flatten(new)
  return [f"{k}: {old_flat.get(k, '<missing>')!r} -> {new_flat.get(k, '<missing>')!r}"
          for k in sorted(set(old_flat) | set(new_flat))
          if old_flat.get(k, "<missing>") != new_flat.get(k, "<missing>")
          and not (k not in old_flat and _is_off(new_flat[k]))
          and k.split(".")[0] not in RESUME_FREE_KEYS]


def _check_not_inside_a_run(root: epath.Path, workdir: epath.PathLike) -> None:
  """Refuses a workdir inside another run's: a population's member directory has one
  writer, its population (a single run there would overwrite the member's summary), and a
  run's own folders (checkpoints/) are Orbax's."""
  for parent in (root.parent, root.parent.parent):
    if parent == root or not (parent / CONFIG).exists():
      continue
    try:
      recorded = read_config(parent) or {}
    except ValueError:
      recorded = {}
    population = recorded.get("population") or {}
    members = population.get("members") or ()
    names = population.get("member_names") or [f"member{i}" for i in range(len(members))]
    if members and parent == root.parent and root.name in names:
      raise ValueError(
          f"--workdir={workdir!r} is member {root.name!r} of the population in {parent}, "
          "whose run is its only writer; allowed: rerun the population (--workdir="
          f"{parent}), read the member with restore_params({str(parent)!r}, member="
          f"{list(names).index(root.name)}), or pass another --workdir")
    raise ValueError(f"--workdir={workdir!r} is inside the run in {parent} (its config.json); "
                     "allowed: a directory outside any run's workdir")


def check(workdir: epath.PathLike, config: ml_collections.ConfigDict,
          population: Optional[epath.PathLike] = None, record: bool = True) -> None:
  """Raises if `workdir` is unusable or holds another experiment's run; else records the config
  (unless `record` is False: a dry pass, so that several workdirs are all checked before
  any of them is written).

  `population`: the population's workdir when `workdir` is one of its members' (which may
  then hold nothing but what the population writes there). Call before any work: a refused
  workdir is left untouched.
  """
  root = path(workdir)
  if root.exists() and not root.is_dir():
    raise ValueError(f"--workdir={workdir!r} is a file, not a directory; pass a directory "
                     "(new or holding this run)")
  if population is None:
    _check_not_inside_a_run(root, workdir)
  elif (root / CHECKPOINTS).exists() or (root / "lock.json").exists():
    raise ValueError(f"member directory {str(root)!r} of the population in {population} "
                     "holds a single run's checkpoints or lock; allowed: move that run away "
                     "or name the member otherwise (config.population.member_names)")
  new = config_to_json(config)
  old = read_config(root)
  if old is not None:
    differ = _config_differences(old, new)
    if differ:
      raise ValueError(
          f"workdir {workdir!r} holds a different experiment ({', '.join(differ[:8])}); use a "
          f"fresh --workdir, or the same config to resume (only {list(RESUME_FREE_KEYS)} may "
          "differ)")
  elif (root / CHECKPOINTS).is_dir() and any((root / CHECKPOINTS).iterdir()):
    raise ValueError(f"workdir {workdir!r} holds checkpoints but no {CONFIG}; refusing "
                     "to mix runs: use a fresh --workdir")
  if not record:
    return
  try:
    root.mkdir(parents=True, exist_ok=True)
    if old is None:
      write_json(root / CONFIG, new)
    elif not is_remote(root) and not os.access(root, os.W_OK):
      raise PermissionError(f"[Errno 13] Permission denied: {workdir!r}")
  except OSError as e:
    raise ValueError(f"--workdir={workdir!r} is not writable ({e.strerror or e}); pass a "
                     "directory you can write to") from None


def cached_json(p: epath.PathLike, compute: Callable[[], Any], write: bool = True) -> Any:
  """`p`'s contents if it exists, else `compute()`, written to `p` if `write` (by one
  process of a multi-process run: the caller passes `jax.process_index() == 0`).

  For per-run constants (the accuracy ceilings) that a resumed run must report unchanged
  without recomputing them.
  """
  cached = read_json(p)
  if cached is not None:
    return cached
  value = compute()
  if write:
    write_json(p, value)
  return value
