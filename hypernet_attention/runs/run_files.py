"""A run's files, on local disk or in a bucket (`gs://b/run`), without JAX.

File names, the `~` / gs:// path step, JSON reads and atomic writes, "is this a finished run", "is
this a population" and its members' names, the `--workdir` / output-path checks and the workdir
guard (`check`: config.json must match to resume): what the training code, the launchers (`launch/`,
which run where JAX is not installed) and `collect` share. In a multi-process run the training loop
lets process 0 write (`check(record=...)`).

All workdir I/O goes through `etils.epath`, so a pod's hosts can share one workdir in a
bucket: `path("gs://b/run")` stays a bucket path (no `os.path.abspath`, which would make it
`<cwd>/gs:/b/run`), `path("~/runs/x")` is expanded. Orbax takes the same paths (its arrays
go through tensorstore's own GCS driver).

For `gs://`, epath is pointed at fsspec/gcsfs rather than TensorFlow's `tf.io.gfile`
(`EPATH_USE_TF=false` unless the environment sets it), so a bucket workdir never loads
TensorFlow, which only the language-model data needs. gcsfs's directory-listing cache is
turned off: other processes and hosts write the same workdir (a resumed run, a probe, Orbax
on every host), and a cached listing would hide their files.

JSON files are written whole or not at all: locally through a temporary file renamed over the target
(a rename is atomic on one file system); in a bucket one object write is already atomic (the object
appears only when its upload completes), and a rename there would be a copy plus a delete."""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any, Optional, Sequence

# Before any gs:// path picks its backend (the choice is cached on first use).
os.environ.setdefault("EPATH_USE_TF", "false")
from etils import epath
import fsspec
import ml_collections

fsspec.config.conf.setdefault("gcs", {}).setdefault("use_listings_cache", False)

from hypernet_attention import errors

_BUCKET_WARNINGS: set[tuple[int, str]] = set()  # (line, bucket) of the gcsfs warnings shown.


def _once_per_bucket(record: logging.LogRecord) -> bool:
  """gcsfs warns that it cannot tell a bucket's type (no storage-layout permission, an
  emulator) once per file it opens: hundreds of identical lines a run. One per bucket
  and kind of warning says the same."""
  match = re.search(r"(?:Bucket|bucket name) ([^\s:]+)", record.getMessage())
  if record.levelno < logging.WARNING or "bucket type" not in record.getMessage() or not match:
    return True
  key = (record.lineno, match.group(1))
  shown_before = key in _BUCKET_WARNINGS
  _BUCKET_WARNINGS.add(key)
  return not shown_before


logging.getLogger("gcsfs").addFilter(_once_per_bucket)

CONFIG = "config.json"  # The run's config; what a resume must match.
SUMMARY = "summary.json"  # Written once, when the run finished.
CHECKPOINTS = "checkpoints"  # Orbax's steps.
# A finished run's final parameters alone (no optimizer state), as `export_params` keeps them
# beside a campaign's cell files: an Orbax checkpoint of the params tree (stacked over the
# members for a population) and a record of its step. `restore_params` reads such a folder.
FINAL_PARAMS = "final_params"
FINAL_PARAMS_RECORD = "final_params.json"
CORRUPT_CHECKPOINTS = "corrupt_checkpoints"  # Unreadable steps moved aside, never deleted.
CEILINGS = "accuracy_ceilings.json"  # SRAVEN's per-split accuracy ceilings, estimated once.
# Config keys that may change between a run and its resumption (they do not change
# results): where to stop this invocation, the device layout, NaN hunting, the chunk bound.
RESUME_FREE_KEYS = ("stop_after_steps", "mesh", "debug_nans", "preemption_grace_s")
POPULATION_SUMMARY = "population_summary.json"  # Members' names, frozen members, throughput.
# Settings a population member may set: each is data (a key, a table, a traced scalar),
# not code (`population.py`); the launchers group sweep points by the other keys.
MEMBER_KEYS = ("seed", "task.split_seed", "optimizer.learning_rate",
               "optimizer.weight_decay", "optimizer.warmup_steps")
# Member i's directory where `population.member_names` is not set: one rule for the writer
# (config_checks.check_member_names) and every reader (`member_names`).
MEMBER_NAME = "member{}"


def is_remote(p: epath.PathLike) -> bool:
  """Whether `p` names an object store (`gs://`, `s3://`, ...) rather than local disk."""
  return "://" in os.fspath(p)


def shown(p: epath.PathLike) -> str:
  """`p` as the console prints it: relative to the current directory where it lies below
  it (as --workdir usually does), else as it is (absolute, a bucket path)."""
  text = os.fspath(p)
  if is_remote(text):
    return text
  try:
    relative = os.path.relpath(text)
  except OSError:  # The current directory was removed: a log line must not end the run.
    return text
  return text if relative == ".." or relative.startswith(".." + os.sep) else relative


# A bucket path: gs://<bucket>/<object path>, with GCS's bucket naming rules (lowercase
# letters, digits, '-', '_', '.'; starting and ending with a letter or digit) and no empty,
# '.' or '..' part (an object store keeps them literally: `gs://b/x/../y` is no `gs://b/y`).
BUCKET_PATH = re.compile(r"gs://[a-z0-9]([a-z0-9._-]{0,220}[a-z0-9])?(/[^/]+)*/?")
SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def check_bucket_path(path: str, flag: str = "--workdir") -> str:
  """`path` if it is a local path or a well-formed gs:// path; `BadInput` for a malformed
  bucket path (`gs://`, `gs:///x`, `gs:/b/x`, `GS://b/x`, `s3://...`), which would
  otherwise name an odd bucket or a local folder called `gs:`."""
  text = str(path)
  looks_remote = "://" in text or (SCHEME.match(text.strip()) is not None
                                    and text.strip()[:3].lower() == "gs:")
  if not looks_remote:
    return text
  parts = text[5:].split("/")
  if not BUCKET_PATH.fullmatch(text) or any(p in (".", "..") for p in parts[1:]):
    raise errors.BadInput(f"{flag}={text!r} is not a valid bucket path; allowed: "
                          "gs://<bucket>/<path> (lowercase gs://, a bucket of lowercase letters, "
                          "digits, '-', '_' or '.', no empty, '.' or '..' parts), or a local path")
  return text


def path(workdir: epath.PathLike, flag: str = "--workdir") -> epath.Path:
  """`workdir` as an epath: bucket paths as given, local paths with `~` expanded, absolute.

  `BadInput` (naming `flag`) for a malformed bucket path (`check_bucket_path`) and for a
  bucket path without gcsfs installed."""
  text = check_bucket_path(os.fspath(workdir), flag)
  if is_remote(text):
    try:
      import gcsfs  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    except ImportError:
      raise errors.BadInput(f"{flag}={text!r} is in a bucket, which needs gcsfs (not "
                            "installed); allowed: pip install 'hypernet-attention[gcs]', or "
                            "a local path") from None
    check_credentials(text, flag)
    return epath.Path(text)
  return epath.Path(os.path.abspath(os.path.expanduser(text)))


_CREDENTIALS_FOUND: set[str] = set()  # Buckets whose credentials this process has found.


def check_credentials(bucket_path: str, flag: str = "--workdir") -> None:
  """`BadInput` at once when no Google Cloud credentials are found for a gs:// path.

  Without credentials gcsfs falls back to anonymous access, whose first write fails only after its
  retries (a minute and more; without a network, a DNS traceback). This asks google-auth for the
  application default credentials (environment, gcloud's application-default file, a Cloud VM's
  metadata server), as gcsfs does first. Skipped for an emulator (`STORAGE_EMULATOR_HOST`) and when
  fsspec's gcs config names a token (e.g. `FSSPEC_GCS_TOKEN=anon` to read a public bucket)."""
  bucket = bucket_path[len("gs://"):].split("/")[0]
  if (bucket in _CREDENTIALS_FOUND or os.environ.get("STORAGE_EMULATOR_HOST")
      or fsspec.config.conf.get("gcs", {}).get("token") is not None):
    return
  import google.auth  # pylint: disable=g-import-not-at-top  (gcsfs's own dependency)
  from google.auth import exceptions  # pylint: disable=g-import-not-at-top
  try:
    google.auth.default()
  except exceptions.DefaultCredentialsError:
    raise errors.BadInput(
        f"{flag}={bucket_path!r} is in a bucket, but no Google Cloud credentials were found; "
        "allowed: `gcloud auth application-default login`, GOOGLE_APPLICATION_CREDENTIALS="
        "<service account key .json>, a Cloud VM's service account, or a local path") from None
  _CREDENTIALS_FOUND.add(bucket)


def file_in_the_way(p: epath.PathLike) -> Optional[epath.Path]:
  """The existing file at `p` or nearest above it (which stops `p` from being a folder or
  from being created), else None. Buckets have none: a prefix is no file."""
  p = epath.Path(p)
  if is_remote(p):
    return None
  for above in (p, *p.parents):
    if above.exists():
      return None if above.is_dir() else above
  return None


def check_output_dir(directory: epath.PathLike, flag: str) -> epath.Path:
  """`directory` (as `path` makes it) if it is a folder or can become one; `BadInput`,
  before any work, when it is an existing file or lies below one."""
  out = path(directory, flag)
  blocker = file_in_the_way(out)
  if blocker is not None:
    raise errors.BadInput(
        f"{flag}={os.fspath(directory)!r} " + ("is a file" if blocker == out else
                                              f"is below the file {os.fspath(blocker)!r}")
        + "; allowed: a folder (new or existing)")
  return out


def write_bytes(p: epath.PathLike, data: bytes) -> None:
  """Writes `data` to `p` atomically: readers see the old file or the new one, never half."""
  p = epath.Path(p)
  if is_remote(p):
    p.write_bytes(data)  # One object upload: atomic by itself.
    return
  tmp = p.with_name(p.name + ".tmp")
  try:
    tmp.write_bytes(data)
    tmp.replace(p)
  except OSError as e:  # A full disk: the old file stays whole, the partial one goes.
    tmp.unlink(missing_ok=True)
    raise OSError(e.errno, e.strerror, os.fspath(p)) from e  # A write's error names no file.


def write_json(p: epath.PathLike, data: Any, indent: int = 2) -> None:
  write_bytes(p, json.dumps(data, indent=indent, sort_keys=True).encode())


def read_json(p: epath.PathLike) -> Optional[Any]:
  """The parsed file, None if it does not exist; a clear error if it is not JSON."""
  p = epath.Path(p)
  if not p.exists():
    return None
  try:
    return json.loads(p.read_text())
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise errors.BadInput(f"{p} is not readable JSON ({e}); it was left as it is: restore "
                          "or remove it") from None


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
  """{'a': {'b': 1}} -> {'a.b': 1}."""
  if isinstance(tree, dict):
    return {key: leaf for k, v in tree.items() for key, leaf in flatten(v, f"{prefix}{k}.").items()}
  return {prefix[:-1]: tree}


def config_to_json(config: Any) -> dict[str, Any]:
  return json.loads(config.to_json_best_effort(sort_keys=True))


def is_population(config: Any) -> bool:
  """Whether `config` (a ConfigDict, or a recorded config.json's dict) is a population: any
  `population.members` set (of any shape: `config_checks.check_population` names a bad one)."""
  population = config.get("population")
  return bool(population and population.get("members"))


def member_names(config: Any) -> tuple[str, ...]:
  """Each member's subdirectory name: `population.member_names`, or member0, member1, ...
  (empty: a single run)."""
  if not is_population(config):
    return ()
  population = config["population"]
  names = tuple(population.get("member_names") or ())
  return names or tuple(MEMBER_NAME.format(i) for i in range(len(population["members"])))


def is_finished(workdir: epath.PathLike) -> bool:
  """A run with its summary, or a population whose every member has one (the members
  named by its population_summary.json, written with every checkpoint)."""
  root = path(workdir)
  if (root / SUMMARY).exists():
    return True
  names = (read_json(root / POPULATION_SUMMARY) or {}).get("members", [])
  return bool(names) and all((root / n / SUMMARY).exists() for n in names)


def read_config(workdir: epath.PathLike) -> Optional[dict[str, Any]]:
  """The run's recorded config, None if there is none; a clear error if it is corrupt."""
  p = path(workdir) / CONFIG
  config = read_json(p)
  if config is not None and (not isinstance(config, dict) or "experiment" not in config):
    raise errors.BadInput(f"{p} is not a hypernet-attention config (no 'experiment' key); it "
                          "was left as it is: use a fresh --workdir")
  return config


def read_summary(workdir: epath.PathLike) -> Optional[dict[str, Any]]:
  """The finished run's summary, None while it is unfinished."""
  return read_json(path(workdir) / SUMMARY)


def write_summary(workdir: epath.PathLike, summary: dict[str, Any]) -> None:
  write_json(path(workdir) / SUMMARY, summary)


def find_runs(root: epath.PathLike) -> list[epath.Path]:
  """Every workdir at or below `root` (a directory holding config.json; for a population,
  its members' directories), sorted.

  Does not descend into a workdir (its checkpoints hold many files: many listings in a
  bucket); lists directories itself, since epath's `walk` drops the `gs://` prefix."""
  root = path(root)
  if (root / CONFIG).exists():
    try:
      recorded = read_config(root) or {}
    except ValueError:
      return [root]  # Unreadable: the caller names it.
    if not is_population(recorded):
      return [root]
    # A population's runs are its members (`population_loop.py`), one level down.
    return [child for child in sorted(root.iterdir(), key=str)
            if child.name != CHECKPOINTS and (child / CONFIG).exists()]
  return [run for child in sorted(root.iterdir(), key=str) if child.is_dir()
          for run in find_runs(child)]


def workdir_path(workdir: Optional[str]) -> str:
  """`--workdir` as the run will use it: `~` expanded; empty, blank or a malformed gs://
  path refused."""
  if workdir is None or not str(workdir).strip():
    raise errors.BadInput(f"--workdir={workdir!r}; allowed: a directory path (new, or holding this "
                   "run); leave the flag out for a fresh one under ./workdirs/")
  return os.path.expanduser(check_bucket_path(str(workdir)))


def output_path(path: Optional[str], flag: str, *, overwrite: bool = False) -> str:
  """An output file's path (`~` expanded); refused if missing, a folder, below a file, or
  existing without `--overwrite` (a tool never replaces a file silently)."""
  if path is None or not str(path).strip():
    raise errors.BadInput(f"{flag}={path!r}; allowed: the path of the file to write")
  path = os.path.expanduser(str(path))
  target = epath.Path(path)
  if target.is_dir():
    raise errors.BadInput(f"{flag}={path!r} is a directory; allowed: a file path")
  if target.exists() and not overwrite:
    raise errors.BadInput(f"{flag}={path!r} exists; allowed: a new path, or --overwrite to "
                          "replace it")
  blocker = file_in_the_way(target.parent)
  if blocker is not None:
    raise errors.BadInput(f"{flag}={path!r} is below the file {os.fspath(blocker)!r}; allowed: a "
                   "path in a folder")
  return path


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
    names = member_names(recorded)
    if parent == root.parent and root.name in names:
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
  workdir is left untouched."""
  root = path(workdir)
  blocker = file_in_the_way(root)
  if blocker is not None:  # Found in the dry pass, before any compilation.
    where = ("is a file, not a directory" if blocker == root else
             f"is not writable (below the file {os.fspath(blocker)!r})")
    raise ValueError(f"--workdir={workdir!r} {where}; pass a directory (new or holding this run)")
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


def check_run_dirs(workdir: epath.PathLike, config: ml_collections.ConfigDict,
                   members: Sequence[tuple[str, ml_collections.ConfigDict]] = (),
                   record: bool = True) -> None:
  """`check` for a run's workdir and, for a population, each member's directory (`members`:
  (name, config) pairs): all pass before any config.json is recorded (`record`: then
  recorded; else a dry pass). A single run's one directory needs no dry pass first."""
  for this_pass in (False, True) if record and members else (record,):
    check(workdir, config, record=this_pass)
    for name, member in members:
      check(str(path(workdir) / name), member, population=workdir, record=this_pass)
