"""TensorBoard event files without TensorFlow: a run's scalars and hyperparameters.

CLU's `metric_writers` imports TensorFlow for its summary writer (so does everything that
imports that package, e.g. `clu.periodic_actions`), yet only the language-model data needs
TensorFlow. The records are tensorboard's own (`scalar_pb`, `hparams_pb`, framed by its
`RecordWriter`), so `tensorboard --logdir` and `curves.read_scalars` read them as CLU's; what
is written here is only where they go (why not tensorboardX: experiments/reference.md,
"Versions"). Locally new records are appended at each flush; in a bucket, where objects
cannot be appended to, the whole file is rewritten as one object (scalars only: kilobytes),
at most every `remote_flush_s` seconds and on `close`."""

from __future__ import annotations

import io
import os
import socket
import time
from typing import Any, Mapping

from absl import logging
import numpy as np
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.proto import summary_pb2
from tensorboard.plugins.hparams import summary_v2 as hparams_summary
from tensorboard.plugins.scalar import summary_v2 as scalar_summary
from tensorboard.summary.writer import record_writer

from hypernet_attention.runs import run_files


class EventsWriter:
  """`write_scalars(step, {tag: value})`, `write_hparams`, `flush`, `close`.

  `just_logging=True` (processes other than 0) writes no file: values go to the DEBUG log
  only, as CLU's logging writer does."""

  def __init__(self, logdir: str, *, just_logging: bool = False, remote_flush_s: float = 60):
    self.just_logging, self.remote_flush_s = just_logging, remote_flush_s
    self.path = run_files.path(logdir) / (
        f"events.out.tfevents.{time.time():.6f}.{socket.gethostname()}.{os.getpid()}.v2")
    self._records = io.BytesIO()
    self._framer = record_writer.RecordWriter(self._records)
    self._written, self._last_flush = 0, 0.0
    self._add(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))

  def _add(self, event: event_pb2.Event) -> None:
    if not self.just_logging:
      self._framer.write(event.SerializeToString())

  def _add_summary(self, step: int, summary: summary_pb2.Summary) -> None:
    self._add(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    logging.debug("[%d] %s", step, ", ".join(f"{k}={float(v):.6g}" for k, v in scalars.items()))
    for tag, value in scalars.items():
      self._add_summary(step, scalar_summary.scalar_pb(tag, np.float32(value)))
    self.flush(force=False)

  def write_hparams(self, hparams: Mapping[str, Any]) -> None:
    self._add_summary(0, hparams_summary.hparams_pb(dict(hparams)))
    self.flush(force=False)

  def flush(self, force: bool = True) -> None:
    """Writes what was recorded since the last flush (remote: throttled unless `force`)."""
    data = self._records.getvalue()
    if self.just_logging or len(data) == self._written:
      return
    if run_files.is_remote(self.path):
      if not force and time.time() - self._last_flush < self.remote_flush_s:
        return
      run_files.write_bytes(self.path, data)  # One object: the whole file so far.
    else:
      try:
        with self.path.open("ab") as f:
          f.write(data[self._written:])
      except OSError as e:  # A full disk: one line naming the file (`cli.py`).
        raise OSError(e.errno, e.strerror, os.fspath(self.path)) from e
    self._written, self._last_flush = len(data), time.time()

  def close(self) -> None:
    self.flush()


def write_run_start(writer: EventsWriter, step: int, config: Any,
                    constants: Mapping[str, float]) -> None:
  """What a run logs once, at step 0 of a new run: its config as hyperparameters and its
  constant scalars (SRAVEN's accuracy ceilings). A resumed run (`step` > 0) writes
  neither: its event files already hold them, and a constant written again at the resume
  step draws a flat line from step 0 to that step in TensorBoard."""
  if step:
    return
  flat_config = run_files.flatten(run_files.config_to_json(config))
  writer.write_hparams({k: v for k, v in flat_config.items()
                        if isinstance(v, (int, float, str, bool))})
  if constants:
    writer.write_scalars(step, constants)
