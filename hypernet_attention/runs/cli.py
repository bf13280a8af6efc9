"""What every training entry point shares around `absl.app.run`: short errors, exit codes.

  cli.run(main)   instead of app.run(main)
  cli.define_config(default, help)   instead of config_flags.DEFINE_config_file(...)

- Bad flags and bad input (unknown or mistyped flags, a config argument or
  `--config.<key>=` override that does not exist (the nearest key named) or does not
  parse, on the default config or on `--config=`'s, any
  `errors.BadInput` the library raises before work starts) print one line,
  `<program>: error: <what and what is allowed>`, and exit with status 2, before anything
  is written. `--verbosity=1` shows the traceback as well.
- A checkpoint that cannot be written (full disk, ...) prints one line naming the intact
  steps and exits with status 1 at once (found at the next chunk boundary); any other file
  that cannot be written or read (an `OSError`: summary.json, TensorBoard events, a report)
  prints one line naming the file and the system's reason, and exits with status 1.
- A preempted run (SIGTERM, or a first Ctrl-C: `preemption.Preempted`, after its checkpoint
  is committed) prints one line and exits with `preemption.EXIT_CODE` (75); a Ctrl-C
  outside the training loop (or a second one) prints one line and exits with 130.
- `app.UsageError` (the tools' flag checks) is bad input too: one line, no flag list.
- The console is configured (`console.configure`) before `main` runs.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import sys
import threading
from typing import Callable, NoReturn

from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from hypernet_attention import errors
from hypernet_attention.runs import config_checks
from hypernet_attention.runs import console

# The training library's exceptions, looked up only where it was imported (so that tools
# without JAX, like `launch/xm_launch.py --dry_run`, use this module too).
_CHECKPOINTING = "hypernet_attention.train.checkpointing"
_PREEMPTION = "hypernet_attention.train.preemption"
PREEMPTED_EXIT_CODE = 75  # `preemption.EXIT_CODE`: EX_TEMPFAIL, "retry".


def _raised(error: BaseException, module: str, name: str) -> bool:
  return module in sys.modules and isinstance(error, getattr(sys.modules[module], name))

BAD_INPUT_EXIT_CODE = 2
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as shells report it.
def _fail(message: str) -> NoReturn:
  print(f"{_program()}: error: {message}", file=sys.stderr, flush=True)
  sys.exit(BAD_INPUT_EXIT_CODE)


def _config_spec(argv: list[str]) -> str | None:
  """`FILE[:ARG]` of `--config=` (or the flag's default), or None."""
  if "config" not in flags.FLAGS:
    return None
  spec = next((a.split("=", 1)[1] for a in reversed(argv) if a.startswith("--config=")),
              None) or getattr(flags.FLAGS["config"], "default", None)
  return spec if isinstance(spec, str) else None


def _missing_get_config(spec: str | None, error: BaseException) -> str | None:
  """The line for a config file without `get_config` (ml_collections says only "module
  'config_config' has no attribute 'get_config'", not which file)."""
  if spec is None or "has no attribute 'get_config'" not in str(error):
    return None
  return (f"--config={spec}: {spec.partition(':')[0]!r} defines no get_config(); allowed: a "
          "config file whose get_config(arg) returns a ConfigDict (as experiments/configs/"
          "*.py)")


def _load_config(spec: str | None):
  """The config that `FILE[:ARG]` names, or None."""
  if spec is None:
    return None
  path, _, arg = spec.partition(":")
  try:
    module_spec = importlib.util.spec_from_file_location("_config_for_errors", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.get_config(arg or None)
  except Exception:  # pylint: disable=broad-except
    return None  # The config file's own error is reported instead.


def _unknown_override(argv: list[str], spec: str | None) -> str | None:
  """The line for the first `--config.<key>=` flag whose key the config `spec` names does
  not have (`config_checks.unknown_key`: the nearest key, or those allowed)."""
  config = _load_config(spec)
  if config is None:
    return None
  for arg in argv[1:]:
    if arg.startswith("--config."):
      key = arg[len("--config."):].split("=", 1)[0]
      if (problem := config_checks.unknown_key(config, key)) is not None:
        return f"{arg}: {problem}"
  return None


def define_config(default: str | None, help_string: str):
  """`config_flags.DEFINE_config_file("config", default, ..., lock_config=True)`, whose bad
  `--config.<key>=` overrides are refused in one line (exit 2) wherever the config comes
  from. With a default and no `--config=` on the command line, ml_collections loads the
  default and applies the overrides here, when the flag is defined (an unknown key raised
  an AttributeError traceback at import); with `--config=`, `run` parses them."""
  try:
    return config_flags.DEFINE_config_file("config", default, help_string, lock_config=True)
  except Exception as e:  # pylint: disable=broad-except
    _fail(_unknown_override(sys.argv, default) or _last_line(e))


def _last_line(error: BaseException) -> str:
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  return lines[-1] if lines else type(error).__name__


def _load_config_flags() -> None:
  """Loads every `config_flags` flag now (they load lazily, on first `.value`), so that a
  missing file, a syntax error or a missing `get_config` is one line, before any work."""
  for name in list(flags.FLAGS):
    flag = flags.FLAGS[name]
    if type(flag).__name__ != "_ConfigFlag":
      continue
    try:
      value = flag.value
      # A file that failed to load becomes a placeholder that raises on first use.
      error = vars(value).get("_error") if type(value).__name__ == "_ErrorConfig" else None
    except Exception as e:  # pylint: disable=broad-except
      error = e
    if error is not None:
      spec = flag.serialize().split("=", 1)[-1]
      _fail(_missing_get_config(spec, error) or f"--{name}={spec}: {_last_line(error)}")


def _parse_flags(argv: list[str]) -> list[str]:
  """`flags.FLAGS(argv)`, with any failure reported as one line."""
  try:
    rest = flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    # A config file's own error (syntax, missing file, get_config) arrives wrapped in any
    # exception type with its traceback: keep the last line.
    if (override := _unknown_override(argv, _config_spec(argv))) is not None:
      _fail(override)
    _fail(_missing_get_config(_config_spec(argv), e) or _last_line(e))
  _load_config_flags()
  return rest


def _program() -> str:
  return os.path.basename(sys.argv[0])


def _guarded(call: Callable[[], object]) -> object:
  """`call()` with the library's errors turned into one line and the exit codes above."""
  try:
    return call()
  except (errors.BadInput, app.UsageError) as e:
    if logging.get_verbosity() >= 1:
      logging.exception("bad input")
    _fail(str(e))
  except KeyboardInterrupt:
    print(f"{_program()}: interrupted (Ctrl-C); outputs written so far are kept",
          file=sys.stderr, flush=True)
    sys.exit(INTERRUPTED_EXIT_CODE)
  except Exception as e:  # pylint: disable=broad-except
    if _raised(e, _CHECKPOINTING, "CheckpointWriteError"):
      if logging.get_verbosity() >= 1:
        logging.exception("checkpoint write failed")
      print(f"{_program()}: error: {e}", file=sys.stderr, flush=True)
      # Orbax's threads of the failed save wait minutes for signals that never come, and
      # a normal exit waits for them: leave now (finalized checkpoints are on disk).
      sys.stdout.flush()
      os._exit(1)  # pylint: disable=protected-access
    if _raised(e, _PREEMPTION, "Preempted"):
      print(f"{_program()}: {e}", file=sys.stderr, flush=True)
      sys.exit(PREEMPTED_EXIT_CODE)
    if isinstance(e, FloatingPointError):  # A diverged run (`trainer.diverged`).
      if logging.get_verbosity() >= 1:
        logging.exception("diverged")
      print(f"{_program()}: error: {e}", file=sys.stderr, flush=True)
      sys.exit(1)
    if not isinstance(e, OSError) or not e.strerror:
      raise
    if logging.get_verbosity() >= 1:
      logging.exception("file error")
    print(f"{_program()}: error: {e.filename or 'a file'}: {e.strerror}; files written "
          "before are kept: fix the cause and rerun (training resumes from its last "
          "checkpoint)", file=sys.stderr, flush=True)
    sys.exit(1)


def _notice_before_the_loop(signum, frame) -> NoReturn:
  """SIGTERM before the training loop's own handler (`preemption.Watcher`) is in place:
  flags, config, setup, restore. Nothing has been trained by this process, so there is
  nothing to save: one line and exit 75, as a preemption (SystemExit unwinds the lock)."""
  del frame
  print(f"{_program()}: {signal.Signals(signum).name} before any training step: nothing to "
        "save, outputs written so far are kept; rerun the same command to resume",
        file=sys.stderr, flush=True)
  sys.exit(PREEMPTED_EXIT_CODE)


def run(main: Callable[[list[str]], object]) -> None:
  """`app.run(main)` with one-line errors and the exit codes above. A SIGTERM from here on
  exits 75 (`_notice_before_the_loop`, then the loop's own handling); only one during
  Python's imports, before this is called, still ends the process by the default action."""
  if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGTERM, _notice_before_the_loop)

  def guarded(argv):
    console.configure()
    return _guarded(lambda: main(argv))
  app.run(guarded, flags_parser=_parse_flags)


def run_plain(main: Callable[[], object]) -> None:
  """The same for an argparse tool: `main()` parses its own arguments (argparse reports
  bad ones as `<program>: error: ...`, exit 2); what the library raises is one line too."""
  result = _guarded(main)
  sys.exit(result if isinstance(result, int) else 0)
