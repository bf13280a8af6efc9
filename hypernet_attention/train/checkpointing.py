"""Checkpoints: one Orbax `CheckpointManager` for the train state, and the workdir guard.

A checkpoint holds the `TrainState` (step, params, optimizer state), a small JSON record and,
for host-side data (language modeling), every process's input-iterator position (item
`data`, `data.DataIteratorHandler`), finalized atomically with the state. Synthetic tasks
need no iterator item: every batch is a pure function of (seed, step), so the step *is*
their data position.

Resume order (`Checkpointer.restore_latest`): newest finalized step first. Its metadata is
compared with the state the code builds *before* anything is read: a different tree, shape or
dtype (e.g. code that added a parameter) is a `CheckpointMismatchError` naming the first
differing leaf, and nothing is moved. Only a step that cannot be read at all (corrupt or
truncated files) is moved to `<workdir>/corrupt_checkpoints/` (never deleted) and the next
newest is tried. Orbax writes each step into a temporary directory and renames it when
complete, so a kill during a save leaves the previous steps intact.

`restore_params(workdir, step)` is the read-only path for analysis (probing): it opens the
checkpoints without creating, cleaning or moving anything.

Restore targets are abstract arrays that carry the *current* shardings, so a checkpoint
written on N devices restores on M devices.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, Optional

from absl import logging
import jax
from jax.experimental import multihost_utils
import ml_collections
import orbax.checkpoint as ocp

from hypernet_attention.train import data as data_lib

CONFIG_FILE = "config.json"
ITEM_HANDLERS = dict(state=ocp.StandardCheckpointHandler, meta=ocp.JsonCheckpointHandler,
                     data=data_lib.DataIteratorHandler)
CHECKPOINT_DIR = "checkpoints"
# Config keys that may change between a run and its resumption (they do not change
# results): where to stop this invocation, the device layout, NaN hunting.
RESUME_FREE_KEYS = ("stop_after_steps", "mesh", "debug_nans")


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
  if isinstance(tree, dict):
    out = {}
    for k, v in tree.items():
      out.update(flatten(v, f"{prefix}{k}."))
    return out
  return {prefix[:-1]: tree}


def config_to_json(config: ml_collections.ConfigDict) -> dict[str, Any]:
  return json.loads(config.to_json_best_effort(sort_keys=True))


def read_config_json(workdir: str) -> Optional[dict[str, Any]]:
  """The run's recorded config, None if there is none; a clear error if it is corrupt."""
  path = os.path.join(workdir, CONFIG_FILE)
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      config = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ValueError(f"{path} is not readable JSON ({e}); it was left as it is: restore it "
                     "or use a fresh --workdir") from None
  if not isinstance(config, dict) or "experiment" not in config:
    raise ValueError(f"{path} is not a hypernet-attention config (no 'experiment' key); it "
                     "was left as it is: use a fresh --workdir")
  return config


def _is_off(value: Any) -> bool:
  """A switch added after a run started, at its off value (False, None, empty), which
  does not change that run: its config.json may lack the key and still resume."""
  return value is None or value is False or value in ((), [], "", {})


def check_workdir(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Raises if `workdir` is unusable or holds another experiment's run; else records the config.

  Call before any work: a refused workdir is left untouched.
  """
  path = os.path.join(workdir, CONFIG_FILE)
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f"--workdir={workdir!r} is a file, not a directory; pass a directory "
                     "(new or holding this run)")
  new = config_to_json(config)
  old = read_config_json(workdir)
  if old is not None:
    old_flat, new_flat = flatten(old), flatten(new)
    differ = sorted(
        k for k in set(old_flat) | set(new_flat)
        if old_flat.get(k, "<missing>") != new_flat.get(k, "<missing>")
        and not (k not in old_flat and _is_off(new_flat[k]))
        and k.split(".")[0] not in RESUME_FREE_KEYS)
    if differ:
      details = ", ".join(f"{k}: {old_flat.get(k, '<missing>')!r} -> "
                          f"{new_flat.get(k, '<missing>')!r}" for k in differ[:8])
      raise ValueError(
          f"workdir {workdir!r} holds a different experiment ({details}); use a fresh "
          f"--workdir, or the same config to resume (only {list(RESUME_FREE_KEYS)} may differ)")
  else:
    ckpt_dir = os.path.join(workdir, CHECKPOINT_DIR)
    if os.path.isdir(ckpt_dir) and os.listdir(ckpt_dir):
      raise ValueError(f"workdir {workdir!r} holds checkpoints but no {CONFIG_FILE}; refusing "
                       "to mix runs: use a fresh --workdir")
  if jax.process_index() == 0:
    try:
      os.makedirs(workdir, exist_ok=True)
      if old is None:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
          json.dump(new, f, indent=2, sort_keys=True)
        os.replace(tmp, path)  # Atomic: never a half-written config.json.
      elif not os.access(workdir, os.W_OK):
        raise PermissionError(f"[Errno 13] Permission denied: {workdir!r}")
    except OSError as e:
      raise ValueError(f"--workdir={workdir!r} is not writable ({e.strerror or e}); pass a "
                       "directory you can write to") from None
  multihost_utils.sync_global_devices("check_workdir")


class CheckpointMismatchError(ValueError):
  """A readable checkpoint whose tree, shapes or dtypes differ from the state the code builds."""


def _leaf_specs(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
  """'params/layers_0/attention/query/kernel' -> (shape, dtype) for every array leaf."""
  def name(key):
    for attr in ("key", "name", "idx"):
      if hasattr(key, attr):
        return str(getattr(key, attr))
    return str(key)
  return {"/".join(name(k) for k in path): (tuple(leaf.shape), str(jax.numpy.dtype(leaf.dtype)))
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def check_compatible(saved_tree: Any, abstract_state: Any, where: str) -> None:
  """Raises `CheckpointMismatchError` naming the first leaf that differs (in tree order)."""
  saved, wanted = _leaf_specs(saved_tree), _leaf_specs(abstract_state)
  for key in [*wanted, *(k for k in saved if k not in wanted)]:
    if saved.get(key) == wanted.get(key):
      continue
    describe = lambda spec: "absent" if spec is None else f"shape {spec[0]} {spec[1]}"
    raise CheckpointMismatchError(
        f"{where} does not match the model this code builds: '{key}' is "
        f"{describe(saved.get(key))} in the checkpoint but {describe(wanted.get(key))} in the "
        "model. Nothing was moved or deleted; run the code and config that wrote it, or use a "
        "fresh --workdir")


def abstract_with_shardings(abstract_tree: Any, shardings: Any) -> Any:
  return jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_tree, shardings)


class CheckpointWriteError(RuntimeError):
  """A save failed (full disk, lost permissions, ...); finalized steps are untouched."""


@contextlib.contextmanager
def _without_read_only_warning():
  """Orbax warns "Given directory is read only" on every read-only open, which is what
  probing and restoring ask for: drop that one WARNING, keep every other."""
  drop = lambda record: not str(record.msg).startswith("Given directory is read only")
  logger = logging.get_absl_logger()
  logger.addFilter(drop)
  try:
    yield
  finally:
    logger.removeFilter(drop)


class Checkpointer:
  """Saves every `save_every` steps (async), keeps the newest `keep`, resumes the newest.

  `read_only=True` opens existing checkpoints for restoring only: no directory is created,
  no temporary directory cleaned, nothing quarantined.
  """

  def __init__(self, workdir: str, *, save_every: int = 1, keep: Optional[int] = None,
               use_async: bool = True, read_only: bool = False):
    self.workdir, self.read_only = workdir, read_only
    self.directory = os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=0 if read_only else save_every,
        max_to_keep=None if read_only else keep, create=not read_only, read_only=read_only,
        # A kill during a save leaves `<step>.orbax-checkpoint-tmp*`; remove it on start.
        cleanup_tmp_directories=not read_only, enable_async_checkpointing=use_async)
    with _without_read_only_warning():
      self.manager = ocp.CheckpointManager(
          self.directory, options=options,
          item_handlers={name: handler() for name, handler in ITEM_HANDLERS.items()})

  def save(self, step: int, state: Any, *, force: bool = False,
           data_iterator: Any = None) -> bool:
    """Starts saving `state` (and `data_iterator`'s position, if given) at `step` if the
    interval says so (or `force`). The iterator must be at the position of `step`.

    An earlier asynchronous save that failed is reported here (or by `wait`/`close`) as a
    `CheckpointWriteError`.
    """
    with self._write_errors(f"saving step {step}"):
      self.manager.check_for_errors()
      if step in self.manager.all_steps():  # Resumed exactly at a saved step.
        return False
      items = dict(state=ocp.args.StandardSave(state),
                   meta=ocp.args.JsonSave({"step": int(step), "time": time.time()}))
      if data_iterator is not None:
        items["data"] = data_lib.DataIteratorArgs(data_iterator)
      return self.manager.save(step, args=ocp.args.Composite(**items), force=force)

  @contextlib.contextmanager
  def _write_errors(self, what: str):
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except
      finalized = sorted(int(d) for d in os.listdir(self.directory) if d.isdigit())
      first_line = (str(e).splitlines() or [type(e).__name__])[0][:300]
      raise CheckpointWriteError(
          f"checkpoint write failed while {what} in {self.directory} ({first_line}); "
          f"finalized steps {finalized or 'none'} are intact (a partial write is never "
          "finalized): fix the cause (e.g. free disk space) and rerun the same command to "
          "resume") from e

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def _saved_tree(self, step: int) -> Any:
    """The step's array metadata tree; raises if its metadata cannot be read."""
    metadata = self.manager.item_metadata(step)["state"]
    tree = getattr(metadata, "tree", metadata)
    if tree is None:
      raise ValueError(f"no readable state metadata in step {step}")
    return tree

  def restore(self, step: int, abstract_state: Any, data_iterator: Any = None) -> Any:
    """Step `step` onto `abstract_state`'s shardings; mismatches raise, nothing is moved.

    With `data_iterator`, its position is restored too; a step saved without one (or by
    a different number of processes) cannot resume a host-data run and raises.
    """
    check_compatible(self._saved_tree(step), abstract_state,
                     f"checkpoint step {step} in {self.directory}")
    items = dict(state=ocp.args.StandardRestore(abstract_state))
    if data_iterator is not None:
      position = data_iterator.path(os.path.join(self.directory, str(step), "data"))
      if not os.path.exists(position + ".index"):
        raise CheckpointMismatchError(
            f"checkpoint step {step} in {self.directory} holds no data-iterator position "
            f"{os.path.basename(position)!r}; allowed: resume a host-data run from its own "
            "checkpoints with the same number of processes")
      items["data"] = data_lib.DataIteratorArgs(data_iterator)
    return self.manager.restore(step, args=ocp.args.Composite(**items))["state"]

  def restore_latest(self, abstract_state: Any, data_iterator: Any = None) -> Optional[Any]:
    """The newest readable checkpoint restored onto `abstract_state`'s shardings, or None.

    A checkpoint that reads but does not fit the model raises `CheckpointMismatchError`
    (nothing moved); only unreadable steps are quarantined and skipped.
    """
    self.manager.wait_until_finished()
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        state = self.restore(step, abstract_state, data_iterator)
      except (CheckpointMismatchError, MemoryError):
        raise
      except Exception as e:  # pylint: disable=broad-except
        self._unreadable(step, e)  # Its metadata or array files are corrupt or truncated.
        continue
      logging.info("Restored checkpoint at step %d from %s", step, self.directory)
      return state
    return None

  def _unreadable(self, step: int, error: Exception) -> None:
    logging.warning("Checkpoint at step %d is unreadable (%s: %s); moving it to "
                    "corrupt_checkpoints/ and trying an older one", step,
                    type(error).__name__, str(error).splitlines()[0] if str(error) else "")
    self._quarantine(step)

  def _quarantine(self, step: int) -> None:
    """Moves an unreadable step out of the way (kept for inspection, never deleted)."""
    if self.read_only:
      raise ValueError(f"checkpoint step {step} in {self.directory} is unreadable")
    if jax.process_index() == 0:
      src = os.path.join(self.directory, str(step))
      dst_dir = os.path.join(self.workdir, "corrupt_checkpoints")
      os.makedirs(dst_dir, exist_ok=True)
      if os.path.exists(src):
        os.replace(src, os.path.join(dst_dir, f"{step}-{int(time.time())}"))
    multihost_utils.sync_global_devices(f"quarantine_{step}")
    self.manager.reload()

  def should_save(self, step: int) -> bool:
    """Whether `save(step, ...)` would write (the save interval, not already saved)."""
    return step not in self.manager.all_steps() and self.manager.should_save(step)

  def latest_step(self) -> Optional[int]:
    return self.manager.latest_step()

  def wait(self) -> None:
    with self._write_errors("finishing the last save"):
      self.manager.wait_until_finished()

  def close(self) -> None:
    try:
      self.wait()
    finally:
      self.manager.close()
