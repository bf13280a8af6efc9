"""Read-only restore of a finished or running training run, for analysis (probing, sampling).

`restore_params(workdir, step)` rebuilds the model from the run's own `config.json` and loads
the parameters of one checkpoint onto the local devices (by default one device), whatever
mesh and number of processes wrote it: Orbax reshards onto the abstract target. It never
creates, cleans, quarantines or rewrites anything under `workdir`, so it is safe on a run
that is still training and on read-only storage.

`step=0` is the freshly initialized model of the run's seed (the untrained baseline) when
no checkpoint was saved at step 0: initialization is a pure function of the seed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import flax.linen as nn
import jax
import ml_collections

from hypernet_attention.train import build
from hypernet_attention.train import checkpointing
from hypernet_attention.train import objectives
from hypernet_attention.train import workdir as workdir_lib


@dataclasses.dataclass(frozen=True)
class RestoredRun:
  """What analysis needs: `model.apply({"params": params}, objective.encode(batch)[0])`."""
  workdir: str  # As given (a local path or gs://...).
  step: int
  config: ml_collections.ConfigDict
  params: Any
  model: nn.Module
  objective: objectives.Objective


def load_config(workdir: str) -> ml_collections.ConfigDict:
  """The run's `config.json` as a locked ConfigDict; one clear error if it is missing."""
  if not workdir_lib.path(workdir).is_dir():
    raise ValueError(f"workdir {workdir!r} does not exist or is not a directory")
  config = workdir_lib.read_config(workdir)
  if config is None:
    raise ValueError(f"{workdir!r} holds no {workdir_lib.CONFIG}: not a training run "
                     "directory (pass the --workdir a training run wrote)")
  return ml_collections.ConfigDict(config).lock()


def restore_params(workdir: str, step: Optional[int] = None,
                   devices: Optional[Sequence[jax.Device]] = None) -> RestoredRun:
  """Parameters of checkpoint `step` (default: the newest) of the run in `workdir`."""
  config = load_config(workdir)
  with config.unlocked():
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1))
  devices = list(devices) if devices is not None else jax.local_devices()[:1]
  s = build.setup(config, devices)
  ckpt_dir = workdir_lib.path(workdir) / workdir_lib.CHECKPOINTS
  ckpt = (checkpointing.Checkpointer(workdir, read_only=True) if ckpt_dir.is_dir()
          else None)
  try:
    steps = ckpt.all_steps() if ckpt else []
    if step is None:
      if not steps:
        raise ValueError(f"no checkpoints in '{ckpt_dir}' (use step=0 for the run's "
                         "initialization)")
      step = steps[-1]
    if step in steps:
      params = ckpt.restore_params(step, s.restore_target())
    elif step == 0:
      params = build.init_state(config, s.init_fn, s.shardings).params
    else:
      raise ValueError(f"no checkpoint at step {step} in '{ckpt_dir}'; available steps: "
                       f"{steps or 'none'} (0 = the initialization)")
  finally:
    if ckpt is not None:
      ckpt.close()
  return RestoredRun(workdir=workdir, step=int(step), config=config, params=params,
                     model=s.model, objective=s.objective)
