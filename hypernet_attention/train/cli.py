"""What every training entry point shares around `absl.app.run`: short errors, exit codes.

  cli.run(main)   instead of app.run(main)

- Bad flags and bad input (unknown or mistyped flags, a config argument or
  `--config.<key>=` override that does not exist or does not parse, any
  `config_lib.BadInput` the library raises before work starts) print one line,
  `<program>: error: <what and what is allowed>`, and exit with status 2, before anything
  is written. `--verbosity=1` shows the traceback as well.
- A checkpoint that cannot be written (full disk, ...) prints one line naming the intact
  steps and exits with status 1.
- A preempted run (`preemption.Preempted`, after its checkpoint is committed) exits with
  `preemption.EXIT_CODE` (75).
- The console is configured (`console.configure`) before `main` runs.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Callable, NoReturn

from absl import app
from absl import flags
from absl import logging
import ml_collections

from hypernet_attention.train import checkpointing
from hypernet_attention.train import config_lib
from hypernet_attention.train import console
from hypernet_attention.train import preemption

BAD_INPUT_EXIT_CODE = 2


def _fail(message: str) -> NoReturn:
  program = os.path.basename(sys.argv[0])
  print(f"{program}: error: {message}", file=sys.stderr, flush=True)
  sys.exit(BAD_INPUT_EXIT_CODE)


def _load_config(argv: list[str]):
  """The config that `--config=FILE[:ARG]` (or the flag's default) names, or None."""
  spec = next((a.split("=", 1)[1] for a in reversed(argv) if a.startswith("--config=")),
              None) or getattr(flags.FLAGS["config"], "default", None)
  if not isinstance(spec, str):
    return None
  path, _, arg = spec.partition(":")
  try:
    module_spec = importlib.util.spec_from_file_location("_config_for_errors", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg or None)
  except Exception:  # pylint: disable=broad-except
    return None  # The config file's own error is reported instead.


def _unknown_override(argv: list[str]) -> str | None:
  """The first `--config.<key>=` flag whose key the config does not have."""
  config = _load_config(argv)
  if config is None:
    return None
  for arg in argv[1:]:
    if not arg.startswith("--config."):
      continue
    path = arg[len("--config."):].split("=", 1)[0]
    node = config
    for name in path.split("."):
      if not isinstance(node, ml_collections.ConfigDict) or name not in node:
        allowed = sorted(node.keys()) if isinstance(node, ml_collections.ConfigDict) else []
        return (f"--config.{path}: {name!r} is not a config key"
                + (f"; allowed here: {allowed}" if allowed else " (its parent is a value)"))
      node = node[name]
  return None


def _parse_flags(argv: list[str]) -> list[str]:
  """`flags.FLAGS(argv)`, with any failure reported as one line."""
  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, ValueError, TypeError) as e:
    if (override := _unknown_override(argv)) is not None:
      _fail(override)
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    # A config file's own error arrives wrapped with its traceback: keep the last line.
    _fail(lines[-1] if lines else type(e).__name__)


def run(main: Callable[[list[str]], None]) -> None:
  """`app.run(main)` with one-line errors and the exit codes above."""
  def guarded(argv):
    console.configure()
    try:
      main(argv)
    except config_lib.BadInput as e:
      if logging.get_verbosity() >= 1:
        logging.exception("bad input")
      _fail(str(e))
    except checkpointing.CheckpointWriteError as e:
      if logging.get_verbosity() >= 1:
        logging.exception("checkpoint write failed")
      print(f"{os.path.basename(sys.argv[0])}: error: {e}", file=sys.stderr, flush=True)
      sys.exit(1)
    except preemption.Preempted as e:
      logging.warning("%s", e)
      sys.exit(preemption.EXIT_CODE)
  app.run(guarded, flags_parser=_parse_flags)
