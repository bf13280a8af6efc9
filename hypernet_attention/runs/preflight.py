r"""Checks a run's config on the launching machine, before anything is copied or started.

  python -m hypernet_attention.runs.preflight EXPERIMENT CONFIG_ARG WORKDIR \
      [--config.key=value ...]

The training host's own checks, run here: the experiment's config file with `CONFIG_ARG`
and the overrides, parsed by ml_collections' `config_flags` as the entry point parses them
(`cli.parse_config`), then `config_checks.validate` (values, intervals, schedule, the model's
and the task's names), then the workdir path. Prints `script config_file` (the entry point
and config file, relative to the repository root, as `registry` does) and exits 0, or
prints the line the entry point would, `preflight: error: ...`, and exits 2.
`launch/tpu_pod.sh` and `launch/slurm.sh` call it before copying, installing or submitting.
Checks that depend on the hosts (mesh and batch divisibility, memory) run there."""

from __future__ import annotations

import sys
from typing import Sequence

import ml_collections

from hypernet_attention import errors
from hypernet_attention.runs import cli
from hypernet_attention.runs import config_checks
from hypernet_attention.runs import registry
from hypernet_attention.runs import run_files


def load(experiment: str, config_arg: str,
         overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """The config the entry point would run: `get_config(config_arg)` plus `overrides`."""
  record = registry.get(experiment)
  return cli.parse_config(record.config_path() + (f":{config_arg}" if config_arg else ""),
                          overrides)


def check(experiment: str, config_arg: str, workdir: str,
          overrides: Sequence[str] = ()) -> registry.Experiment:
  """Raises `errors.BadInput` for anything the launching machine can already refuse."""
  config_checks.validate(load(experiment, config_arg, overrides))
  run_files.workdir_path(workdir)
  return registry.get(experiment)


def main(argv: Sequence[str]) -> int:
  if len(argv) < 3:
    print("usage: python -m hypernet_attention.runs.preflight EXPERIMENT CONFIG_ARG "
          "WORKDIR [--config.key=value ...]", file=sys.stderr)
    return 2
  try:
    check(argv[0], argv[1], argv[2], argv[3:])
  except (errors.BadInput, ValueError) as e:
    print(f"preflight: error: {e}", file=sys.stderr)
    return 2
  return registry.main(argv[:1])  # Its printout, which the launch scripts read.


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
