r"""Runs a sweep's points on this machine as subprocesses, N at a time, resumably.

  python -m launch.run_local --sweep=table_a1_fuzzy_local --jobs=1 \
      --root=/work/runs/table_a1_fuzzy_local
  python -m launch.collect --root=/work/runs/table_a1_fuzzy_local --sweep=table_a1_fuzzy_local

Points that differ only in seed, split seed, learning rate, weight decay or warmup are
trained together as one population job (`launch/grouping.py`; `--single_runs` turns that
off, `--members_per_job` caps it, `--dry_run` prints the jobs): each member writes its
config.json and summary.json to `<root>/<population name>/<point name>`, which
`launch.collect` reads like a separate run.

Each point trains in `<root>/<point name>` (`launch.jobs.point_name`), its console output in
`run_local.log` there. A point whose `summary.json` exists is skipped; any other is started with the
same --workdir, so a half-done point resumes from its newest checkpoint (the entry points do that
themselves). So after a crash or Ctrl-C (which stops the running points too), rerun the same
command. The training processes die with this one: SIGTERM or Ctrl-C makes them checkpoint and stop,
and so does a SIGKILL of this process (the kernel sends them SIGTERM, `runs/children.py`); one
workdir never gets two trainers (each holds its workdir's lock, `runs/lock.py`). Each process's wall
and CPU time go to `run_local.json` beside its summary. On one GPU, `--jobs=N` runs N small jobs
side by side, each limited to its share of the GPU memory.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import dataclasses
import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Mapping, Optional, Sequence

from absl import flags
from etils import epath

from hypernet_attention import errors
from hypernet_attention.runs import children
from hypernet_attention.runs import cli
from hypernet_attention.runs import lock
from hypernet_attention.runs import run_files
from launch import grouping
from launch import jobs
from launch import sweeps

LOG = "run_local.log"
TIMES = "run_local.json"


@dataclasses.dataclass(frozen=True)
class Outcome:
  """How one point ended in this invocation."""
  name: str
  status: str  # "skipped" (already finished), "finished" or "failed".
  wall_s: float = 0.0
  cpu_s: float = 0.0
  returncode: int = 0


def is_finished(workdir: str, log=None) -> bool:
  """A run with its summary, or a population whose every member has one
  (`run_files.is_finished`). An unreadable population_summary.json is named (through `log`)
  and its job counts as unfinished: the rerun resumes it and writes the file again."""
  try:
    return run_files.is_finished(workdir)
  except (ValueError, AttributeError, TypeError) as e:
    reason = e.__context__ if isinstance(e, errors.BadInput) and e.__context__ else e
    path = os.path.join(workdir, run_files.POPULATION_SUMMARY)
    (log or print)(f"warning: {path} is not a readable population summary ({reason}); "
                   "rerunning that job")
    return False


def finished_points(root: str) -> set[str]:
  """The names of the finished points under `root`: `<root>/<name>` single runs and
  `<root>/<population>/<name>` members, so that a point trained either way is done."""
  names = set()
  for name in (os.listdir(root) if os.path.isdir(root) else ()):
    workdir = os.path.join(root, name)
    if os.path.exists(os.path.join(workdir, run_files.SUMMARY)):
      names.add(name)
    elif os.path.isdir(workdir):
      names |= {m for m in os.listdir(workdir)
                if os.path.exists(os.path.join(workdir, m, run_files.SUMMARY))}
  return names


def is_done(point: Mapping[str, Any], root: str, finished: set[str], log=None) -> bool:
  """Whether `point` (a run or a population job) needs no training: its workdir finished,
  or each of its points finished as a single run or as another job's member."""
  names = point.get(grouping.NAMES_KEY) or (jobs.point_name(point),)
  return is_finished(os.path.join(root, jobs.point_name(point)), log) or all(
      n in finished for n in names)


def wait_for_previous_trainer(workdir: str, log, timeout_s: float = 600.0) -> None:
  """Waits while a live process on this host holds `workdir`'s lock (`runs/lock.py`): a rerun right
  after a killed run_local finds its trainers still checkpointing on their way out. A lock of a dead
  process is taken over by the trainer itself; after `timeout_s` the trainer names the holder."""
  path, deadline, told = epath.Path(workdir) / lock.LOCK_FILE, time.time() + timeout_s, False
  while time.time() < deadline:
    holder = lock.read_holder(path)  # None: no lock, or an unreadable one.
    if (holder is None or holder.host != socket.gethostname()
        or lock.is_stale(holder, time.time())):
      return
    if not told:
      log(f"waiting for the previous trainer of {os.path.basename(workdir)} (pid "
          f"{holder.pid}) to stop")
      told = True
    time.sleep(1.0)


# Training processes this invocation started and that still run: stopped with it.
_CHILDREN: set[subprocess.Popen] = set()
_CHILDREN_LOCK = threading.Lock()


def stop_children(signum: int = signal.SIGTERM) -> None:
  """Sends `signum` to every running child: SIGTERM makes a trainer checkpoint and exit
  (its preemption path), so a rerun resumes there."""
  with _CHILDREN_LOCK:
    children = list(_CHILDREN)
  for process in children:
    if process.poll() is None:
      try:
        process.send_signal(signum)
      except ProcessLookupError:
        pass


def _on_sigterm(signum, frame) -> None:
  del frame
  stop_children(signum)
  raise KeyboardInterrupt  # Unwinds run_sweep, which waits for the children to finish.


def child_env(num_jobs: int, env: Optional[Mapping[str, str]] = None) -> dict[str, str]:
  """The training processes' environment: with several jobs at once on one GPU, each may
  take only its share of the GPU memory (JAX preallocates 75% per process by default)."""
  env = dict(os.environ if env is None else env)
  if num_jobs > 1:
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", f"{0.9 / num_jobs:.3f}")
  return env


def run_point(point: Mapping[str, Any], experiment: str, root: str,
              env: Optional[Mapping[str, str]] = None, log=print) -> Outcome:
  """Runs one point to completion (or skips it); output goes to `<workdir>/run_local.log`."""
  name = jobs.point_name(point)
  workdir = os.path.join(root, name)
  if is_done(point, root, finished_points(root), log):
    return Outcome(name, "skipped")
  os.makedirs(workdir, exist_ok=True)
  wait_for_previous_trainer(workdir, log)
  argv = jobs.local_command(sys.executable, point, experiment, workdir)
  log(f"started: {name} (console output in its {LOG})")
  start = time.time()
  with open(os.path.join(workdir, LOG), "a") as log:
    log.write(f"# {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC: "
              f"{jobs.shell_line(argv)}\n")
    log.flush()
    process = children.spawn(argv, stdout=log, stderr=subprocess.STDOUT, cwd=sweeps.REPO, env=env)
    with _CHILDREN_LOCK:
      _CHILDREN.add(process)
    try:
      # wait4 gives this child's own CPU time, also when several run at once.
      _, status, usage = os.wait4(process.pid, 0)
    finally:
      with _CHILDREN_LOCK:
        _CHILDREN.discard(process)
    process.returncode = os.waitstatus_to_exitcode(status)
  wall, cpu = time.time() - start, usage.ru_utime + usage.ru_stime
  ok = process.returncode == 0 and run_files.is_finished(workdir)
  times = {"wall_s": wall, "cpu_s": cpu, "returncode": process.returncode}
  with open(os.path.join(workdir, TIMES), "a") as f:
    f.write(json.dumps(times) + "\n")
  return Outcome(name, "finished" if ok else "failed", wall, cpu, process.returncode)


def run_sweep(points: Sequence[Mapping[str, Any]], experiment: str, root: str,
              num_jobs: int = 1, log=print) -> list[Outcome]:
  """Runs every point (`num_jobs` at a time), printing one line per point as it ends; `BadInput`
  for fewer than 1, before anything is read or started (the one check of `--jobs`)."""
  if num_jobs < 1:
    raise errors.BadInput(f"--jobs={num_jobs}; allowed: an integer >= 1")
  finished = finished_points(root)
  done = sum(is_done(p, root, finished, log) for p in points)
  log(f"{len(points)} points in {root}: {done} already finished, running the other "
      f"{len(points) - done}, {num_jobs} at a time")
  outcomes = []
  atexit.register(stop_children)
  with concurrent.futures.ThreadPoolExecutor(num_jobs) as pool:
    env = child_env(num_jobs)
    futures = [pool.submit(run_point, p, experiment, root, env=env, log=log)
               for p in points]
    try:
      for future in concurrent.futures.as_completed(futures):
        outcome = future.result()
        outcomes.append(outcome)
        if outcome.status != "skipped":
          log(f"[{len(outcomes)}/{len(points)}] {outcome.status}: {outcome.name} "
              f"({outcome.wall_s / 60:.1f} min wall, {outcome.cpu_s / 60:.1f} min CPU"
              + ("" if outcome.status == "finished"
                 else f", exit {outcome.returncode}, see {LOG}") + ")")
    except BaseException:  # Ctrl-C or SIGTERM: the children checkpoint and stop too.
      for future in futures:
        future.cancel()
      stop_children()
      raise
  return outcomes


def summary_line(outcomes: Sequence[Outcome], wall_s: float) -> str:
  count = {s: sum(o.status == s for o in outcomes) for s in ("finished", "skipped", "failed")}
  cpu = sum(o.cpu_s for o in outcomes)
  return (f"{count['finished']} finished, {count['skipped']} skipped (done before), "
          f"{count['failed']} failed; {wall_s / 60:.1f} min wall, {cpu / 60:.1f} min CPU "
          f"in training processes")


def _define_flags() -> None:
  """Defined only when run as a program, so that other tools can import this module."""
  flags.DEFINE_enum("sweep", None, sweeps.SWEEPS, "Which sweep to run.")
  flags.DEFINE_string("root", None, "Workdir root (default ./workdirs/<sweep>).")
  flags.DEFINE_integer("jobs", 1, "Points run at the same time.")
  flags.DEFINE_integer("max_jobs", None, "Run only the first N points (before grouping).")
  define_population_flags()


def define_population_flags() -> None:
  """The grouping flags `run_local` and `xm_launch` share."""
  flags.DEFINE_bool("single_runs", False, "One job per point instead of populations.")
  flags.DEFINE_integer("members_per_job", None, "Cap on population members per job "
                       "(default: from a memory estimate, see --member_memory_gib).")
  flags.DEFINE_float("member_memory_gib", 16.0, "Device memory a population job may use "
                     "(sets the default --members_per_job).")
  flags.DEFINE_bool("dry_run", False, "Print the jobs (populations and their members), run "
                    "nothing.")


@dataclasses.dataclass(frozen=True)
class Grouping:
  """How a launcher turns points into jobs (the flags of `define_population_flags`)."""
  single_runs: bool = False
  members_per_job: Optional[int] = None
  member_memory_gib: float = 16.0

  @classmethod
  def from_flags(cls) -> "Grouping":
    f = flags.FLAGS
    return cls(f.single_runs, f.members_per_job, f.member_memory_gib)

  def __post_init__(self):
    """`BadInput` for a cap or memory budget that cannot size a job."""
    if self.members_per_job is not None and self.members_per_job < 1:
      raise errors.BadInput(f"--members_per_job={self.members_per_job}; allowed: an "
                                "integer >= 1 (or leave it out: sized by --member_memory_gib)")
    if not (math.isfinite(self.member_memory_gib) and self.member_memory_gib > 0):
      raise errors.BadInput(f"--member_memory_gib={self.member_memory_gib}; allowed: a "
                                "finite number of GiB > 0")


def sweep_jobs(sweep, max_points: Optional[int] = None,
               how: Grouping = Grouping()) -> list[dict[str, Any]]:
  """The sweep's first `max_points` points as jobs: populations unless `single_runs`."""
  points = sweep.get_sweep()[:max_points]
  if how.single_runs:
    return points
  return jobs.populations(points, sweep.EXPERIMENT, how.members_per_job, how.member_memory_gib)


def grouping_lines(sweep_name: str, points: Sequence[Mapping[str, Any]],
                   job_points: Sequence[Mapping[str, Any]]) -> list[str]:
  """`--dry_run`: one line per job with its member count, then the totals."""
  lines = []
  for point in job_points:
    members = len(point.get("population.members", ())) or 1
    lines.append(f"{jobs.point_name(point)}  # {members} member{'s' * (members > 1)}")
  lines.append(f"# sweep {sweep_name}: {len(job_points)} jobs for {len(points)} points")
  return lines


def main(argv: list[str]) -> Optional[int]:
  del argv
  f = flags.FLAGS
  if f.sweep is None:
    raise errors.BadInput(f"--sweep is required; allowed: {', '.join(sweeps.SWEEPS)}")
  if f.max_jobs is not None and f.max_jobs < 1:
    raise errors.BadInput(f"--max_jobs={f.max_jobs}; allowed: an integer >= 1")
  if f.root is not None and not f.root.strip():
    raise errors.BadInput("--root=''; allowed: a directory path (or leave it out)")
  sweep = sweeps.load(f.sweep)
  points = sweep_jobs(sweep, f.max_jobs, Grouping.from_flags())
  if f.dry_run:
    print("\n".join(grouping_lines(f.sweep, sweep.get_sweep()[: f.max_jobs], points)))
    return 0
  root = str(run_files.check_output_dir(f.root or os.path.join("workdirs", f.sweep), "--root"))
  signal.signal(signal.SIGTERM, _on_sigterm)
  start = time.time()
  outcomes = run_sweep(points, sweep.EXPERIMENT, root, f.jobs)
  print(summary_line(outcomes, time.time() - start))
  return 1 if any(o.status == "failed" for o in outcomes) else 0


if __name__ == "__main__":
  _define_flags()
  cli.run(main)
