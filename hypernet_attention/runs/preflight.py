r"""Checks a run's config on the launching machine, before anything is copied or started.

  python -m hypernet_attention.runs.preflight EXPERIMENT CONFIG_ARG WORKDIR \
      [--config.key=value ...]

Loads the experiment's config file with `CONFIG_ARG` and the overrides as the entry point
would, and runs every check that needs no accelerator and no data: the config's values
(`config_checks.validate`: values, intervals, schedule, the attention preset), the model's
other names (`presets.check_model_names`, the model's own check: implementation,
feed_forward, position), the workdir path. Prints `script config_file` (the entry point and
config file, relative to the repository root, as `registry` does) and exits 0, or prints
one line `preflight: error: ...` and exits 2.
`launch/tpu_pod.sh` and `launch/slurm.sh` call it before copying, installing or submitting.
Checks that depend on the hosts (mesh and batch divisibility, memory) run again there.
"""

from __future__ import annotations

import ast
import sys
from typing import Sequence

import ml_collections

from hypernet_attention import errors
from hypernet_attention import presets
from hypernet_attention.runs import config_checks
from hypernet_attention.runs import registry
from hypernet_attention.runs import run_files


def _value(node, text: str):
  """The override's value as `--config.<key>=` would parse it for this field."""
  if isinstance(node, (bool, int, float)):
    return text  # `set_dotted` converts it to the field's type.
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def load(experiment: str, config_arg: str,
         overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """The config the entry point would run: `get_config(config_arg)` plus `overrides`."""
  try:
    config = registry.get(experiment).get_config(config_arg or None)
  except (ValueError, KeyError, TypeError, AttributeError) as e:
    raise errors.BadInput(f"config argument {config_arg!r} of {experiment}: {e}") from None
  with config.unlocked():
    for item in overrides:
      if not item.startswith("--config.") or "=" not in item:
        raise errors.BadInput(f"{item!r}; allowed: --config.<key>=<value> overrides")
      key, text = item[len("--config."):].split("=", 1)
      try:
        config_checks.set_dotted(config, key, _value(config_checks.get_dotted(config, key), text))
      except (ValueError, TypeError) as e:
        raise errors.BadInput(f"{item}: {e}") from None
  return config


def check(experiment: str, config_arg: str, workdir: str,
          overrides: Sequence[str] = ()) -> registry.Experiment:
  """Raises `errors.BadInput` for anything the launching machine can already refuse."""
  config = load(experiment, config_arg, overrides)
  config_checks.validate(config)
  run_files.workdir_path(workdir)
  presets.check_model_names(config.model, "config.model.")
  return registry.get(experiment)


def main(argv: Sequence[str]) -> int:
  if len(argv) < 3:
    print("usage: python -m hypernet_attention.runs.preflight EXPERIMENT CONFIG_ARG "
          "WORKDIR [--config.key=value ...]", file=sys.stderr)
    return 2
  try:
    experiment = check(argv[0], argv[1], argv[2], argv[3:])
  except (errors.BadInput, ValueError) as e:
    print(f"preflight: error: {e}", file=sys.stderr)
    return 2
  print(experiment.script, experiment.config_file)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
