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
- The console is configured (`console.configure`) before `main` runs."""

from __future__ import annotations

import os
import re
import shlex
import signal
import sys
import threading
from typing import Callable, NoReturn, Sequence

from absl import app
from absl import flags
from absl import logging
import ml_collections
from ml_collections import config_flags

from hypernet_attention import errors
from hypernet_attention.runs import config_checks
from hypernet_attention.runs import console
from hypernet_attention.runs import registry

# The training library's exceptions, looked up only where it was imported (so that tools
# without JAX, like `launch/xm_launch.py --dry_run`, use this module too).
_CHECKPOINTING = "hypernet_attention.train.checkpointing"
_PREEMPTION = "hypernet_attention.train.preemption"
PREEMPTED_EXIT_CODE = 75  # `preemption.EXIT_CODE`: EX_TEMPFAIL, "retry".


def _raised(error: BaseException, module: str, name: str) -> bool:
  return module in sys.modules and isinstance(error, getattr(sys.modules[module], name))

BAD_INPUT_EXIT_CODE = 2
INTERRUPTED_EXIT_CODE = 130  # 128 + SIGINT, as shells report it.
_RUN_WORKDIR: list[str] = []  # The workdir of the run this process trains, once known.


def announce_workdir(workdir: str) -> None:
  """Records the run's workdir (the training loop calls it before any work) for the
  closing lines' resume command."""
  _RUN_WORKDIR[:] = [str(workdir)]


def resume_hint() -> str:
  """How a closing line says to resume: once the run's workdir is known, this process's own
  command line with `--workdir=<workdir>` (without it the same command would start a new,
  timestamped run); before (this process wrote nothing yet) the same command does what this
  one would have."""
  if not _RUN_WORKDIR:
    return "rerun the same command"
  args, skip = [], False
  for arg in sys.argv[1:]:
    if not skip and arg != "--workdir" and not arg.startswith("--workdir="):
      args.append(arg)
    skip = arg == "--workdir"
  return "resume with: " + shlex.join(["python", sys.argv[0], *args,
                                       f"--workdir={_RUN_WORKDIR[0]}"])


def _fail(message: str) -> NoReturn:
  """The one refusal line (no exception class before the message), exit 2."""
  print(f"{_program()}: error: {_CLASS_PREFIX.sub('', message)}", file=sys.stderr, flush=True)
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
  return (f"--config={spec}: {spec.partition(':')[0]!r} defines no get_config(); allowed: a config "
          "file whose get_config(arg) returns a ConfigDict (as experiments/configs/*.py)")


def _unknown_override(argv: list[str], spec: str | None) -> str | None:
  """The line for the first `--config.<key>=` flag whose key the config `spec` names does
  not have (`config_checks.unknown_key`: the nearest key, or those allowed)."""
  overrides = [arg for arg in argv[1:] if arg.startswith("--config.")]
  try:
    config = parse_config(spec) if overrides and spec is not None else None
  except errors.BadInput:
    return None  # The config file's own error is reported instead.
  for arg in overrides if config is not None else ():
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


# `ValueError: `, `hypernet_attention.errors.BadInput: `: how a wrapped error's last line
# starts (ml_collections re-raises a config file's error with its traceback in the text).
_CLASS_PREFIX = re.compile(r"^(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception)|BadInput): ")


def _last_line(error: BaseException) -> str:
  """The last line of `error`'s text, without an exception class name before it."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  return _CLASS_PREFIX.sub("", lines[-1]) if lines else "failed without a message"


def _config_problem(flag) -> str | None:
  """Why a `config_flags` flag's config cannot be used (a missing file, a syntax error, no
  `get_config`, one that returns no ConfigDict), or None. Loads it now (it loads lazily)."""
  try:
    value = flag.value
    # A file that failed to load becomes a placeholder that raises on first use.
    error = vars(value).get("_error") if type(value).__name__ == "_ErrorConfig" else None
  except Exception as e:  # pylint: disable=broad-except
    error = e
  if error is None and (value is None or isinstance(value, ml_collections.ConfigDict)):
    return None
  spec = flag.serialize().split("=", 1)[-1]
  if error is not None:
    return _missing_get_config(spec, error) or f"--{flag.name}={spec}: {_last_line(error)}"
  return (f"--{flag.name}={spec}: get_config() returned a {type(value).__name__}; allowed: a "
          "config file whose get_config(arg) returns an ml_collections.ConfigDict (as "
          "experiments/configs/*.py)")


def _load_config_flags() -> None:
  """Loads every `config_flags` flag now, so that a bad config file is one line, before any work."""
  for name in list(flags.FLAGS):
    if type(flags.FLAGS[name]).__name__ == "_ConfigFlag":
      if (problem := _config_problem(flags.FLAGS[name])) is not None:
        _fail(problem)


def parse_config(spec: str, overrides: Sequence[str] = ()) -> ml_collections.ConfigDict:
  """The config that `--config=<spec> <overrides>` gives an entry point, parsed by
  ml_collections' `config_flags` with the entry point's one-line refusals (as
  `errors.BadInput`): what `preflight.py` checks on the launching machine."""
  values, argv = flags.FlagValues(), [_program(), f"--config={spec}", *overrides]
  config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True,
                                  sys_argv=argv)  # Where it finds the overrides.
  try:
    values(argv)
  except Exception as e:  # pylint: disable=broad-except
    raise errors.BadInput(_unknown_override(argv, spec) or _missing_get_config(spec, e)
                          or _last_line(e)) from None
  if (problem := _config_problem(values["config"])) is not None:
    raise errors.BadInput(problem)
  return values.config


_HELP = ("--help", "-h", "-?", "--helpshort", "--helpfull")
CONFIGS_ALLOWED = ("allowed: an experiment's config file and argument: " + ", ".join(
    e.config_flag() for e in registry.EXPERIMENTS.values()))


def _parse_flags(argv: list[str]) -> list[str]:
  """`flags.FLAGS(argv)`, with any failure reported as one line; `--help` lists the entry
  point's own flags (those defined for it elsewhere, as `--config` and `--workdir`, too) and
  exits 0 (absl's exits 1)."""
  for name in ("config", "workdir"):
    if name in flags.FLAGS:
      flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[name])
  spec = _config_spec(argv)
  if "config" in flags.FLAGS and flags.FLAGS["config"].default is None and not any(
      a == "--config" or a.startswith("--config=") for a in argv) and (
      override := next((a for a in argv[1:] if a.startswith("--config.")), None)):
    _fail(f"{override} needs --config=<config file>[:<argument>] first; {CONFIGS_ALLOWED}")
  try:
    rest = flags.FLAGS(argv)
  except SystemExit as e:
    raise SystemExit(0 if set(argv[1:]) & set(_HELP) else e.code) from None
  except Exception as e:  # pylint: disable=broad-except
    # A config file's own error (syntax, missing file, get_config) arrives wrapped in any
    # exception type with its traceback: keep the last line.
    _fail(_unknown_override(argv, spec) or _missing_get_config(spec, e) or _last_line(e))
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
    print(f"{_program()}: interrupted (Ctrl-C); outputs written so far are kept; "
          f"{resume_hint()}", file=sys.stderr, flush=True)
    sys.exit(INTERRUPTED_EXIT_CODE)
  except Exception as e:  # pylint: disable=broad-except
    if _raised(e, _PREEMPTION, "Preempted"):
      print(f"{_program()}: {e}", file=sys.stderr, flush=True)
      sys.exit(PREEMPTED_EXIT_CODE)
    # A failed checkpoint write, a diverged run (`trainer.diverged`), a file error.
    write_failed = _raised(e, _CHECKPOINTING, "CheckpointWriteError")
    if write_failed or isinstance(e, FloatingPointError):
      line = str(e)
    elif isinstance(e, OSError) and e.strerror:
      line = (f"{e.filename or 'a file'}: {e.strerror}; files written before are kept: fix "
              f"the cause, then {resume_hint()}")
    else:
      raise
    if logging.get_verbosity() >= 1:
      logging.exception("failed")
    print(f"{_program()}: error: {line}", file=sys.stderr, flush=True)
    if write_failed:
      # Orbax's threads of the failed save wait minutes for signals that never come, and a
      # normal exit waits for them: leave now (finalized checkpoints are on disk).
      sys.stdout.flush()
      os._exit(1)  # pylint: disable=protected-access
    sys.exit(1)


def _notice_before_the_loop(signum, frame) -> NoReturn:
  """SIGTERM before the training loop's own handler (`preemption.Watcher`) is in place:
  flags, config, setup, restore. Nothing has been trained by this process, so there is
  nothing to save: one line and exit 75, as a preemption (SystemExit unwinds the lock)."""
  del frame
  print(f"{_program()}: {signal.Signals(signum).name} before any training step: nothing to "
        f"save, outputs written so far are kept; {resume_hint()}", file=sys.stderr, flush=True)
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
