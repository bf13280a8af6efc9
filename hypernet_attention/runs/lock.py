"""One writer per workdir: a lock file that the training process holds while it runs.

Two trainers on one workdir delete each other's in-flight checkpoints (Orbax cleans
temporary directories it did not write) and interleave their logs. `WorkdirLock` makes the
second one stop with one line naming the holder, before it touches anything.

Design (works on local disks and on gs:// through etils.epath):
- The lock is `<workdir>/lock.json`: {"host", "pid", "proc_start", "start_time",
  "heartbeat", "token"}. It is created exclusively: O_CREAT|O_EXCL on local paths, the
  store's atomic create on gs:// (`ifGenerationMatch=0`, through gcsfs).
- The holder refreshes `heartbeat` every `heartbeat_s` from a daemon thread and removes
  the file on any normal exit (context exit, `atexit`, exceptions, SIGTERM/SIGINT, which
  the entry points turn into exceptions). Only SIGKILL or a lost machine leave it behind.
- A lock left behind is *stale*, and is taken over, when
    same host: its pid is not running (or runs another program: `proc_start`, the
    process's start time in /proc, differs - pids are reused), or
    any host: its heartbeat is older than `stale_after_s` (default 10 min). This is the
    only test possible for a lock written on another host (e.g. a preempted TPU VM).
- Multi-process runs: process 0 holds the lock for the whole run; the others learn the
  outcome from it (`hold`'s `agree`: the training loop's broadcast) and refuse with it."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import os
import secrets
import socket
import threading
import time
from typing import Any, Callable, Iterator, Optional

from etils import epath
import fsspec

from hypernet_attention import errors
from hypernet_attention.runs import run_files

LOCK_FILE = "lock.json"
HEARTBEAT_S = 60.0
STALE_AFTER_S = 600.0


@dataclasses.dataclass(frozen=True)
class Holder:
  """Who holds a lock, as its lock file records it."""
  host: str
  pid: int
  proc_start: Optional[str]
  start_time: float
  heartbeat: float
  token: str

  def describe(self, now: float) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.start_time))
    return (f"host {self.host}, pid {self.pid}, started {started}, heartbeat "
            f"{max(now - self.heartbeat, 0):.0f} s ago")


def _proc_start(pid: int) -> Optional[str]:
  """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), which
  tells a reused pid from the original; None where /proc is absent or the pid is gone."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def pid_alive(pid: int) -> bool:
  """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True  # Another user's process.
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
  except (OSError, IndexError):
    return True  # No /proc: kill(0) is all we know.


def is_stale(holder: Holder, now: float, stale_after_s: float = STALE_AFTER_S,
             host: Optional[str] = None) -> bool:
  """Whether `holder`'s process is known dead (same host) or silent too long (any host)."""
  if now - holder.heartbeat > stale_after_s:
    return True
  if holder.host != (host or socket.gethostname()):
    return False
  if not pid_alive(holder.pid):
    return True
  current = _proc_start(holder.pid)
  return bool(holder.proc_start and current and current != holder.proc_start)


def read_holder(path: epath.Path) -> Optional[Holder]:
  """The lock file's holder; None if there is no lock file or it is unreadable."""
  try:
    record = json.loads(path.read_text())
    return Holder(**{f.name: record[f.name] for f in dataclasses.fields(Holder)})
  except (OSError, ValueError, KeyError, TypeError):
    return None


def _create_exclusive(path: epath.Path, text: str) -> bool:
  """Creates `path` holding `text` unless it exists (False), atomically: of two racing
  writers one wins. On GCS gcsfs's mode="create" is the `ifGenerationMatch=0` upload."""
  if not run_files.is_remote(str(path)):
    try:
      fd = os.open(os.fspath(path), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
      return False
    with os.fdopen(fd, "w") as f:
      f.write(text)
    return True
  fs, key = fsspec.core.url_to_fs(str(path))
  try:
    fs.pipe_file(key, text.encode(), mode="create")
  except FileExistsError:
    return False
  return True


class WorkdirLock:
  """`with WorkdirLock(workdir):` holds `<workdir>/lock.json` (see the module docstring).

  Raises `errors.BadInput` naming the holder when another live process holds it."""

  def __init__(self, workdir: str, *, heartbeat_s: float = HEARTBEAT_S,
               stale_after_s: float = STALE_AFTER_S):
    self.path = epath.Path(workdir) / LOCK_FILE
    self.heartbeat_s, self.stale_after_s = heartbeat_s, stale_after_s
    self.token = secrets.token_hex(8)
    self._stop = threading.Event()
    self._thread: Optional[threading.Thread] = None
    self._held = False

  def _record(self, start_time: float) -> dict[str, Any]:
    return dict(host=socket.gethostname(), pid=os.getpid(), proc_start=_proc_start(os.getpid()),
                start_time=start_time, heartbeat=time.time(), token=self.token)

  def acquire(self) -> "WorkdirLock":
    """Takes the lock (a stale one is taken over), or raises `BadInput` naming its holder."""
    self.path.parent.mkdir(parents=True, exist_ok=True)
    start = time.time()
    for _ in range(3):
      if _create_exclusive(self.path, json.dumps(self._record(start))):
        self._held = True
        self._start_heartbeat(start)
        atexit.register(self.release)
        return self
      holder, now = read_holder(self.path), time.time()
      if holder is None:
        if not self.path.exists():
          continue  # Released between our attempts.
        if now - self.path.stat().mtime < self.stale_after_s:
          raise errors.BadInput(
              f"workdir {str(self.path.parent)!r} has an unreadable lock file {self.path} less "
              f"than {self.stale_after_s:.0f} s old (a trainer is starting there?); allowed: one "
              "training process per workdir: wait, or remove it if no trainer runs")
      elif holder.heartbeat > now + self.heartbeat_s and not is_stale(
          holder, now, self.stale_after_s):
        raise errors.BadInput(
            f"workdir {str(self.path.parent)!r} has a lock whose heartbeat is "
            f"{holder.heartbeat - now:.0f} s in the future ({holder.describe(holder.heartbeat)};"
            f" the clocks of this host and {holder.host} differ); allowed: if no trainer runs "
            f"there, remove {self.path}, else wait for it to end")
      elif not is_stale(holder, now, self.stale_after_s):
        raise errors.BadInput(
            f"workdir {str(self.path.parent)!r} is in use by another training process "
            f"({holder.describe(now)}; lock {self.path}); allowed: one training process per "
            "workdir: wait for it to end, stop it, or pass another --workdir")
      self.path.unlink(missing_ok=True)  # Stale: its holder is gone.
    raise errors.BadInput(f"could not take the lock {self.path}: other processes keep "
                              "taking it; allowed: one training process per workdir")

  def _start_heartbeat(self, start: float) -> None:
    def beat():
      while not self._stop.wait(self.heartbeat_s):
        try:
          tmp = self.path.parent / f"{LOCK_FILE}.{self.token}.tmp"
          tmp.write_text(json.dumps(self._record(start)))
          tmp.replace(self.path)
        except OSError:
          pass  # The next beat retries; a lock silent for stale_after_s may be taken over.
    self._thread = threading.Thread(target=beat, name="workdir-lock-heartbeat", daemon=True)
    self._thread.start()

  def release(self) -> None:
    """Stops the heartbeat and removes the lock file if it is still ours. Idempotent."""
    if not self._held:
      return
    self._held = False
    self._stop.set()
    if self._thread is not None:
      self._thread.join(timeout=10)
    holder = read_holder(self.path)
    if holder is not None and holder.token == self.token:
      self.path.unlink(missing_ok=True)
    atexit.unregister(self.release)

  def __enter__(self) -> "WorkdirLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()


def check_writable(directory: str) -> None:
  """Creates `directory` if needed and writes and removes a probe file there; raises
  `BadInput` naming it if that fails (so a read-only checkpoints/ is found at the start,
  not at the first save)."""
  path = epath.Path(directory)
  probe = path / f".write_probe_{os.getpid()}_{secrets.token_hex(4)}"
  try:
    path.mkdir(parents=True, exist_ok=True)
    probe.write_text("probe")
    probe.unlink()
  except OSError as e:
    raise errors.BadInput(
        f"{directory!r} is not writable ({e.strerror or e}); allowed: a directory this "
        "process can write to (fix its permissions, or pass another --workdir)") from None


@contextlib.contextmanager
def hold(workdir: str, chief: bool = True,
         agree: Optional[Callable[[bool], bool]] = None) -> Iterator[WorkdirLock]:
  """Holds `workdir`'s lock for the block, released however the block ends.

  Several processes (no JAX here: the training loop passes its collective): the `chief`
  takes the lock and `agree(held)` tells every process whether it did, so all refuse
  together; None for a single process."""
  lock, error = WorkdirLock(workdir), None
  if chief:
    try:
      lock.acquire()
    except errors.BadInput as e:
      error = e
  if agree is not None:
    held = agree(error is None)
    if error is None and not held:
      error = errors.BadInput(f"workdir {workdir!r} is in use by another training process (process "
                                  "0 found its lock); allowed: one training process per workdir")
  if error is not None:
    raise error
  try:
    yield lock
  finally:
    lock.release()
