"""What a person sees: our own short lines at default verbosity, library logs on request.

At the default absl verbosity (0) the console shows only INFO lines written by this project
(topology, parameter count, progress with steps/s and ETA, metrics at their intervals, one
line per checkpoint, one result line at the end) and WARNING or worse from anyone. Orbax's
~20 INFO lines per checkpoint and JAX's backend probing come back with `--verbosity=1`
(absl's flag; it also shows our DEBUG lines: the parameter table, every metric written).

TensorFlow (loaded only by the language-model data: seqio, `tasks/c4.py`) prints native INFO
lines while it loads, before any logging can be configured; the C4 path calls
`import_tensorflow_quietly` first, which loads it with the native stderr muted (set
TF_CPP_MIN_LOG_LEVEL=0 to see them) and hides accelerators from it, so that it never
competes with JAX for GPU memory (big_vision does the same)."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time

from absl import logging as absl_logging

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # hypernet_attention/
_REPO = os.path.dirname(_PACKAGE)
OUR_PATHS = tuple(os.path.join(d, "") for d in (
    _PACKAGE, os.path.join(_REPO, "experiments"), os.path.join(_REPO, "launch")))

@contextlib.contextmanager
def _native_stderr_muted():
  """Redirects file descriptor 2 (what C++ libraries write to) to /dev/null."""
  sys.stderr.flush()
  saved = os.dup(2)
  devnull = os.open(os.devnull, os.O_WRONLY)
  try:
    os.dup2(devnull, 2)
    yield
  finally:
    os.dup2(saved, 2)
    os.close(saved)
    os.close(devnull)


def import_tensorflow_quietly() -> None:
  if "tensorflow" in sys.modules:
    return
  loud = os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0"
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  with contextlib.nullcontext() if loud else _native_stderr_muted():
    try:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
    except ImportError:  # The C4 import that follows names what is missing.
      return
    tf.config.set_visible_devices([], "GPU")  # Probes CUDA, which logs natively too.


class _OursOrWarnings(logging.Filter):
  """INFO from this project's files; WARNING and above from everyone."""

  def filter(self, record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING or record.pathname.startswith(OUR_PATHS)


class _ShortFormatter(logging.Formatter):
  """`HH:MM:SS message`, with the level named only when it is not INFO."""

  def format(self, record: logging.LogRecord) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
    level = "" if record.levelno == logging.INFO else f"{record.levelname}: "
    return f"{stamp} {level}{record.getMessage()}"


def configure(verbosity: int | None = None) -> None:
  """Installs the filter and short format on absl's handler unless `verbosity` >= 1."""
  verbosity = absl_logging.get_verbosity() if verbosity is None else verbosity
  handler = absl_logging.get_absl_handler()
  for f in [f for f in handler.filters if isinstance(f, _OursOrWarnings)]:
    handler.removeFilter(f)
  if verbosity >= 1:
    handler.setFormatter(absl_logging.PythonFormatter())
    return
  handler.addFilter(_OursOrWarnings())
  handler.setFormatter(_ShortFormatter())


def duration(seconds: float) -> str:
  """`42s`, `3m05s`, `2h07m`: for ETAs and wall times."""
  seconds = int(round(seconds))
  if seconds < 60:
    return f"{seconds}s"
  if seconds < 3600:
    return f"{seconds // 60}m{seconds % 60:02d}s"
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Progress:
  """Steps/s over the last log interval (evaluation time excluded) and the ETA: the tail
  of the training line a single run and a population print alike."""

  def __init__(self, step: int, total: int):
    self.total, self.step, self.time, self.excluded = total, step, time.time(), 0.0
    self.rate = 0.0

  def line(self, step: int, metrics: str) -> str:
    """`step S/T | <metrics> | R steps/s | ETA ...`, measured since the previous line."""
    now = time.time()
    self.rate = rate = (step - self.step) / max(now - self.time - self.excluded, 1e-9)
    self.step, self.time, self.excluded = step, now, 0.0
    return (f"step {step:,}/{self.total:,} | {metrics} | {rate:.2f} steps/s | "
            f"ETA {duration((self.total - step) / max(rate, 1e-9))}")
