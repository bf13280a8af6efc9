"""Runs the next cells within a time budget, as subprocesses, and publishes each finished one.

Cells start in priority order while a slot is free and their estimate fits in the time left
(`plan.py`); a cell that does not fit is passed over for a later, smaller one. A cell whose run
outlives the budget anyway gets SIGTERM `stop_margin_s` before the end: the training process
checkpoints and exits 75; its progress and (if small) its resume state are saved beside the cell
files (`partial.py`), so a rerun on any machine resumes it. SIGTERM or Ctrl-C to the runner does the
same to its children; while the runner collects a cell that exited (publishes it, or saves its
resume state) it holds those signals until it is done, so a finished cell always ends as its cell
file and a stopped one as its state. A cell's result comes only from its own run: a workdir (or
resume state) whose recorded config differs from the cell's in any field is moved aside (never
deleted, never published), and so is a finished one that --redo retrains.
Every few seconds `<root>/progress.txt` says what runs, how far it is and what is left,
for a second command to read (`cat`), e.g. while the runner was started with setsid nohup."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Optional, Sequence

from hypernet_attention import errors
from hypernet_attention.runs import children
from hypernet_attention.runs import cli
from hypernet_attention.runs import machine
from hypernet_attention.runs import run_files
from launch import jobs
from launch import run_local
from launch import sweeps
from launch.campaign import cells as cells_lib
from launch.campaign import collect_cell
from launch.campaign import partial
from launch.campaign import plan
from launch.campaign import records

PROGRESS = "progress.txt"
LOG = "campaign.log"
STEP_RE = re.compile(r"step ([\d,]+)/([\d,]+)")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# Tests only: a file path; at the publish point the runner creates it and waits until it is
# deleted (at most `PAUSE_LIMIT_S`), so that a test can send a real signal exactly there.
PAUSE_ENV = "HYPERNET_ATTENTION_CAMPAIGN_PUBLISH_PAUSE"
PAUSE_LIMIT_S = 600.0


@dataclasses.dataclass(frozen=True)
class Options:
  root: str  # Workdirs: <root>/<cell>.
  results_dir: str  # Cell files.
  budget_s: float
  redo: frozenset = frozenset()
  max_concurrent: int = 1
  stop_margin_s: float = 120.0  # SIGTERM a running cell this long before the budget ends.
  poll_s: float = 5.0
  # How long a stopped cell may take to checkpoint and exit before it is killed: the
  # trainer's own bound is its preemption grace (30 s by default) plus a save. Whoever stops
  # the runner must allow it longer (launch/device_window.sh's kill grace).
  stop_wait_s: float = 90.0


@dataclasses.dataclass(frozen=True)
class Outcome:
  cell: str
  status: str  # finished, failed, stopped (cut off: resumable), skipped, done (before)
  detail: str = ""


@dataclasses.dataclass
class _Running:
  cell: cells_lib.Cell
  process: subprocess.Popen
  started: float
  log_path: str
  commit: str  # The code it runs (`git describe --dirty` when it started).
  first: Optional[tuple[float, int]] = None  # (time, step) when progress was first seen.
  resumed_from: Optional[str] = None  # The partial/ state it was unpacked from, if any.


def device_info() -> dict[str, Any]:
  """The accelerator the cells will run on, asked of jax in a subprocess (this module stays
  importable where JAX is not installed)."""
  code = ("import jax, json; d = jax.devices()[0]; print(json.dumps(dict(platform=d.platform, "
          "kind=d.device_kind, count=jax.device_count(), jax_version=jax.__version__)))")
  out = children.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def command(cell: cells_lib.Cell, workdir: str, options: Options) -> list[str]:
  if cell.kind == "train":
    return jobs.local_command(sys.executable, cell.point(), cell.experiment, workdir)
  if cell.kind == "probe":
    source = cells_lib.BY_NAME[cell.source]
    directory = source_dir(cell, options) or os.path.join(options.root, source.name)
    return [sys.executable, "experiments/probe_latents.py",
            *[f"--workdir={os.path.join(directory, n)}" for n in source.member_names],
            f"--output_dir={os.path.join(workdir, 'probe')}", *_flags(cell.overrides)]
  return [sys.executable, "experiments/benchmark_training.py", f"--experiment={cell.experiment}",
          f"--size={cell.config}", f"--models={','.join(cell.models)}",
          f"--steps={cell.num_steps}", "--repeats=3",
          f"--data_dir={os.path.join(workdir, 'data')}", *_flags(cell.overrides)]


def _flags(overrides) -> list[str]:
  """A probe or benchmark cell's `overrides` as its script's flags (True: a bare switch)."""
  return [f"--{flag}" if value is True else f"--{flag}={value}" for flag, value in overrides]


def foreign(cell: cells_lib.Cell, directory: str) -> Optional[str]:
  """Why `directory` does not hold train cell `cell`'s own run (the first field in which
  the config.json it records differs from the cell's: `cells.run_differences`), or None:
  it does, or it holds no config yet (a run that had not started)."""
  try:
    recorded = run_files.read_config(directory)
    finished = run_files.is_finished(directory)
  except ValueError as e:  # An unreadable config.json or population_summary.json.
    return str(e)
  if recorded is None:
    return f"{directory} holds results but no {run_files.CONFIG}" if finished else None
  different = cells_lib.run_differences(cell, recorded)
  return (f"{directory} holds another run than {cell.name}'s: its {run_files.CONFIG} differs "
          f"in {different[0]} (recorded -> the cell's)" if different else None)


def set_aside(directory: str) -> str:
  """Renames `directory` to a free `<directory>.aside-<UTC time>` beside it (a run is never
  deleted); the new path."""
  base = f"{directory}.aside-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
  target = next(t for t in (base + (f"-{n}" if n else "") for n in itertools.count())
                if not os.path.exists(t))
  os.rename(directory, target)
  return target


@contextlib.contextmanager
def signals_held(on_signal: Callable[[], None] = lambda: None):
  """Runs the block with SIGTERM and SIGINT held: each is noted (and `on_signal` called:
  it may only send signals, as a handler must not log), then the first that the handler
  in place does not ignore is delivered to it, once the block has ended. Main thread only."""
  caught = []

  def note(signum, frame):
    del frame
    caught.append(signum)
    on_signal()

  previous = {s: signal.signal(s, note) for s in STOP_SIGNALS}
  try:
    yield
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
    # The first caught signal that its restored handler does not ignore: a runner started
    # with SIGINT ignored (a background job of a non-interactive shell, nohup) must still
    # stop on the SIGTERM.
    delivered = [s for s in caught if previous[s] != signal.SIG_IGN]
    if delivered:
      signal.raise_signal(delivered[0])


def _pause_for_tests() -> None:
  flag = os.environ.get(PAUSE_ENV)
  if not flag:
    return
  with open(flag, "w"):
    pass
  deadline = time.time() + PAUSE_LIMIT_S
  while os.path.exists(flag) and time.time() < deadline:
    time.sleep(0.1)


def _find_source(cell: cells_lib.Cell, options: Options) -> tuple[Optional[str], Optional[str]]:
  """(`source_dir`, None), or (None, `blocker`'s reason: where the source run may be, its
  workdir here or its kept parameters, and why each place that holds a run holds another)."""
  source = cells_lib.BY_NAME[cell.source]
  workdir = os.path.join(options.root, cell.source)
  kept = records.kept_params_dir(options.results_dir, cell.source)
  reasons = []
  for directory in (workdir, kept):
    why = foreign(source, directory) if os.path.isdir(directory) else None
    if why is None and run_files.is_finished(directory):
      return directory, None
    reasons += [why] if why else []
  return None, (f"needs {cell.source}'s kept parameters ({kept}) or its finished workdir "
                f"({workdir})" + "".join(f"; {why}" for why in reasons))


def source_dir(cell: cells_lib.Cell, options: Options) -> Optional[str]:
  """A probe cell's source run: its finished workdir here, else its kept parameters (any
  machine: they are committed beside the cell files), each only if it is the source cell's
  own run; None if neither is."""
  return _find_source(cell, options)[0]


def blocker(cell: cells_lib.Cell, options: Options) -> Optional[str]:
  """Why `cell` cannot run on this machine now (None: it can)."""
  return _find_source(cell, options)[1] if cell.kind == "probe" else None


def _tail(log_path: str, size: int = 20_000) -> Optional[str]:
  """The last `size` bytes of a (possibly growing) log as text; None if it cannot be read."""
  try:
    with open(log_path, "rb") as f:
      f.seek(max(0, os.path.getsize(log_path) - size))
      return f.read().decode(errors="replace")
  except OSError:
    return None


def _last_line(log_path: str, limit: int = 400) -> str:
  """The log's last non-empty line (a tool's one-line error), cut to `limit` characters."""
  tail = _tail(log_path)
  if tail is None:
    return "no log"
  lines = [l.strip() for l in tail.splitlines() if l.strip()]
  line = lines[-1] if lines else "empty log"
  return line if len(line) <= limit else line[:limit] + "..."


def _step_of(log_path: str) -> Optional[tuple[int, int]]:
  found = STEP_RE.findall(_tail(log_path) or "")
  return (int(found[-1][0].replace(",", "")), int(found[-1][1].replace(",", ""))) if found else None


class Campaign:
  """One invocation: starts, watches and publishes cells until the plan or budget ends."""

  def __init__(self, cells: Sequence[cells_lib.Cell], options: Options,
               device: dict[str, Any], log: Callable[[str], None] = print):
    self.options, self.device, self.log = options, device, log
    self.pending = list(cells)
    self.running: dict[str, _Running] = {}
    self.outcomes: list[Outcome] = []
    self.start = time.time()
    self.deadline = self.start + options.budget_s
    self.stopping = False
    self.stopped_at = 0.0
    self.records = list(records.read_all(options.results_dir).values())
    self.partials = partial.read_all(options.results_dir)  # Cut-off cells' rates so far.

  def workdir(self, cell: cells_lib.Cell) -> str:
    return os.path.join(self.options.root, cell.name)

  def _end(self, cell, status, detail=""):
    self.outcomes.append(Outcome(cell.name, status, detail))
    if status != "done":
      self.log(f"{status}: {cell.name}{f' ({detail})' if detail else ''}")

  def _keep_params(self, cell: cells_lib.Cell) -> dict[str, Any]:
    """Keeps a finished train cell's final parameters beside its file (`kept_params_dir`),
    in a subprocess (this module imports no JAX); the record's fields saying where, or why
    not. Not kept is a note, not a failure: the metrics are still the cell's result."""
    out = records.kept_params_dir(self.options.results_dir, cell.name)
    argv = [sys.executable, "experiments/export_params.py",
            f"--workdir={self.workdir(cell)}", f"--output_dir={out}",
            f"--max_mib={partial.MAX_STATE_BYTES / 2**20:g}"]
    try:  # In a session of its own: a stop sent to the window's process group (timeout(1))
      # waits for the publish (`signals_held`) instead of failing its export; it still dies
      # with this runner (`children.run`).
      done = children.run(argv, cwd=sweeps.REPO, capture_output=True, text=True,
                          timeout=600, env=run_local.child_env(1), start_new_session=True)
    except subprocess.TimeoutExpired:
      return {"params": None, "params_note": "export_params.py timed out after 600 s"}
    if done.returncode != 0:
      lines = [l for l in (done.stderr + done.stdout).splitlines() if l.strip()]
      note = lines[-1][:400] if lines else f"exit {done.returncode}"
      self.log(f"{cell.name}: final parameters not kept ({note})")
      return {"params": None, "params_note": note}
    return {"params": os.path.relpath(out, self.options.results_dir)}

  def _forward_stop(self) -> None:
    """A stop that arrives while signals are held, sent on to the running cells at once
    (in a signal handler: kill(2) only, no log)."""
    for run in list(self.running.values()):
      run.process.send_signal(signal.SIGTERM)

  def _publish(self, cell: cells_lib.Cell) -> None:
    """Publishes `cell`'s finished workdir as its cell file, whole: a stop meanwhile waits
    (the caller holds the signals)."""
    record = collect_cell.BUILDERS[cell.kind](cell, self.workdir(cell), self.device)
    if cell.kind == "train":
      record.update(self._keep_params(cell))
    _pause_for_tests()
    replace = cell.name in self.options.redo
    if records.publish(self.options.results_dir, record, replace=replace):
      self.records.append(record)
      partial.forget(self.options.results_dir, cell.name)
      self._end(cell, "finished", f"{record['wall_s'] / 60:.1f} min, "
                f"{records.path_of(self.options.results_dir, cell.name)}")
    else:
      self._end(cell, "skipped", "another runner published it first; kept its file")

  def _try_start(self, cell: cells_lib.Cell) -> bool:
    """Starts `cell` (True), or ends it as done / skipped / failed, or publishes a run that
    finished before (False: removed from the plan)."""
    path = records.path_of(self.options.results_dir, cell.name)
    if os.path.exists(path) and cell.name not in self.options.redo:
      self._end(cell, "done")
      return False
    reason = blocker(cell, self.options)
    if reason:
      self._end(cell, "skipped", reason)
      return False
    with signals_held(self._forward_stop):  # Claimed, then published or started, whole.
      held = records.claim(self.options.results_dir, cell.name)  # Before the workdir is used.
      if held:
        self._end(cell, "skipped", f"claimed by pid {held.get('pid')} on {held.get('host')}")
        return False
      started = False
      try:
        started = self._start(cell)
      finally:
        if not started:
          records.release(self.options.results_dir, cell.name)
      return started

  def _clear_workdir(self, cell: cells_lib.Cell, workdir: str) -> None:
    """Moves `workdir` aside (one line says where) when it holds another run than the
    cell's, or a finished run that --redo retrains; the cell then starts afresh (or
    resumes from its saved state)."""
    why = foreign(cell, workdir) if os.path.isdir(workdir) else None
    if why is None and cell.name in self.options.redo and run_files.is_finished(workdir):
      why = f"--redo={cell.name} retrains the finished run in {workdir}"
    if why:
      self.log(f"{cell.name}: {why}; moved it to {set_aside(workdir)} (kept, not used)")

  def _start(self, cell: cells_lib.Cell) -> bool:
    """`_try_start` once the cell is claimed."""
    workdir = self.workdir(cell)
    resumed_from = None
    if cell.kind == "train":
      self._clear_workdir(cell, workdir)
      try:
        resumed = partial.restore(cell, workdir, self.options.results_dir)
      except errors.BadInput as e:  # Another cell's state, or a damaged file: never run it.
        self._end(cell, "failed", str(e))
        return False
      resumed_from = partial.paths(self.options.results_dir, cell.name)[1] if resumed else None
      if resumed:
        self.log(f"{cell.name}: resumes at step {resumed:,} from the state an earlier "
                 f"window saved ({resumed_from})")
    finished = cell.kind == "train" and run_files.is_finished(workdir)
    if finished:  # Trained before and its own run (a cut-off publish, a runner's crash).
      self._publish(cell)
      return False
    estimate = plan.estimate(cell, self.device["kind"], self.records, workdir,
                             self.partials.get(cell.name))
    left = self.deadline - time.time() - self.options.stop_margin_s
    if estimate is None or estimate.minutes * 60 > left:
      need = plan.fmt_minutes(estimate.minutes if estimate else None)
      resumable = ("; a larger --budget_minutes starts it: a stop before the end saves its "
                   "state to resume" if cell.kind == "train" else "")
      self._end(cell, "skipped", f"needs ~{need} min, {max(left, 0) / 60:.0f} left{resumable}")
      return False
    os.makedirs(workdir, exist_ok=True)
    argv = command(cell, workdir, self.options)
    log_path = os.path.join(workdir, "benchmark.log" if cell.kind == "benchmark" else LOG)
    with open(log_path, "a") as f:
      f.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC: "
              f"{jobs.shell_line(argv)}\n")
      f.flush()
      process = children.spawn(argv, stdout=f, stderr=subprocess.STDOUT, cwd=sweeps.REPO,
                               env=run_local.child_env(self.options.max_concurrent))
    self.running[cell.name] = _Running(cell, process, time.time(), log_path,
                                       collect_cell.commit(sweeps.REPO), resumed_from=resumed_from)
    self.log(f"started: {cell.name} ({len(cell.members) or 1} member(s), "
             f"~{plan.fmt_minutes(estimate.minutes)} min, {estimate.source}; log {log_path})")
    return True

  def _reap(self, run: _Running) -> None:
    """Collects a cell that exited: its cell file, or its progress and resume state, whole
    (a SIGTERM or Ctrl-C meanwhile waits until the claim is released)."""
    with signals_held(self._forward_stop):
      cell, code = run.cell, run.process.returncode
      del self.running[cell.name]
      collect_cell.add_segment(self.workdir(cell), {
          "wall_s": time.time() - run.started, "returncode": code,
          "device_kind": self.device["kind"], "commit": run.commit, "started_utc": time.strftime(
              "%Y-%m-%dT%H:%M:%SZ", time.gmtime(run.started)), "host": machine.host()})
      try:
        if code == 0 and (cell.kind != "train" or run_files.is_finished(self.workdir(cell))):
          self._publish(cell)
          return
        # Stopped (exit 75, or any exit while this runner was stopping it: during compile a
        # trainer may die of the signal itself) or failed: either way, a train cell's newest
        # checkpoint is saved beside the cell files, so no step it paid for is lost.
        step = plan.checkpointed_step(self.workdir(cell))
        saved = ("no checkpoint yet: nothing to resume" if not step
                 else partial.save(cell, self.workdir(cell), self.options.results_dir, self.device)
                 if cell.kind == "train" else "rerun on this machine to resume")
        if code == cli.PREEMPTED_EXIT_CODE or self.stopping:
          self._end(cell, "stopped", f"checkpointed at step {step:,}; {saved}" if step
                    else f"stopped (exit {code}) before its first checkpoint; {saved}")
        else:
          # A run resumed from a committed state that fails (e.g. the code changed the model
          # since): the fix is that state, not "a fresh --workdir" as the trainer says.
          fix = (f"; it resumed from {run.resumed_from}: if that state is the cause, delete it "
                 f"and {self.workdir(cell)} to start afresh" if run.resumed_from else "")
          self._end(cell, "failed", f"exit {code}: {_last_line(run.log_path)}; see "
                    f"{run.log_path}" + (f"; {saved}" if step else "") + fix)
      except (OSError, ValueError, KeyError) as e:
        self._end(cell, "failed", f"could not collect: {e}")
      finally:
        records.release(self.options.results_dir, cell.name)

  def stop_all(self, why: str) -> None:
    if not self.stopping:
      self.log(f"stopping the running cells ({why}): they checkpoint and exit")
      self.stopped_at = time.time()
    self.stopping = True
    for run in self.running.values():
      if run.process.poll() is None:
        run.process.send_signal(signal.SIGTERM)

  def progress_text(self) -> str:
    now = time.time()
    lines = [f"campaign progress at {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(now))} UTC "
             f"on {self.device['kind']} (jax {self.device['jax_version']})",
             f"budget: {(now - self.start) / 60:.1f} of {self.options.budget_s / 60:.1f} min "
             f"used; {max(self.deadline - now, 0) / 60:.1f} left"]
    for run in self.running.values():
      step = _step_of(run.log_path)
      text = f"running: {run.cell.name}, {(now - run.started) / 60:.1f} min"
      if step:
        if run.first is None:
          run.first = (now, step[0])
        t0, s0 = run.first
        rate = (step[0] - s0) / (now - t0) if now > t0 and step[0] > s0 else None
        eta = f", ETA {(step[1] - step[0]) / rate / 60:.0f} min" if rate else ""
        text += (f", step {step[0]:,}/{step[1]:,}"
                 + (f", {rate:.2f} steps/s" if rate else "") + eta)
      lines.append(text)
    for o in self.outcomes:
      if o.status != "done":
        lines.append(f"{o.status}: {o.cell}{f' ({o.detail})' if o.detail else ''}")
    lines.append(f"not started yet: {len(self.pending)} cell(s)")
    return "\n".join(lines) + "\n"

  def write_progress(self) -> None:
    run_files.write_bytes(os.path.join(self.options.root, PROGRESS), self.progress_text().encode())

  def run(self) -> list[Outcome]:
    os.makedirs(self.options.root, exist_ok=True)
    try:
      while self.pending or self.running:
        if not self.stopping and time.time() > self.deadline - self.options.stop_margin_s:
          self.stop_all("the budget ends")
        while (not self.stopping and self.pending
               and len(self.running) < self.options.max_concurrent):
          self._try_start(self.pending.pop(0))
        if self.stopping:
          for cell in self.pending:
            self._end(cell, "skipped", "the budget ended")
          self.pending = []
        for run in list(self.running.values()):
          if run.process.poll() is not None:
            self._reap(run)
        self.write_progress()
        if self.running:
          time.sleep(self.options.poll_s)
    except BaseException:  # SIGTERM (raised by the entry point) or Ctrl-C: children save.
      self._stop_children()
      raise
    return self.outcomes

  def _stop_children(self) -> None:
    """Forwards the stop to every running cell and waits for each, at most `stop_wait_s`
    (then SIGKILL: its newest finalized checkpoint stays), with further SIGTERM / SIGINT
    ignored meanwhile, so that a second signal cannot orphan a trainer or skip the saving
    of its state; progress.txt and the claim files end true."""
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
      self.stop_all("this runner was stopped")
      deadline = self.stopped_at + self.options.stop_wait_s
      for run in list(self.running.values()):
        try:
          run.process.wait(timeout=max(deadline - time.time(), 1.0))
        except subprocess.TimeoutExpired:
          run.process.kill()
          run.process.wait()
          self.log(f"{run.cell.name}: did not exit within {self.options.stop_wait_s:.0f} s of "
                   "SIGTERM; killed (its newest finalized checkpoint is kept)")
        self._reap(run)
      self.write_progress()
    finally:
      for sig, handler in previous.items():
        signal.signal(sig, handler)
