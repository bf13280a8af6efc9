"""Checkpoints: one Orbax `CheckpointManager` for the train state, and the workdir guard.

A checkpoint holds the `TrainState` (step, params, optimizer state) and a small JSON record.
Nothing else is needed to resume exactly: every training batch is a pure function of
(seed, step), so the step *is* the data-iterator position.

Resume order (`Checkpointer.restore_latest`): newest finalized step first; if it cannot be
read (corrupt or partial files), it is moved to `<workdir>/corrupt_checkpoints/` and the
next newest is tried. Orbax writes each step into a temporary directory and renames it when
complete, so a kill during a save leaves the previous steps intact.

Restore targets are abstract arrays that carry the *current* shardings, so a checkpoint
written on N devices restores on M devices.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Optional

from absl import logging
import jax
from jax.experimental import multihost_utils
import ml_collections
import orbax.checkpoint as ocp

CONFIG_FILE = "config.json"
CHECKPOINT_DIR = "checkpoints"
# Config keys that may change between a run and its resumption (they do not change
# results): where to stop this invocation, and the device layout.
RESUME_FREE_KEYS = ("stop_after_steps", "mesh")


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
  if isinstance(tree, dict):
    out = {}
    for k, v in tree.items():
      out.update(flatten(v, f"{prefix}{k}."))
    return out
  return {prefix[:-1]: tree}


def config_to_json(config: ml_collections.ConfigDict) -> dict[str, Any]:
  return json.loads(config.to_json_best_effort(sort_keys=True))


def check_workdir(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Raises if `workdir` holds another experiment's run; otherwise records the config.

  Call before any work: a foreign workdir is left untouched.
  """
  path = os.path.join(workdir, CONFIG_FILE)
  new = config_to_json(config)
  if os.path.exists(path):
    with open(path) as f:
      old = json.load(f)
    old_flat, new_flat = flatten(old), flatten(new)
    differ = sorted(
        k for k in set(old_flat) | set(new_flat)
        if old_flat.get(k, "<missing>") != new_flat.get(k, "<missing>")
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
  if jax.process_index() == 0 and not os.path.exists(path):
    os.makedirs(workdir, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
      json.dump(new, f, indent=2, sort_keys=True)
    os.replace(tmp, path)  # Atomic: never a half-written config.json.
  multihost_utils.sync_global_devices("check_workdir")


def abstract_with_shardings(abstract_tree: Any, shardings: Any) -> Any:
  return jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_tree, shardings)


class Checkpointer:
  """Saves every `save_every` steps (async), keeps the newest `keep`, resumes the newest."""

  def __init__(self, workdir: str, *, save_every: int, keep: int, use_async: bool = True):
    self.workdir = workdir
    self.directory = os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))
    options = ocp.CheckpointManagerOptions(
        save_interval_steps=save_every, max_to_keep=keep, create=True,
        # A kill during a save leaves `<step>.orbax-checkpoint-tmp*`; remove it on start.
        cleanup_tmp_directories=True, enable_async_checkpointing=use_async)
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def save(self, step: int, state: Any, *, force: bool = False) -> bool:
    """Starts saving `state` at `step` if the interval says so (or `force`)."""
    if step in self.manager.all_steps():  # Resumed exactly at a saved step.
      return False
    args = ocp.args.Composite(
        state=ocp.args.StandardSave(state),
        meta=ocp.args.JsonSave({"step": int(step), "time": time.time()}))
    return self.manager.save(step, args=args, force=force)

  def restore_latest(self, abstract_state: Any) -> Optional[Any]:
    """The newest readable checkpoint restored onto `abstract_state`'s shardings, or None."""
    self.manager.wait_until_finished()
    for step in sorted(self.manager.all_steps(), reverse=True):
      try:
        restored = self.manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))
        logging.info("Restored checkpoint at step %d from %s", step, self.directory)
        return restored["state"]
      except Exception as e:  # pylint: disable=broad-except
        logging.warning("Checkpoint at step %d is unreadable (%s: %s); trying an older one",
                        step, type(e).__name__, e)
        self._quarantine(step)
    return None

  def _quarantine(self, step: int) -> None:
    """Moves an unreadable step out of the way (kept for inspection, never deleted)."""
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
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()
