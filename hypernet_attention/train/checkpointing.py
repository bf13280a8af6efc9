"""Checkpoints: one Orbax `CheckpointManager` for the train state, under `<workdir>/checkpoints`.

A checkpoint holds the `TrainState` (step, params, optimizer state), a small JSON record and, for
host-side data (language modeling), every process's input-iterator position (item `data`,
`data.DataIteratorHandler`, for the seqio path; item `grain`, Grain's own handler, for the Grain
path: `data.checkpoint_item`), finalized atomically with the state. Synthetic tasks need no iterator
item: every batch is a pure function of (seed, step), so the step *is* their data position.

Resume order (`Checkpointer.restore_latest`): newest finalized step first. Its metadata is compared
with the state the code builds *before* anything is read: a different tree, shape or dtype (e.g.
code that added a parameter) is a `CheckpointMismatchError` naming the first differing leaf, and
nothing is moved. Only a step that cannot be read at all (corrupt or truncated files) is moved to
`<workdir>/corrupt_checkpoints/` (never deleted) and the next newest is tried. Orbax finalizes a
step only when it is complete (locally by renaming its temporary directory, in a bucket by a commit
marker), so a kill during a save leaves the previous steps intact.

`Checkpointer(..., read_only=True)` is the read-only path for analysis (`restore.py`): it
opens the checkpoints without creating, cleaning or moving anything, and
`Checkpointer.restore_params` reads the parameters only, not the optimizer moments.

Restore targets are abstract arrays that carry the *current* shardings, so a checkpoint
written on N devices restores on M devices."""

from __future__ import annotations

import contextlib
import errno
import os
import sys
import time
from typing import Any, Optional

from absl import logging
from etils import epath
import jax
import orbax.checkpoint as ocp

from hypernet_attention import multihost
from hypernet_attention.runs import cli
from hypernet_attention.runs import run_files
from hypernet_attention.train import data as data_lib

ITEM_HANDLERS = dict(state=ocp.StandardCheckpointHandler, meta=ocp.JsonCheckpointHandler,
                     data=data_lib.DataIteratorHandler, grain=data_lib.GrainIteratorHandler)


class CheckpointMismatchError(ValueError):
  """A readable checkpoint whose tree, shapes or dtypes differ from the state the code builds."""


def _leaf_specs(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
  """'params/layers_0/attention/query/kernel' -> (shape, dtype) for every array leaf."""
  return {jax.tree_util.keystr(path, simple=True, separator="/"):
          (tuple(leaf.shape), str(jax.numpy.dtype(leaf.dtype)))
          for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def check_compatible(saved_tree: Any, abstract_state: Any, where: str) -> None:
  """Raises `CheckpointMismatchError` naming the first leaf that differs (in tree order)."""
  saved, wanted = _leaf_specs(saved_tree), _leaf_specs(abstract_state)
  for key in [*wanted, *(k for k in saved if k not in wanted)]:
    if saved.get(key) == wanted.get(key):
      continue
    describe = lambda spec: "absent" if spec is None else f"shape {spec[0]} {spec[1]}"
    raise CheckpointMismatchError(
        f"{where} does not match the model this code builds: '{key}' is {describe(saved.get(key))} "
        f"in the checkpoint but {describe(wanted.get(key))} in the model. Nothing was moved or "
        "deleted; run the code and config that wrote it, or use a fresh --workdir")


def abstract_with_shardings(abstract_tree: Any, shardings: Any) -> Any:
  return jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_tree, shardings)


class CheckpointWriteError(RuntimeError):
  """A save failed (full disk, lost permissions, ...); finalized steps are untouched."""


def os_reason(error: BaseException) -> str:
  """The system's words for why a write failed ("No space left on device"), which tensorstore
  gives inside a long text; else the error's first line."""
  text = str(error)
  named = [os.strerror(code) for code in errno.errorcode if os.strerror(code) in text]
  return max(named, key=len) if named else (text.splitlines() or [type(error).__name__])[0][:300]


# A failed save is raised here as one `CheckpointWriteError`; Orbax also logs it from each of
# its threads, and tensorstore's late callbacks into a closed event loop print a traceback each
# (hundreds of lines for one full disk). `--verbosity=1` keeps the logs.
_SAVE_FAILURE_LOGS = ("_SignalingThread.run() raised an exception", "Handler Commit operations",
                      "Save Finalize thread (%s) failed")
logging.get_absl_logger().addFilter(lambda record: logging.get_verbosity() >= 1 or not any(
    text in str(record.msg) for text in _SAVE_FAILURE_LOGS))


def _drop_closed_loop(hook):
  return lambda u: None if str(u.exc_value) == "Event loop is closed" else hook(u)


sys.unraisablehook = _drop_closed_loop(sys.unraisablehook)


@contextlib.contextmanager
def _without_warning(prefix: str):
  """Drops Orbax's one WARNING that starts with `prefix`, keeps every other: "Given
  directory is read only", on every read-only open, which is what probing and restoring ask
  for; "Failed to get item metadata", which `restore_saved_params` raises as its error."""
  drop = lambda record: not str(record.msg).startswith(prefix)
  logger = logging.get_absl_logger()
  logger.addFilter(drop)
  try:
    yield
  finally:
    logger.removeFilter(drop)


class Checkpointer:
  """Saves every `save_every` steps (async), keeps the newest `keep`, resumes the newest;
  `read_only=True`: the read-only path (the module docstring)."""

  def __init__(self, workdir: str, *, save_every: int = 1, keep: Optional[int] = None,
               use_async: bool = True, read_only: bool = False):
    self.workdir, self.read_only = run_files.path(workdir), read_only
    self.directory = self.workdir / run_files.CHECKPOINTS
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=0 if read_only else save_every,
        max_to_keep=None if read_only else keep, create=not read_only, read_only=read_only,
        # A kill during a save leaves `<step>.orbax-checkpoint-tmp*`; remove it on start.
        cleanup_tmp_directories=not read_only, enable_async_checkpointing=use_async)
    with _without_warning("Given directory is read only"):
      self.manager = ocp.CheckpointManager(
          self.directory, options=options,
          item_handlers={name: handler() for name, handler in ITEM_HANDLERS.items()}
          | ({"state": ocp.PyTreeCheckpointHandler()} if read_only else {}))

  def save(self, step: int, state: Any, *, force: bool = False, data_iterator: Any = None) -> bool:
    """Starts saving `state` (and `data_iterator`'s position, if given) at `step` if the
    interval says so (or `force`). The iterator must be at the position of `step`.

    An earlier asynchronous save that failed is reported here (or by `wait`/`close`) as a
    `CheckpointWriteError`."""
    self.check()
    with self._write_errors(f"saving step {step}"):
      if step in self.manager.all_steps():  # Resumed exactly at a saved step.
        return False
      items = dict(state=ocp.args.StandardSave(state),
                   meta=ocp.args.JsonSave({"step": int(step), "time": time.time()}))
      if data_iterator is not None:
        name, args = data_lib.checkpoint_item(data_iterator)
        items[name] = args
      return self.manager.save(step, args=ocp.args.Composite(**items), force=force)

  @contextlib.contextmanager
  def _write_errors(self, what: str):
    try:
      yield
    except Exception as e:  # pylint: disable=broad-except
      finalized = sorted(int(d.name) for d in self.directory.iterdir() if d.name.isdigit())
      unfinished = self.unfinished_steps()  # The step that failed (Orbax reports it late).
      what = f"writing step {', '.join(map(str, unfinished))}" if unfinished else what
      raise CheckpointWriteError(
          f"checkpoint write failed while {what} in {self.directory}: {os_reason(e)}; "
          f"finalized steps {finalized or 'none'} are intact (a partial write is never "
          f"finalized): fix the cause (e.g. free disk space), then {cli.resume_hint()}") from e

  def check(self) -> None:
    """Raises `CheckpointWriteError` now if an asynchronous save has failed (called at every
    chunk boundary, so a failed save stops the run at once, not at the next save)."""
    with self._write_errors("writing an earlier step"):
      self.manager.check_for_errors()

  def all_steps(self) -> list[int]:
    return sorted(self.manager.all_steps())

  def unfinished_steps(self) -> list[int]:
    """Steps whose save began but was not finalized (being saved now, or cut off by a
    kill): Orbax's temporary step directories (in a bucket, those without a commit
    marker). `all_steps` leaves them out."""
    names = ocp.step.tmp_checkpoints(self.directory) if self.directory.exists() else []
    return sorted({int(n.split(".")[0]) for n in names if n.split(".")[0].isdigit()})

  def _check_saved(self, step: int, abstract_state: Any) -> None:
    """Raises unless the step's array metadata reads and matches `abstract_state`."""
    metadata = self.manager.item_metadata(step)["state"]
    tree = getattr(metadata, "tree", metadata)
    if tree is None:
      raise ValueError(f"no readable state metadata in step {step}")
    check_compatible(tree, abstract_state, f"checkpoint step {step} in {self.directory}")

  def restore(self, step: int, abstract_state: Any, data_iterator: Any = None) -> Any:
    """Step `step` onto `abstract_state`'s shardings; mismatches raise, nothing is moved.

    With `data_iterator`, its position is restored too; a step saved without one (or by
    a different number of processes) cannot resume a host-data run and raises."""
    self._check_saved(step, abstract_state)
    items = dict(state=self._restore_args(abstract_state))
    if data_iterator is not None:
      name, args = data_lib.checkpoint_item(data_iterator)
      position = data_lib.position_file(data_iterator)
      if not (self.directory / str(step) / name / position).exists():
        raise CheckpointMismatchError(
            f"checkpoint step {step} in {self.directory} holds no data-iterator position "
            f"{name}/{position}; allowed: resume a host-data run from its own checkpoints "
            "with the same data pipeline and number of processes")
      items[name] = args
    return self.manager.restore(step, args=ocp.args.Composite(**items))["state"]

  def restore_params(self, step: int, abstract_state: Any) -> Any:
    """Only the parameters of `step`, on `abstract_state`'s shardings: the optimizer state
    (Adam's moments, twice the parameters' size) is left unread."""
    self._check_saved(step, abstract_state)
    if not self.read_only:
      raise ValueError("restore_params reads through a Checkpointer(..., read_only=True)")
    target = abstract_state.replace(
        opt_state=jax.tree.map(lambda _: ocp.PLACEHOLDER, abstract_state.opt_state))
    return self.manager.restore(step, args=ocp.args.Composite(
        state=self._restore_args(target)))["state"].params

  def _restore_args(self, target: Any) -> ocp.args.CheckpointArgs:
    """Writable managers restore whole states (`StandardRestore`); read-only ones use the
    PyTree handler, which can leave `ocp.PLACEHOLDER` leaves unread."""
    if not self.read_only:
      return ocp.args.StandardRestore(target)
    restore_args = jax.tree.map(
        lambda x: x if x is ocp.PLACEHOLDER else ocp.checkpoint_utils.construct_restore_args(x),
        target)
    return ocp.args.PyTreeRestore(item=target, restore_args=restore_args)

  def restore_latest(self, abstract_state: Any, data_iterator: Any = None) -> Optional[Any]:
    """The newest readable checkpoint restored onto `abstract_state`'s shardings, or None.

    A checkpoint that reads but does not fit the model raises `CheckpointMismatchError`
    (nothing moved); only unreadable steps are quarantined and skipped."""
    self.manager.wait_until_finished()
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        state = self.restore(step, abstract_state, data_iterator)
      except (CheckpointMismatchError, MemoryError):
        raise
      except Exception as e:  # pylint: disable=broad-except
        # Its metadata or array files are corrupt or truncated (reads still in flight then
        # meet a closed event loop: `_drop_closed_loop`); the step is moved aside.
        self._quarantine(step, e)
        continue
      logging.info("Restored checkpoint at step %d from %s", step, run_files.shown(self.directory))
      return state
    return None

  def _quarantine(self, step: int, error: Exception) -> None:
    """Moves an unreadable step out of the way (kept for inspection, never deleted)."""
    if self.read_only:
      raise ValueError(f"checkpoint step {step} in {self.directory} is unreadable")
    reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
    logging.warning("Checkpoint at step %d is unreadable (%s); moving it to "
                    "corrupt_checkpoints/ and trying an older one", step, reason)
    if jax.process_index() == 0:
      src = self.directory / str(step)
      dst_dir = self.workdir / run_files.CORRUPT_CHECKPOINTS
      dst_dir.mkdir(parents=True, exist_ok=True)
      name = f"{step}-{int(time.time())}"
      # Why it was moved. It also makes the folder exist in a bucket (which has no empty
      # folders), where epath's rename needs it.
      (dst_dir / f"{name}.txt").write_text(reason + "\n")
      if src.exists():  # In a bucket a "move" is a copy and a delete, object by object.
        src.rename(dst_dir / name)
    multihost.sync(f"quarantine_{step}")
    self.manager.reload()

  def should_save(self, step: int) -> bool:
    """Whether `save(step, ...)` would write (the save interval, not already saved)."""
    return step not in self.manager.all_steps() and self.manager.should_save(step)

  def latest_step(self) -> Optional[int]:
    return self.manager.latest_step()

  def saving(self) -> bool:
    """Whether an asynchronous save is still being written."""
    return self.manager.is_saving_in_progress()

  def wait(self) -> None:
    with self._write_errors("finishing the last save"):
      self.manager.wait_until_finished()

  def close(self) -> None:
    try:
      self.wait()
    finally:
      self.manager.close()


def save_params(directory: epath.PathLike, params: Any) -> None:
  """Writes `params` alone as an Orbax checkpoint at `directory` (which must not exist):
  what a finished run keeps of itself (`export_params.py`), a third of its train state."""
  checkpointer = ocp.StandardCheckpointer()
  try:
    checkpointer.save(epath.Path(directory), params)
    checkpointer.wait_until_finished()
  finally:
    checkpointer.close()


def restore_saved_params(directory: epath.PathLike, abstract_params: Any) -> Any:
  """The params checkpoint at `directory` onto `abstract_params`' shapes and shardings; a
  tree, shape or dtype that differs is a `CheckpointMismatchError` naming the first leaf."""
  checkpointer = ocp.StandardCheckpointer()
  try:
    with _without_warning("Failed to get item metadata"):
      metadata = checkpointer.metadata(epath.Path(directory))
    saved = getattr(metadata, "item_metadata", metadata)
    if saved is None:  # Orbax logged a warning and returned the step's metadata alone.
      raise ValueError("no readable tree metadata (_METADATA, manifest.ocdbt or d/)")
    check_compatible(getattr(saved, "tree", saved), abstract_params,
                     f"the kept parameters in {directory}")
    return checkpointer.restore(epath.Path(directory), abstract_params)
  finally:
    checkpointer.close()
