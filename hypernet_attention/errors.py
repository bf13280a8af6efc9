"""The project's one input-error type, importable from tasks, models and the training code
alike (no dependencies, so no import cycles), and the one refusal of an unknown name."""

import argparse
from typing import Iterable


class BadInput(ValueError):
  """A config value, flag, shape, file or workdir that cannot work, found before any work.

  Entry points print its message as one line and exit with status 2 (`runs/cli.py`)."""


def check_choice(name: str, value, allowed: Iterable) -> None:
  """BadInput in one line unless `value` is one of `allowed` (a registry's names): the end of every
  branch on a name, so that a name nobody wrote code for is never computed as another."""
  allowed = tuple(allowed)
  if value not in allowed:
    raise BadInput(f"Unknown {name} {value!r}; allowed: {', '.join(map(str, allowed))}.")


class ArgumentParser(argparse.ArgumentParser):
  """argparse's parser for the project's argparse tools: a bad flag is one line,
  `<program>: error: <what and what is allowed>` (exit 2), without the usage line argparse
  prints above it; `--help` still shows the usage."""

  def error(self, message: str):
    self.exit(2, f"{self.prog}: error: {message}\n")

  def check_positive(self, args: argparse.Namespace, *names: str, what: str = "integer"):
    """`error` for the first flag of `names` whose value is not > 0."""
    for name in names:
      if not getattr(args, name) > 0:
        self.error(f"--{name}={getattr(args, name)}; allowed: a positive {what}")
