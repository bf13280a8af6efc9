"""The one registry of experiments: one `Experiment` record per `config.experiment` name.

Everything that differs between experiments and is not in the config file sits in its record, and
everything that needs it reads the record: the entry points (which trainer), `objectives.build` (the
objective: an on-device task's is built from its `task` class; the task's host memory),
`config_checks` (population support), `probing.extract` (the probe setting), the launchers,
sweeps, campaign, plan and report (entry point, config file, config template, main metric, and
the paper's grid, default setting, steps, reported splits, Table A1 column and reference rates:
`Paper`). No other module keys a table by an experiment's name (tests/runs/test_registry.py),
so a new task is its task module `tasks/<name>.py`, its config `experiments/configs/<name>.py`
and one record here (the contributor's map in experiments/reference.md).

This module imports only the standard library, so a launching machine without JAX
(`xm_launch --dry_run`, `tpu_pod.sh`, `launch/campaign`) can read it: a record names its
JAX-dependent parts (task class, objective builder, trainer, memory estimate, probe setting) by
"package.module:attribute" path, imported on first use (`load`). Code that defines a task
in place (a test) may give the object itself instead. Paths of files are relative to the
repository root, as the launchers' commands use them.

  python -m hypernet_attention.runs.registry sraven   # prints: script config_file"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
import sys
from typing import Any, Callable, Union

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALLED_CONFIGS = os.path.join(REPO, "hypernet_attention", "configs")
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
class Paper:
  """What the paper's sweeps, campaign, plan and report know about an experiment (all plain
  data, read by `launch/` without JAX)."""
  label: str  # The task's name in titles: "SRAVEN".
  metric_label: str  # The main metric's name in titles: "accuracy".
  # The per-method hyperparameter grid (the paper's appendix, the authors' sweeps/*.yaml) as
  # config overrides; a method's reported number is its best grid point's mean over seeds.
  grid: dict[str, tuple[Any, ...]]
  # The paper's default setting (overrides): Table A1's main rows run at it first.
  default_setting: dict[str, Any]
  splits: tuple[str, ...]  # The eval splits every campaign member reports (Table A1's columns).
  num_steps: int  # Training steps of a paper-size run.
  # Table A1 as published, this experiment's column (mean, s.e. over 3 seeds, x100):
  # (preset, with MoE) -> (mean, s.e.); the rows' names are `launch/sweeps/common.py`'s.
  table_a1: dict[tuple[str, bool], tuple[float, float]]
  # Single-run steps/s at the paper's size, for the campaign's plan when no cell of it has
  # finished on the device kind: {"cpu" | "gpu": ({model family: steps/s}, source)}.
  reference_rates: dict[str, tuple[dict[str, float], str]] = dataclasses.field(default_factory=dict)
  decoding_metric: str = "accuracy"  # What the campaign's probes score on held-out tasks.
  cell_prefix: str = ""  # The experiment in the campaign's cell names: `d_fuzzy_hyla_grid`.
  # The campaign runs Table A1's ablation rows at the default setting first (stage d), the
  # rest of their grid after (stage e); False: their whole grid at once (stage e).
  ablations_default_first: bool = False

  @property
  def title(self) -> str:
    """`SRAVEN (OOD accuracy x100)`: the report's name of the experiment's tables."""
    return f"{self.label} (OOD {self.metric_label} x100)"


@dataclasses.dataclass(frozen=True)
class Experiment:
  """One experiment: its name, files, and everything the code asks about it by name."""
  name: str  # As in `config.experiment`.
  config_file: str  # `get_config(arg)` module, relative to the repository root.
  # summary.json reports it per split (`test/<metric>`, `ood/<metric>`); tables show x100.
  metric: str
  # (config, this record) -> `objectives.Objective` (task, data source, loss, metrics); the
  # default builds it from `task`.
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
  paper: Paper | None = None  # The paper's numbers and settings; None: not in the paper.
  default_config: str = "model=hyla,size=smoke"  # The entry point's config with no --config.
  script: str = ENTRY_POINT  # Entry point, relative to the repository root.
  train: Ref = LOOP  # (config, workdir) -> summary: what the entry point runs.
  # Task keys that name a choice -> the names allowed (None: the task's default), as plain
  # data so that `config_checks.validate` refuses a typo on the launching machine as on the
  # host; the task module's own names (tests/runs/test_entry.py checks they agree).
  names: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

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
_THROUGHPUT = "training_throughput.md: idle 2-core AMD EPYC"
# No fuzzy-logic step was timed on a GPU: SRAVEN's rate stands in for it (both models are
# tiny at batch 128, so a step is bound by kernel launches, not by FLOPs).
_SRAVEN_H100 = {"softmax": 714.0, "linear": 880.0, "hyla": 737.0}
register(Experiment(
    "sraven", "experiments/configs/sraven.py", metric="accuracy",
    task="hypernet_attention.tasks.sraven:SRaven", population=True,
    memory="hypernet_attention.tasks.sraven:config_memory", probe=f"{_PROBES}:SRavenSetting",
    campaign_config="model={model},size=paper,width={width},depth={depth}",
    paper=Paper(
        "SRAVEN", "accuracy", grid={"optimizer.learning_rate": (3e-4, 1e-3),
                                    "optimizer.weight_decay": (0.1, 0.3),
                                    "optimizer.warmup_steps": (1000, 3000)},
        default_setting={"optimizer.learning_rate": 1e-3, "optimizer.weight_decay": 0.1,
                         "optimizer.warmup_steps": 1000},
        splits=("ood", "test"), num_steps=156_250, table_a1={
            ("softmax", False): (56.56, 1.05), ("linear", False): (56.30, 1.11),
            ("hyla", False): (69.13, 1.90), ("linear_rmshead", False): (59.01, 2.50),
            ("linear_rmshead_nonlinear_value", False): (55.38, 0.32),
            ("hyla_no_rmshead", False): (62.53, 5.73),
            ("hyla_linear_value", False): (56.54, 0.21),
            ("hyla_linear_value_no_rmshead", False): (56.33, 1.41),
            ("softmax_hyla", False): (38.21, 2.98), ("hyla_deep", False): (66.59, 0.08),
            ("softmax", True): (57.68, 1.31), ("linear", True): (64.34, 4.3),
            ("hyla", True): (66.94, 3.94)},
        reference_rates={
            "cpu": ({"softmax": 6.44, "linear": 6.57, "hyla": 5.10}, _THROUGHPUT),
            "gpu": (_SRAVEN_H100, "kernels.md: one H100, jax 0.11.2")},
        cell_prefix="sraven"),
    default_config="model=hyla,size=demo", script="experiments/sraven_scaling.py"))
register(Experiment(
    "fuzzy_logic", "experiments/configs/fuzzy_logic.py", metric="r2",
    task="hypernet_attention.tasks.fuzzy_logic:FuzzyLogic", population=True,
    probe=f"{_PROBES}:FuzzyLogicSetting", campaign_config="model={model},size=paper",
    paper=Paper(
        "Fuzzy logic", "R²", grid={"optimizer.learning_rate": (1e-3, 3e-3),
                                   "optimizer.weight_decay": (0.03, 0.1)},
        # Warmup is the config's default, 100 steps.
        default_setting={"optimizer.learning_rate": 1e-3, "optimizer.weight_decay": 0.1},
        splits=("ood", "test", "unseen_terms"), num_steps=50_000, table_a1={
            ("softmax", False): (63.28, 2.31), ("linear", False): (59.89, 5.22),
            ("hyla", False): (81.13, 7.77), ("linear_rmshead", False): (68.93, 5.10),
            ("linear_rmshead_nonlinear_value", False): (56.91, 4.25),
            ("hyla_no_rmshead", False): (81.27, 7.88),
            ("hyla_linear_value", False): (84.54, 5.32),
            ("hyla_linear_value_no_rmshead", False): (79.42, 7.43),
            ("softmax_hyla", False): (70.98, 7.08), ("hyla_deep", False): (87.65, 4.54),
            ("softmax", True): (63.83, 6.07), ("linear", True): (60.09, 6.16),
            ("hyla", True): (82.37, 6.55)},
        reference_rates={
            "cpu": ({"softmax": 18.4, "linear": 20.1, "hyla": 17.5}, _THROUGHPUT),
            "gpu": (_SRAVEN_H100, "assumed: SRAVEN's H100 rate (kernels.md)")},
        decoding_metric="macro-F1", cell_prefix="fuzzy", ablations_default_first=True),
    default_config="model=hyla,size=local", script="experiments/fuzzy_logic.py",
    names={"task.split_draw": ("covering", "authors")}))
register(Experiment(
    "c4_lm", "experiments/configs/c4_lm.py", metric="loss",
    objective="hypernet_attention.train.objectives:c4_lm", on_device=False,
    default_config="model=hyla,size=local", script="experiments/c4_lm.py",
    train="hypernet_attention.train.lm:train",
    names={"task.name": ("c4_lm", "text_lm", "synthetic_lm"),
           "task.pipeline": ("seqio", "grain")}))


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
