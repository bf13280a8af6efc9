"""The one registry of experiments: one `Experiment` record per `config.experiment` name.

Everything that differs between experiments and is not in the config file sits in its
record, and everything that needs it reads the record: the entry points (which trainer),
`objectives.build` (the objective), `config_checks` (population support, the task's host memory),
`probing.extract` (the probe setting), the launchers and campaign (entry point, config file,
config template, main metric). No other module keys a table by an experiment's name, so
adding a task is three files: `tasks/<name>.py`, `experiments/configs/<name>.py` and one
record in `EXPERIMENTS` (the contributor's map in experiments/reference.md).

This module imports only the standard library, so a launching machine without JAX
(`xm_launch --dry_run`, `tpu_pod.sh`, `launch/campaign`) can read it: a record names its
JAX-dependent parts (objective builder, trainer, memory estimate, probe setting) by
"package.module:attribute" path, imported on first use (`load`). Code that defines a task
in place (a test) may give the object itself instead. Paths of files are relative to the
repository root, as the launchers' commands use them.

  python -m hypernet_attention.runs.registry sraven   # prints: script config_file
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
from typing import Any, Callable, Union

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALLED_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                 "configs")
# The entry point of every experiment (it trains whatever `config.experiment` names); the
# older per-task scripts are aliases of it that keep their default config.
ENTRY_POINT = "experiments/train.py"
LOOP = "hypernet_attention.train.loop:train_and_evaluate"
# The objective of every on-device task, built from the record's `task` class.
ON_DEVICE = "hypernet_attention.train.objectives:on_device"

# "package.module:attribute", imported on first use, or the object itself.
Ref = Union[str, Callable[..., Any], type]


def load(ref: Ref) -> Any:
  """The object `ref` names ("package.module:attribute"), or `ref` itself if it is one."""
  if not isinstance(ref, str):
    return ref
  module, _, attribute = ref.partition(":")
  if not module or not attribute:
    raise ValueError(f"reference {ref!r}; allowed: 'package.module:attribute'")
  return getattr(importlib.import_module(module), attribute)


@dataclasses.dataclass(frozen=True)
class Experiment:
  """One experiment: its name, files, and everything the code asks about it by name."""
  name: str  # As in `config.experiment`.
  config_file: str  # `get_config(arg)` module, relative to the repository root.
  # summary.json reports it per split (`test/<metric>`, `ood/<metric>`); tables show x100.
  metric: str
  # config -> `objectives.Objective` (task, data source, loss, metrics); the default builds
  # it from `task`.
  objective: Ref = ON_DEVICE
  # The task class (`tasks/<name>.py`, the task protocol in experiments/reference.md),
  # built from `config.task`; None for a host pipeline, whose objective reads the config.
  task: Ref | None = None
  # Batches generated inside the jitted step (`data.OnDeviceSource`), else a host pipeline
  # (`data.HostSource`, read per process and checkpointed with the state).
  on_device: bool = True
  # Members trained as one vmapped program (`population.py`): needs on-device data and a
  # task with `split_tables()`.
  population: bool = False
  memory: Ref | None = None  # config -> bytes the task's tables need on the host, or None.
  probe: Ref | None = None  # (task, features) -> probe setting (`probing/extract.py`).
  # The campaign's config argument, `.format(model=..., width=..., depth=...)`d per cell
  # (`launch/campaign/cells.py`); empty: the experiment trains no campaign cell.
  campaign_config: str = ""
  default_config: str = "model=hyla,size=smoke"  # The entry point's config with no --config.
  script: str = ENTRY_POINT  # Entry point, relative to the repository root.
  train: Ref = LOOP  # (config, workdir) -> summary: what the entry point runs.

  def __post_init__(self):
    if self.population and not self.on_device:
      raise ValueError(f"experiment {self.name!r}: population=True needs on_device=True "
                       "(members stack on-device task tables)")

  def config_path(self) -> str:
    """The config file's absolute path: in the checkout, or where an install without -e
    put it (`setup.py` ships `experiments/configs` as `hypernet_attention.configs`)."""
    path = os.path.join(REPO, self.config_file)
    if os.path.exists(path):
      return path
    return os.path.join(INSTALLED_CONFIGS, os.path.basename(self.config_file))

  def config_flag(self, arg: str | None = None, absolute: bool = False) -> str:
    """The entry point's `--config=` value for `get_config(arg)` (default: the record's
    `default_config`), relative to the repository root as launchers run it, or absolute,
    for a default valid from any cwd."""
    path = self.config_path() if absolute else self.config_file
    return f"{path}:{self.default_config if arg is None else arg}"

  def get_config(self, arg: str | None = None):
    """`get_config(arg)` of the config file, loaded by path as `--config=` does."""
    path = self.config_path()
    spec = importlib.util.spec_from_file_location(f"_config_{self.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


EXPERIMENTS: dict[str, Experiment] = {}


def register(experiment: Experiment) -> Experiment:
  """Adds `experiment`; a second record of one name is a ValueError (names key run files)."""
  if experiment.name in EXPERIMENTS:
    raise ValueError(f"experiment {experiment.name!r} is already registered")
  EXPERIMENTS[experiment.name] = experiment
  return experiment


_PROBES = "hypernet_attention.probing.extract"
register(Experiment(
    "sraven", "experiments/configs/sraven.py", metric="accuracy",
    task="hypernet_attention.tasks.sraven:SRaven", population=True,
    memory="hypernet_attention.tasks.sraven:config_memory", probe=f"{_PROBES}:SRavenSetting",
    campaign_config="model={model},size=paper,width={width},depth={depth}",
    default_config="model=hyla,size=demo", script="experiments/sraven_scaling.py"))
register(Experiment(
    "fuzzy_logic", "experiments/configs/fuzzy_logic.py", metric="r2",
    task="hypernet_attention.tasks.fuzzy_logic:FuzzyLogic", population=True,
    probe=f"{_PROBES}:FuzzyLogicSetting", campaign_config="model={model},size=paper",
    default_config="model=hyla,size=local", script="experiments/fuzzy_logic.py"))
register(Experiment(
    "c4_lm", "experiments/configs/c4_lm.py", metric="loss",
    objective="hypernet_attention.train.objectives:c4_lm", on_device=False,
    default_config="model=hyla,size=local", script="experiments/c4_lm.py",
    train="hypernet_attention.train.lm:train"))


def get(name: str) -> Experiment:
  """The experiment `name`; an unknown name is a ValueError listing the known ones."""
  if name not in EXPERIMENTS:
    raise ValueError(f"unknown experiment {name!r}; allowed: {', '.join(EXPERIMENTS)}")
  return EXPERIMENTS[name]


def names(**where: Any) -> list[str]:
  """The experiments whose record has every field of `where` equal, in registry order
  (`names(population=True)`: those that train populations)."""
  return [n for n, e in EXPERIMENTS.items()
          if all(getattr(e, key) == value for key, value in where.items())]


def main(argv: list[str]) -> int:
  if len(argv) != 1:
    print(f"usage: python -m hypernet_attention.runs.registry NAME; names: "
          f"{', '.join(EXPERIMENTS)}", file=sys.stderr)
    return 2
  try:
    experiment = get(argv[0])
  except ValueError as e:
    print(e, file=sys.stderr)
    return 2
  print(experiment.script, experiment.config_file)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
