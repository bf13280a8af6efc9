"""Read-only restore of a finished or running training run, for analysis (probing, sampling).

`restore_params(workdir, step)` rebuilds the model from the run's own `config.json` and loads
the parameters of one checkpoint onto the local devices (by default one device), whatever
mesh and number of processes wrote it: Orbax reshards onto the abstract target. It never
creates, cleans, quarantines or rewrites anything under `workdir`, so it is safe on a run
that is still training and on read-only storage.

`step=0` is the freshly initialized model of the run's seed (the untrained baseline) when
no checkpoint was saved at step 0: initialization is a pure function of the seed.

The same calls read a folder of kept final parameters (`export_params.py`: the run's
`config.json`, its members' files and `final_params/`, the parameters alone), as the campaign
keeps them beside its cell files: such a folder has one step, the run's last."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

import flax.linen as nn
import jax
import ml_collections

from hypernet_attention import errors
from hypernet_attention.runs import config_checks
from hypernet_attention.runs import run_files
from hypernet_attention.train import build
from hypernet_attention.train import checkpointing
from hypernet_attention.train import metrics as metrics_lib
from hypernet_attention.train import objectives
from hypernet_attention.train import population


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
  if not run_files.path(workdir).is_dir():
    raise ValueError(f"workdir {workdir!r} does not exist or is not a directory")
  config = run_files.read_config(workdir)
  if config is None:
    raise ValueError(f"{workdir!r} holds no {run_files.CONFIG}: not a training run "
                     "directory (pass the --workdir a training run wrote)")
  return ml_collections.ConfigDict(config).lock()


def restore_params(workdir: str, step: Optional[int] = None,
                   devices: Optional[Sequence[jax.Device]] = None,
                   member: Optional[int] = None) -> RestoredRun:
  """Parameters of checkpoint `step` (default: the newest) of the run in `workdir`;
  for a population's workdir, those of member `member` (its `config` is that member's)."""
  if member is None and (owner := population_of(workdir)) is not None:
    workdir, member = owner  # A member's directory: restore from its population.
  config, devices = _analysis_config(workdir, devices)
  if run_files.is_population(config) or member is not None:  # Its slice of the stacked state.
    directory = member_dir(workdir, member)  # Refuses a member the population does not have.
    p, step, params = _params(workdir, step, config, devices)
    return RestoredRun(workdir=directory, step=int(step), config=p.member_configs[member],
                       params=metrics_lib.member(params, member), model=p.single.model,
                       objective=p.member_objectives[member])
  s, step, params = _params(workdir, step, config, devices)
  return RestoredRun(workdir=workdir, step=step, config=config, params=params,
                     model=s.model, objective=s.objective)


def all_params(workdir: str, step: Optional[int] = None,
               devices: Optional[Sequence[jax.Device]] = None
               ) -> tuple[ml_collections.ConfigDict, int, Any]:
  """(config, step, params) of the run in `workdir` at `step` (default: the newest); for a
  population, every member's parameters stacked on a leading member axis."""
  config, devices = _analysis_config(workdir, devices)
  _, step, params = _params(workdir, step, config, devices)
  return config, step, params


def _analysis_config(workdir: str, devices: Optional[Sequence[jax.Device]]
                     ) -> tuple[ml_collections.ConfigDict, list[jax.Device]]:
  """The run's config on a plain data mesh, and the devices to restore onto (default: one)."""
  config = load_config(workdir)
  with config.unlocked():
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1))
  return config, list(devices) if devices is not None else jax.local_devices()[:1]


def _params(workdir, step, config, devices) -> tuple[Any, int, Any]:
  """(its `build.Setup`, step, params) of a single run; (its `population.PopulationSetup`,
  step, every member's parameters stacked on the leading member axis) of a population."""
  checked = config_checks.validate(config)  # The recorded config enters here.
  if checked.members:
    s = population.setup(checked, devices)
    init = lambda: population.PopulationTrainer(s).init_state().params
  else:
    s = build.setup(checked, devices)
    init = lambda: build.init_state(config, s.init_fn, s.shardings).params
  step, params = _params_at(workdir, step, s.restore_target(), init)
  return s, step, params


def _kept_params(workdir: str, step: Optional[int], target: Any,
                 init: Callable[[], Any]) -> Optional[tuple[int, Any]]:
  """(step, params) from a folder of kept final parameters; None if `workdir` is not one."""
  root = run_files.path(workdir)
  record = run_files.read_json(root / run_files.FINAL_PARAMS_RECORD)
  if record is None or (root / run_files.CHECKPOINTS).is_dir():
    return None
  kept = record.get("step") if isinstance(record, dict) else None
  if isinstance(kept, bool) or not isinstance(kept, int) or kept < 0:
    raise errors.BadInput(
        f"{root / run_files.FINAL_PARAMS_RECORD} holds {str(record)[:80]}, not a record of "
        "kept parameters; allowed: the one export_params writes ({\"step\": an integer >= 0, "
        "...}): export them again from the run's workdir (experiments/export_params.py)")
  if step is None or step == kept:
    folder = root / run_files.FINAL_PARAMS
    try:
      return kept, checkpointing.restore_saved_params(folder, target.params)
    except checkpointing.CheckpointMismatchError:
      raise
    except Exception as e:  # pylint: disable=broad-except  (Orbax's, tensorstore's)
      raise errors.BadInput(
          f"the kept parameters in '{folder}' are unreadable (a file missing or truncated: "
          f"{_first_line(e)}); allowed: export them again from the run's workdir "
          "(experiments/export_params.py)") from None
  if step == 0:
    return 0, init()
  raise ValueError(f"{workdir!r} keeps only the final parameters, of step {kept}; allowed: "
                   f"--step={kept} (or none), or --step=0 (the initialization)")


def _params_at(workdir: str, step: Optional[int], target: Any,
               init: Callable[[], Any]) -> tuple[int, Any]:
  """(step, params) of checkpoint `step` (None: the newest; 0 without a checkpoint there:
  `init()`), read-only and without the optimizer state."""
  kept = _kept_params(workdir, step, target, init)
  if kept is not None:
    return kept
  ckpt_dir = run_files.path(workdir) / run_files.CHECKPOINTS
  ckpt = (checkpointing.Checkpointer(workdir, read_only=True) if ckpt_dir.is_dir() else None)
  try:
    steps = ckpt.all_steps() if ckpt else []
    unfinished = ckpt.unfinished_steps() if ckpt else []
    if step is None:
      if not steps:
        raise ValueError(f"no checkpoints in '{ckpt_dir}'" + _unfinished_note(unfinished)
                         + " (use step=0 for the run's initialization)")
      step = steps[-1]
    if step in steps:
      try:
        return int(step), ckpt.restore_params(step, target)
      except checkpointing.CheckpointMismatchError:
        raise
      except Exception as e:  # pylint: disable=broad-except  (Orbax's, tensorstore's)
        others = [s for s in steps if s != step]
        allowed = (f"--step={others[-1]} (finalized steps {others})" if others
                   else "--step=0 (the initialization)")
        raise ValueError(
            f"checkpoint step {step} in '{ckpt_dir}' is unreadable (half-written or "
            f"corrupt: {_first_line(e)}); allowed: {allowed}") from None
    if step == 0:
      return 0, init()
    raise ValueError(f"no checkpoint at step {step} in '{ckpt_dir}'"
                     + _unfinished_note(unfinished if step in unfinished else ())
                     + f"; available steps: {steps or 'none'} (0 = the initialization), "
                     f"e.g. --step={steps[-1] if steps else 0}")
  finally:
    if ckpt is not None:
      ckpt.close()


def _first_line(e: Exception) -> str:
  """What an unreadable checkpoint's error says first (tensorstore's run to 100+ lines)."""
  first = (str(e).splitlines() or [type(e).__name__])[0]
  return first.split(" See full TensorStore details")[0][:200]


def _unfinished_note(steps: Sequence[int]) -> str:
  return (f" (step {', '.join(map(str, steps))} is half-written: its save is running or was "
          "cut off; only finalized steps can be read)" if steps else "")


def population_of(member_dir: str) -> Optional[tuple[str, int]]:
  """(population workdir, member index) when `member_dir` is a population member's
  directory (no checkpoints of its own; its parent's population lists it), else None."""
  member = run_files.path(member_dir)
  if (member / run_files.CHECKPOINTS).is_dir():
    return None
  try:
    config = run_files.read_config(member.parent)
  except ValueError:
    return None
  names = run_files.member_names(config) if config else ()
  return (str(member.parent), list(names).index(member.name)) if member.name in names else None


def member_dir(workdir: str, member: int) -> str:
  """The directory of member `member` of the population in `workdir` (its outputs)."""
  config = load_config(workdir)
  names = run_files.member_names(config)
  if (not run_files.is_population(config) or not isinstance(member, int)
      or not 0 <= member < len(names)):
    raise ValueError(f"--member={member}: {workdir!r} holds " + (
        f"a population of {len(names)} members; allowed: 0..{len(names) - 1}"
        if run_files.is_population(config) else "a single run, not a population"))
  return str(run_files.path(workdir) / names[member])
