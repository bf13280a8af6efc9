"""Shared helpers for the training tests (not a test module).

Compilation dominates these tests on a 2-core CPU: the suite's persistent compilation cache
(tests/conftest.py) reaches their subprocesses through the environment they inherit.

Subprocesses are waited for on their progress, never against a wall clock that a loaded
machine exceeds: `run` (for `subprocess.run`) and `reap` / `wait_for` (for `Popen`s) give
up only when a process and everything it started have used no CPU time and written no
output for `IDLE_S` seconds. `run` and `started` (for a `Popen` in a `with`) put the process
in a group of its own and kill the group on any exit, the test's failure included.
"""

import contextlib
import fcntl
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# The folder of the shared helpers (this file): subprocesses put it on sys.path to import them.
TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
if REPO not in sys.path:
  sys.path.insert(0, REPO)

# pylint: disable=wrong-import-position
# Re-exported: tests reach the experiment configs as tl.sraven_config, tl.fuzzy_config.
from experiments.configs import fuzzy_logic as fuzzy_config  # noqa: E402, F401
from experiments.configs import sraven as sraven_config  # noqa: E402, F401
from hypernet_attention import transformer  # noqa: E402
from hypernet_attention.runs import config_checks
from hypernet_attention.runs import registry  # noqa: E402

# pylint: enable=wrong-import-position


@contextlib.contextmanager
def multiprocess_slot():
  """At most one multi-process test at a time across pytest-xdist workers.

  Two of them at once on a 2-core machine start their processes seconds apart, and gloo's
  context setup (30 s deadline) then times out.
  """
  with open(os.path.join(tempfile.gettempdir(), "hypernet_attention_multiprocess.lock"),
            "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


# How long a waited-for process may make no progress at all (no CPU time in it or its
# children, no output) before it counts as stuck: far above any pause of a working process
# (a compile uses CPU time; a process waiting on a peer waits on one that works).
IDLE_S = 300


def _cpu_ticks(pids) -> int | None:
  """CPU clock ticks used so far by `pids` and their descendants, those they reaped
  included (/proc); None where there is no /proc (then only output counts as progress)."""
  if not os.path.isdir("/proc"):
    return None
  children, ticks = {}, {}
  for entry in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{entry}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()  # After "pid (command)".
    except (OSError, IndexError):
      continue  # Not a process, or gone meanwhile.
    children.setdefault(int(fields[1]), []).append(int(entry))
    ticks[int(entry)] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
  total, todo = 0, list(pids)
  while todo:
    pid = todo.pop()
    total += ticks.get(pid, 0)
    todo += children.get(pid, [])
  return total


def _size(output) -> int:
  try:
    return os.fstat(output.fileno()).st_size if hasattr(output, "fileno") else (
        os.path.getsize(output))
  except (OSError, ValueError):
    return -1


def kill_group(proc: subprocess.Popen) -> None:
  """Kills the process group of `proc` (started with `start_new_session=True`): whatever it
  started too, also when the test fails or is interrupted."""
  with contextlib.suppress(ProcessLookupError):
    os.killpg(proc.pid, signal.SIGKILL)
  proc.wait()


@contextlib.contextmanager
def started(args, **kwargs):
  """`subprocess.Popen(args, **kwargs)` for the block, in a process group of its own that
  is killed whole however the block ends."""
  proc = subprocess.Popen(args, start_new_session=True, **kwargs)
  try:
    yield proc
  finally:
    kill_group(proc)


def _kill(proc) -> None:
  """Kills a `Popen` (and reaps it) or a process id not started here."""
  if isinstance(proc, int):
    with contextlib.suppress(ProcessLookupError):
      os.kill(proc, signal.SIGKILL)
  elif proc.poll() is None:
    proc.kill()
    proc.wait()


def wait_until(done, procs, what: str, outputs=(), idle_s: float = IDLE_S,
               poll_s: float = 0.25):
  """Polls `done()` every `poll_s` seconds until it is true, for as long as `procs` (`Popen`s
  or process ids) progress: CPU time used by them or their descendants, or growth of
  `outputs` (open files or paths). After `idle_s` seconds without either, kills `procs`
  and fails naming `what`."""
  last, since, sampled = None, time.monotonic(), -math.inf
  while not done():
    if time.monotonic() - sampled >= 1.0:  # /proc is read once a second at most.
      sampled = time.monotonic()
      pids = [p if isinstance(p, int) else p.pid for p in procs
              if isinstance(p, int) or p.poll() is None]
      now = (_cpu_ticks(pids), [_size(output) for output in outputs])
      if now != last:
        last, since = now, sampled
      elif sampled - since > idle_s:
        for proc in procs:
          _kill(proc)
        pytest.fail(f"{what}: no progress (no CPU time, no output) for {idle_s:.0f} s; "
                    "killed", pytrace=False)
    time.sleep(poll_s)


def wait_for(procs, what: str, outputs=(), idle_s: float = IDLE_S) -> None:
  """Waits for every process of `procs` to exit, as long as they progress (`wait_until`)."""
  wait_until(lambda: all(proc.poll() is not None for proc in procs), procs, what, outputs,
             idle_s)


# How long the peers of a process that failed may take to end by themselves (a collective
# with it fails at once: "Connection closed by peer") before they are killed.
PEERS_END_S = 60


def reap(procs, what: str = "the helper processes", idle_s: float = IDLE_S,
         stacks_signal: int | None = None) -> list[str]:
  """Waits for every (process, open log file) pair while they progress (`wait_until`), killing
  them all when they stop; closes the logs and returns their texts.

  With `stacks_signal` (for helpers that register `faulthandler` on it), once one process has
  failed each other one still running is sent it at once, so that its log shows where each
  of its threads waits (the half of a multi-process hang that the failing process's own
  traceback cannot show), and gets `PEERS_END_S` to end by itself before it is killed."""
  failed_at = None

  def done() -> bool:
    nonlocal failed_at
    codes = [proc.poll() for proc, _ in procs]
    if None not in codes:
      return True
    if stacks_signal is None:
      return False
    if failed_at is None and any(code not in (None, 0) for code in codes):
      failed_at = time.monotonic()
      for (proc, _), code in zip(procs, codes):
        if code is None:
          with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, stacks_signal)
    return failed_at is not None and time.monotonic() - failed_at > PEERS_END_S

  try:
    wait_until(done, [proc for proc, _ in procs], what, [log for _, log in procs], idle_s)
  finally:
    texts = []
    for proc, log in procs:
      _kill(proc)
      log.close()
      with open(log.name) as f:
        texts.append(f.read())
  return texts


def tails(texts: list[str], chars: int = 3000) -> str:
  """Every process's log tail (from `reap`), for a failure message: a failure between
  processes has a side in each."""
  return "\n".join(f"--- process {i}: {text[-chars:]}" for i, text in enumerate(texts))


def run(args, *, capture_output: bool = False, text: bool = False, check: bool = False,
        idle_s: float = IDLE_S, **kwargs) -> subprocess.CompletedProcess:
  """`subprocess.run(args, ...)` without a wall-clock `timeout`: waits while the process
  progresses (`wait_for`), and fails naming the command when it stops."""
  with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
    streams = dict(stdout=out, stderr=err) if capture_output else {}
    proc = subprocess.Popen(args, **streams, start_new_session=True, **kwargs)
    try:
      words = [args] if isinstance(args, (str, os.PathLike)) else args
      command = " ".join(str(a).strip().splitlines()[0][:80] for a in words if str(a).strip())
      wait_for([proc], f"command {command}", (out, err), idle_s)
    finally:
      kill_group(proc)
    captured = []
    for stream in (out, err):
      stream.seek(0)
      data = stream.read() if capture_output else None
      captured.append(data.decode("utf-8", "replace") if text and data is not None else data)
  result = subprocess.CompletedProcess(args, proc.returncode, *captured)
  if check:
    result.check_returncode()
  return result


# How long a CPU collective of a multi-process test waits for its peers before failing
# (XLA's own default, 1,800 s, made one hang cost CI 30 minutes). Far above a peer's
# legitimate lag: a compilation, a checkpoint, a loaded machine.
COLLECTIVE_TIMEOUT_S = 300


def subprocess_env() -> dict:
  env = dict(os.environ)
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  env.pop("XLA_FLAGS", None)
  return env


def multiprocess_env() -> dict:
  """`subprocess_env` for the processes of one multi-process run. Only theirs: an XLA flag is
  part of the compilation cache's key, which the single-process subprocesses share with the
  suite."""
  return dict(subprocess_env(),
              XLA_FLAGS=f"--xla_cpu_collective_timeout_seconds={COLLECTIVE_TIMEOUT_S}")


def run_on_cpu_devices(script: str, devices: int, *args: str) -> dict:
  """`python -c script *args` with `devices` fake CPU devices (jax's own option, which must be
  set before jax starts: so in a subprocess); the JSON object its last line prints."""
  env = dict(subprocess_env(), JAX_NUM_CPU_DEVICES=str(devices), JAX_PLATFORMS="cpu")
  proc = run([sys.executable, "-c", script, *args], env=env, cwd=REPO, capture_output=True,
             text=True, check=False)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


def smoke(experiment: str = "sraven", model: str = "hyla", **updates):
  """The smoke config of an experiment, with top-level or dotted-key updates."""
  config = registry.get(experiment).get_config(f"model={model},size=smoke")
  for key, value in updates.items():
    config_checks.set_dotted(config, key, value)
  return config


def token_model_params(model_config, seq_len: int = 8, seed: int = 0):
  """Initialized (boxed) params of `Transformer(model_config)` for a (1, seq_len) token input."""
  model = transformer.Transformer(model_config)
  return model.init(jax.random.PRNGKey(seed), jnp.zeros((1, seq_len), jnp.int32))["params"]


def flat_params(params) -> dict:
  return {jax.tree_util.keystr(p): np.asarray(jax.device_get(x))
          for p, x in jax.tree_util.tree_leaves_with_path(params)}


def snapshot(directory: str) -> dict:
  """path -> (size, mtime) of every file under `directory`."""
  out = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      st = os.stat(path)
      out[path] = (st.st_size, st.st_mtime_ns)
  return out


# The body of a fake `tensorflow` package that a test puts first on a subprocess's path: its
# import fails as on a machine without TensorFlow (tests/repo/test_no_tensorflow.py, the Grain
# path's tests/e2e/test_c4_grain.py).
TENSORFLOW_BLOCKER = ("raise ModuleNotFoundError(\"No module named 'tensorflow' (hidden by "
                      "tests/repo/test_no_tensorflow.py)\", name='tensorflow')\n")
