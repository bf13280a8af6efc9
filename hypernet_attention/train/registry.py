"""The one registry of experiments: `config.experiment` name -> entry point and config file.

Entry points, benchmarks, launchers (`launch/`) and tests look experiments up here instead
of each keeping its own name -> file table. It lives in the library (not in `experiments/`)
because `objectives.build` checks names against it, and it imports only the standard
library so that a launcher machine without JAX (`xm_launch --dry_run`, `tpu_pod.sh`) can
read it. Paths are relative to the repository root, as the launchers' commands use them.

Adding an experiment is one line in `EXPERIMENTS` (plus its objective in `objectives`).

  python -m hypernet_attention.train.registry sraven   # prints: script config_file
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INSTALLED_CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                 "configs")


@dataclasses.dataclass(frozen=True)
class Experiment:
  """One experiment: its `config.experiment` name and the files that run it."""
  name: str  # As in `config.experiment` and `objectives.OBJECTIVES`.
  script: str  # Entry point, relative to the repository root.
  config_file: str  # `get_config(arg)` module, relative to the repository root.
  # summary.json reports it per split (`test/<metric>`, `ood/<metric>`); tables show x100.
  metric: str

  def config_path(self) -> str:
    """The config file's absolute path: in the checkout, or where an install without -e
    put it (`setup.py` ships `experiments/configs` as `hypernet_attention.configs`)."""
    path = os.path.join(REPO, self.config_file)
    if os.path.exists(path):
      return path
    return os.path.join(INSTALLED_CONFIGS, os.path.basename(self.config_file))

  def config_flag(self, arg: str, absolute: bool = False) -> str:
    """The entry point's `--config=` value for `get_config(arg)` (relative to the
    repository root, as launchers run it, or absolute, for a default valid from any cwd)."""
    path = self.config_path() if absolute else self.config_file
    return f"{path}:{arg}"

  def get_config(self, arg: str | None = None):
    """`get_config(arg)` of the config file, loaded by path as `--config=` does."""
    path = self.config_path()
    spec = importlib.util.spec_from_file_location(f"_config_{self.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


EXPERIMENTS = {e.name: e for e in (
    Experiment("sraven", "experiments/sraven_scaling.py", "experiments/configs/sraven.py",
               metric="accuracy"),
    Experiment("fuzzy_logic", "experiments/fuzzy_logic.py", "experiments/configs/fuzzy_logic.py",
               metric="r2"),
    Experiment("c4_lm", "experiments/c4_lm.py", "experiments/configs/c4_lm.py", metric="loss"),
)}


def get(name: str) -> Experiment:
  """The experiment `name`; an unknown name is a ValueError listing the known ones."""
  if name not in EXPERIMENTS:
    raise ValueError(f"unknown experiment {name!r}; allowed: {', '.join(EXPERIMENTS)}")
  return EXPERIMENTS[name]


def main(argv: list[str]) -> int:
  if len(argv) != 1:
    print(f"usage: python -m hypernet_attention.train.registry NAME; names: "
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
