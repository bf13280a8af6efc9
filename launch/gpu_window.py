r"""One GPU window, one command: HYLA's fused kernels checked, then timed, each result kept at once.

  bash launch/gpu_window.sh                       # on the GPU machine, .whl carried
  python -m launch.gpu_window --out=DIR           # the same, where the packages are
  python -m launch.gpu_window --out=DIR --dry_run # the whole sequence at tiny sizes, on CPU

Stages (`stages`), in order, each a subprocess with its own time limit clipped by --deadline_s
(one without its minimum left is recorded as skipped): first whether the kernels are right on this
GPU (env; the rungs alone under compute-sanitizer's memcheck, `measure/mosaic_rungs.py`; bf16
parity against float64; a failure of the default kernels ends the window, of `VARIANT` keeps it
out of the timings), then what the C4 train step costs with them, then how fast each call is
beside cuDNN and blockwise (`Sizes.time_shapes`: the rows `ops/kernel_cost.py`'s model is held to)
and why (ncu's counters, each kernel's ms from a trace), T=16384 last if time is left.
Output in --out: gpu_window.jsonl (one JSON object per line, appended and flushed as each result
exists: kind = window, env, rung, parity, ncu, c4_step, tune, stage, window_end) and gpu_window.log
(every stage's output). Exit status: 0, or 1 if parity failed or a stage failed.

Imports no JAX (the launch layer runs where JAX is not installed); the stages do."""

from __future__ import annotations

import csv
import dataclasses
import datetime
import glob
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Optional

from hypernet_attention import errors  # no dependencies: the launch layer may import it
from hypernet_attention.runs import children

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JSONL, LOG = "gpu_window.jsonl", "gpu_window.log"
# The C4 step through the Mosaic kernels (benchmark_training's per-model override).
MOSAIC_C4 = "hyla@model.implementation=mosaic"
# The whole window, the wrapper's wheel install (~15 s) included, inside 8 minutes.
H100_DEADLINE_S = 460
# The forward's default tiles (mosaic_kernel.DEFAULT_BLOCKS) as a tune_kernels config.
MOSAIC_DEFAULT = "mosaic:64x8x8:kernel:paired"
# Timed beside it from T=512 once its rung passed: the dS kernel on two warpgroups (kernels.md).
VARIANT_SCHEDULE = "ds_two_warpgroups"
VARIANT = f"{MOSAIC_DEFAULT}:{VARIANT_SCHEDULE}"


@dataclasses.dataclass(frozen=True)
class Sizes:
  """Everything that differs between a GPU window and the CPU dry run."""
  c4_size: str
  c4_batch: int
  steps: int
  repeats: int
  tune: tuple[str, ...]  # experiments/tune_kernels.py flags besides the shape
  blockwise: str  # its blockwise config, timed beside the kernels
  scale: float  # Stage budgets are seconds on an H200 times this.
  deadline_s: float
  # name -> (B, T, H, D) of each timing stage, in order; D = V.
  time_shapes: tuple[tuple[str, tuple[int, int, int, int]], ...]
  # The Mosaic ladder (`hypernet_attention/measure/mosaic_rungs.py`): B,T,H,D of each rung,
  # and parity's lengths.
  rung_shape: tuple[int, int, int, int] = (1, 128, 8, 64)
  counters_shape: tuple[int, int, int, int] = (4, 4096, 8, 64)  # B,T,H,D under ncu.
  mosaic_parity_lens: str = "1000"


GPU = Sizes(
    c4_size="50m", c4_batch=64, steps=5, repeats=2,
    tune=("--dtype=bfloat16", "--calls=20", "--repeats=3"), blockwise="blockwise:256x256",
    scale=1.0, deadline_s=H100_DEADLINE_S,
    time_shapes=(("T4096", (4, 4096, 8, 64)), ("T1024", (4, 1024, 8, 64)),
                 ("c4", (64, 512, 8, 64)), ("sraven", (128, 36, 16, 4)),
                 ("fuzzy", (128, 33, 8, 2)), ("T16384", (4, 16384, 8, 64))))
# Tiny sizes on the CPU, float32 (Mosaic's interpret mode); one shape.
DRY_RUN = Sizes(
    c4_size="smoke", c4_batch=2, steps=2, repeats=1,
    tune=("--interpret", "--dtype=float32", "--calls=1", "--repeats=1"),
    blockwise="blockwise:32x32", scale=5.0, deadline_s=600,
    time_shapes=(("T64", (1, 64, 2, 16)),), rung_shape=(1, 64, 2, 16),
    counters_shape=(1, 64, 2, 16), mosaic_parity_lens="64")
# Stage budgets (`stages`): the H200 window's measured seconds + 30% (2026-11-28, its `kind: stage`
# rows); the stages it did not run, estimated from its rows: experiments/results/kernels.md, "The
# next window, call by call", has each stage's expected and budgeted seconds.


@dataclasses.dataclass
class Window:
  """One window's output folder and clock."""
  out: str
  sizes: Sizes
  deadline: float  # time.monotonic() after which no stage runs.

  def record(self, kind: str, **row) -> None:
    """Appends one JSON line and flushes it: a window cut short keeps every line written."""
    with open(os.path.join(self.out, JSONL), "a") as f:
      f.write(json.dumps({"kind": kind, **row}) + "\n")
      f.flush()
      os.fsync(f.fileno())

  def left(self) -> float:
    return self.deadline - time.monotonic()


@dataclasses.dataclass(frozen=True)
class Stage:
  name: str
  budget_s: float  # Seconds on an H100, from what the last windows measured, with room.
  argv: Callable[[Window, float], list[str]]  # (window, the stage's time limit) -> command.
  parse: Callable[[Window, str], None] = lambda w, line: None  # Each output line, as it comes.
  min_s: float = 20.0  # Not started with less than this left (seconds on an H100).
  # A failure here ends the window (a wrong kernel must not be timed); running out of time
  # does not: the rows it recorded say which kernels passed, and the timing stages go on.
  stops_window: bool = False
  # (window) -> why it must not run now (recorded as skipped), or None.
  requires: Callable[[Window], Optional[str]] = lambda w: None


ENV_PROBE = """
import json, platform, jax, jaxlib, flax, optax, numpy
versions = dict(python=platform.python_version(), jax=jax.__version__,
                jaxlib=jaxlib.__version__, flax=flax.__version__, optax=optax.__version__,
                numpy=numpy.__version__)
try:
  from jax._src.lib import cuda_versions
  versions.update(cuda_runtime=cuda_versions.cuda_runtime_get_version(),
                  cudnn=cuda_versions.cudnn_get_version())
except Exception:
  pass
device = jax.devices()[0]
stats = device.memory_stats() or {}
print(json.dumps(dict(versions=versions, backend=jax.default_backend(),
                      device_kind=device.device_kind, device_count=jax.device_count(),
                      bytes_limit=stats.get("bytes_limit"))))
"""


def _python(*args: str) -> list[str]:
  return [sys.executable, *args]


def _json_line(kind: str) -> Callable[[Window, str], None]:
  """Lines that are JSON objects become rows of `kind`."""
  def parse(window: Window, line: str) -> None:
    if line.startswith("{"):
      try:
        window.record(kind, **json.loads(line))
      except json.JSONDecodeError:
        pass
  return parse


def _error_line(tail: list[str]) -> str:
  """A refusal's one line, `<program>: error: <what and what is allowed>`."""
  return next((t for t in reversed(tail) if "error:" in t), tail[-1] if tail else "")


def _c4(batch: int, min_s: float) -> Stage:
  def argv(w: Window, _limit: float) -> list[str]:
    models = "softmax"
    why_not = _mosaic_not_passed(w)
    if why_not:  # HYLA through auto instead, which runs blockwise where Mosaic has not passed
      w.record("c4_step", batch_size=batch, model=MOSAIC_C4, status="skipped", message=why_not)
      models += ",hyla@model.implementation=blockwise"
    else:
      models += "," + MOSAIC_C4
    return _python("experiments/benchmark_training.py", "--experiment=c4_lm",
                   f"--size={w.sizes.c4_size}", "--synthetic_tokens", f"--models={models}",
                   f"--steps={w.sizes.steps}", f"--repeats={w.sizes.repeats}",
                   f"--config_overrides=batch_size={batch}")

  # Two models, ~60 s (the budgets' note above). A batch that does not fit ends the stage as
  # "refused" with benchmark_training's one line (`run_stage`).
  return Stage(f"c4_b{batch}", 78, argv, _json_line("c4_step"), min_s=min_s)


def _rows(w: Window) -> list[dict]:
  """The rows this window has recorded so far."""
  path = os.path.join(w.out, JSONL)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _mosaic_not_passed(w: Window) -> Optional[str]:
  """Why the Mosaic kernels may not share a process with other measurements yet: a kernel that
  faults kills the process's CUDA context (the H100 window of 2026-11-27), so they are timed beside
  others only after their bfloat16 parity passed in this same window (the rungs and
  `mosaic_parity` run them alone, in their own processes)."""
  parity = [r for r in _rows(w) if r.get("kind") == "parity" and r.get("implementation") ==
            "mosaic" and r.get("dtype") == "bfloat16"]
  bad = [r for r in parity if r.get("status") != "pass"]
  if bad:
    return (f"mosaic's parity in this window: {bad[0]['status']} at "
            f"T={bad[0].get('seq_len')} {bad[0].get('dtype')}")
  if not parity:
    return "mosaic has not passed bfloat16 parity in this window"
  return None


def _passed_configs(w: Window, configs: list[str], **row) -> list[str]:
  """`configs` without the Mosaic ones unless Mosaic passed here, `VARIANT` unless its rung did too
  (a `tune` row says why): timing a kernel that is wrong or does not compile only costs time."""
  kept, variant_passed = [], any(r.get("kind") == "rung" and r.get("status") == "pass" and
                                 r.get("schedule") == VARIANT_SCHEDULE for r in _rows(w))
  for config in configs:
    why_not = config.startswith("mosaic:") and _mosaic_not_passed(w) or (
        config == VARIANT and not variant_passed and "its rung has not passed in this window")
    if why_not:
      w.record("tune", name="mosaic", config=config, **row, status="skipped", message=why_not)
    else:
      kept.append(config)
  return kept


def _cuda_tool(name: str) -> Optional[str]:
  """A CUDA tool on the GPU image (compute-sanitizer, ncu), or None (the CPU dry run)."""
  return shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/local/cuda*/bin/{name}") +
                                                glob.glob(f"/opt/nvidia/*/*/{name}"))), None)


def _sanitizer() -> list[str]:
  """compute-sanitizer's memcheck, exit 1 on any error; [] where it is absent."""
  found = _cuda_tool("compute-sanitizer")
  return [found, "--tool", "memcheck", "--error-exitcode", "1", "--print-limit", "20"] if (
      found) else []


# Nsight Compute's sections for the counters stage: time, occupancy, issue slots and warp
# stall reasons, pipe use, instruction mix; `--page raw` prints every metric they collect.
NCU_SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats",
                "ComputeWorkloadAnalysis", "SchedulerStats", "InstructionStats")


def _number(text: str):
  try:
    return float(text.replace(",", ""))
  except ValueError:
    return text


def _counters(budget_s: float) -> Stage:
  """The hardware counters of one fwd+bwd's Mosaic kernels (forward, dS, dV, dQ, dK) at the
  timing shape, from ncu (`mosaic_rungs fwd_bwd`): whether each kernel is issue-bound, stalled
  on its wgmmas or barriers, or short of warps decides the next kernel change. One `ncu` row
  per kernel (its metrics by ncu's names, in base units: the log keeps ncu's units line);
  needs Mosaic's parity in this window and ncu reading counters (Firecracker machines; not
  gVisor: the device tool's KINDS.md)."""
  header: list[str] = []
  rung_row = _json_line("rung")  # the fwd_bwd rung's own line

  def parse(w: Window, line: str) -> None:
    if line.startswith("{"):
      return rung_row(w, line)
    cells = next(csv.reader([line]), [])
    if "Kernel Name" in cells:
      header[:] = cells
    elif header and len(cells) == len(header) and cells[0].isdigit():
      row = dict(zip(header, cells))
      w.record("ncu", kernel=row["Kernel Name"], grid=row.get("Grid Size"),
               metrics={k: _number(v) for k, v in row.items() if "__" in k})

  def requires(w: Window) -> Optional[str]:
    return _mosaic_not_passed(w) or (
        None if _cuda_tool("ncu") else "no ncu (Nsight Compute) on this machine")

  def argv(w: Window, _limit: float) -> list[str]:
    batch, seq_len, heads, head_dim = w.sizes.counters_shape
    sections = [a for name in NCU_SECTIONS for a in ("--section", name)]
    return ["env", "XLA_PYTHON_CLIENT_PREALLOCATE=false", "XLA_FLAGS=--xla_gpu_autotune_level=0",
            _cuda_tool("ncu"), "--clock-control", "none", "--kernel-name", "regex:^hyla_",
            "--launch-count", "5", *sections, "--page", "raw", "--csv", "--print-units", "base",
            *_python("-m", "hypernet_attention.measure.mosaic_rungs", "fwd_bwd",
                     f"--batch={batch}", f"--seq_len={seq_len}", f"--heads={heads}",
                     f"--head_dim={head_dim}")]
  return Stage("counters", budget_s, argv, parse, min_s=20, requires=requires)


def _rung(rung: str, budget_s: float, schedule: str = "default") -> Stage:
  """One rung of the Mosaic ladder, alone in its process, under memcheck; a failure (a fault, a
  memcheck error, wrong numbers) of the default kernels ends the window (`stops_window`): nothing
  after it is timed; another schedule's (`mosaic_rungs --schedule`) keeps that one out only."""
  def argv(w: Window, _limit: float) -> list[str]:
    batch, seq_len, heads, head_dim = w.sizes.rung_shape
    # Autotuning would launch hundreds of XLA kernels under the sanitizer; no preallocation
    # keeps memcheck's shadow memory small.
    return ["env", "XLA_PYTHON_CLIENT_PREALLOCATE=false", "XLA_FLAGS=--xla_gpu_autotune_level=0",
            *_sanitizer(), *_python("-m", "hypernet_attention.measure.mosaic_rungs", rung,
                                    f"--batch={batch}", f"--seq_len={seq_len}",
                                    f"--heads={heads}", f"--head_dim={head_dim}",
                                    f"--schedule={schedule}")]
  return Stage(f"rung_{rung if schedule == 'default' else schedule}", budget_s, argv,
               _json_line("rung"), min_s=10, stops_window=schedule == "default")


def stages(sizes: Sizes) -> list[Stage]:
  """The window's stages in order (see the module docstring)."""
  def mosaic_parity(w: Window, _limit: float) -> list[str]:
    batch, _, heads, head_dim = w.sizes.rung_shape
    return _python("-m", "hypernet_attention.measure.mosaic_rungs", "parity",
                   f"--seq_lens={w.sizes.mosaic_parity_lens}", f"--batch={batch}",
                   f"--heads={heads}", f"--head_dim={head_dim}")

  def tune(shape: tuple[int, int, int, int], configs: list[str], *flags: str):
    def argv(w: Window, _limit: float) -> list[str]:
      batch, seq_len, heads, head_dim = shape
      kept = _passed_configs(w, configs, seq_len=seq_len, batch=batch)
      return _python("experiments/tune_kernels.py", *w.sizes.tune, f"--seq_len={seq_len}",
                     f"--batch={batch}", f"--heads={heads}", f"--head_dim={head_dim}",
                     f"--configs={','.join(kept)}", *flags)
    return argv

  env_probe = lambda w, _limit: _python("-c", ENV_PROBE)
  shapes = dict(sizes.time_shapes)
  longest = max(shapes.values(), key=lambda s: s[0] * s[1] ** 2)
  return [
      Stage("env", 5, env_probe, _json_line("env"), min_s=3),
      _rung("forward", 15),
      _rung("dq", 17),
      _rung("dq", 17, VARIANT_SCHEDULE),
      Stage("mosaic_parity", 40, mosaic_parity, _json_line("parity"), min_s=30, stops_window=True),
      _c4(sizes.c4_batch, min_s=40),
      *(Stage(f"time_{name}", 46 if shape[1] >= 512 else 30,
              tune(shape, [MOSAIC_DEFAULT, sizes.blockwise, *[VARIANT] * (shape[1] >= 512)]),
              _json_line("tune"), min_s=25)
        for name, shape in sizes.time_shapes if shape is not longest or len(shapes) == 1),
      _counters(25),
      # Each row's kernels by name, from a trace of its fwd+bwd: the forward, dS, dV, dQ/dK and
      # XLA's layout moves (its own stage: the traces take as long as the timing).
      Stage("profile", 58, tune(sizes.counters_shape, [MOSAIC_DEFAULT], "--profile"),
            _json_line("tune"), min_s=40),
      *(Stage(f"time_{name}", 58, tune(shape, [MOSAIC_DEFAULT, sizes.blockwise],
                                       "--calls=5"), _json_line("tune"), min_s=45)
        for name, shape in sizes.time_shapes if shape is longest and len(shapes) > 1)]


def run_stage(w: Window, stage: Stage, env: dict) -> str:
  """Runs one stage under its budget clipped by the deadline; records its end as a row."""
  limit = min(stage.budget_s * w.sizes.scale, w.left())
  why_not = stage.requires(w)
  if why_not:
    w.record("stage", stage=stage.name, status="skipped", seconds=0, message=why_not)
    return "skipped"
  if limit < stage.min_s * w.sizes.scale:
    w.record("stage", stage=stage.name, status="skipped", seconds=0,
             message=f"{w.left():.0f} s left of the window, "
             f"{stage.min_s * w.sizes.scale:.0f} s needed")
    return "skipped"
  argv = stage.argv(w, limit)
  start = time.monotonic()
  log = open(os.path.join(w.out, LOG), "a")
  log.write(f"\n=== {stage.name} ({limit:.0f} s): {' '.join(argv)}\n")
  log.flush()
  proc = children.spawn(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True, start_new_session=True)
  tail: list[str] = []

  def read() -> None:
    for line in proc.stdout:
      log.write(line)
      log.flush()
      tail[:] = (tail + [line.rstrip()])[-8:]
      stage.parse(w, line.strip())

  reader = threading.Thread(target=read, daemon=True)
  reader.start()
  try:
    rc = proc.wait(timeout=limit)
    status = "ok" if rc == 0 else "refused" if rc == 2 else "failed"
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
      rc = proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      os.killpg(proc.pid, signal.SIGKILL)
      rc = proc.wait()
    status = "timed_out"
  reader.join(timeout=10)
  log.close()
  row = dict(stage=stage.name, status=status, rc=rc, seconds=time.monotonic() - start,
             limit_s=limit)
  if status != "ok":
    row["tail"] = tail
    if status == "refused":
      row["message"] = _error_line(tail)
  w.record("stage", **row)
  return status


def _commit(flag: Optional[str]) -> dict:
  """The commit that ran: the flag, else git's (with whether the tree differs), else
  unknown; and a digest of the sources, which identifies them without git."""
  out = dict(commit=flag or "unknown", dirty=None)
  if not flag and os.path.isdir(os.path.join(REPO, ".git")):
    try:
      git = lambda *a: children.run(["git", *a], cwd=REPO, capture_output=True, text=True,
                                    timeout=20, check=True).stdout.strip()
      out.update(commit=git("rev-parse", "HEAD"),
                 dirty=bool(git("status", "--porcelain", "--untracked-files=no")))
    except (OSError, subprocess.SubprocessError):
      pass
  digest = hashlib.sha256()
  for pattern in ("hypernet_attention/**/*.py", "experiments/*.py", "experiments/configs/*.py",
                  "launch/**/*.py", "launch/*.sh"):
    for path in sorted(glob.glob(os.path.join(REPO, pattern), recursive=True)):
      digest.update(os.path.relpath(path, REPO).encode())
      with open(path, "rb") as f:
        digest.update(f.read())
  out["source_sha256"] = digest.hexdigest()[:16]
  return out


def _nvidia_smi() -> Optional[str]:
  if not shutil.which("nvidia-smi"):
    return None
  query = "name,driver_version,memory.used,memory.total,clocks.sm,clocks.max.sm"
  result = children.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                        capture_output=True, text=True, timeout=30)
  return result.stdout.strip() or result.stderr.strip()


def main(argv: Optional[list[str]] = None) -> int:
  parser = errors.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu_window_out"))
  parser.add_argument("--dry_run", action="store_true",
                      help="the whole sequence at tiny sizes on the CPU")
  parser.add_argument("--deadline_s", type=float, default=None,
                      help=f"no stage runs after this (default {GPU.deadline_s:.0f} s, dry "
                      f"run {DRY_RUN.deadline_s:.0f} s)")
  parser.add_argument("--commit", default=None, help="the commit being run (else git's)")
  parser.add_argument("--stages", default="all", help="comma-separated names, or all")
  args = parser.parse_args(argv)
  sizes = DRY_RUN if args.dry_run else GPU
  deadline_s = sizes.deadline_s if args.deadline_s is None else args.deadline_s
  if not deadline_s > 0:
    parser.error(f"--deadline_s={deadline_s}; allowed: a positive number of seconds")
  names = [s.name for s in stages(sizes)]
  chosen = [n for n in args.stages.split(",") if n not in ("", "all")] or names
  if set(chosen) - set(names):
    parser.error(f"--stages: unknown {sorted(set(chosen) - set(names))}; allowed: "
                 f"{','.join(names)}")
  if os.path.exists(args.out) and not os.path.isdir(args.out):
    parser.error(f"--out={args.out!r} is a file; allowed: a folder")
  try:
    os.makedirs(args.out, exist_ok=True)
  except OSError as e:  # Below a file (or not writable): named before anything runs.
    parser.error(f"--out={args.out!r} cannot be made ({e.strerror}: a file in its path?); "
                 "allowed: a folder path")
  w = Window(args.out, sizes, time.monotonic() + deadline_s)
  env = {**os.environ, "PYTHONUNBUFFERED": "1", "TF_CPP_MIN_LOG_LEVEL": "3",
         "PYTHONPATH": os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)}
  if args.dry_run:
    env["JAX_PLATFORMS"] = "cpu"
  start = time.monotonic()
  w.record("window", mode="dry_run" if args.dry_run else "gpu", deadline_s=deadline_s,
           started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           stages=chosen, nvidia_smi=_nvidia_smi(), **_commit(args.commit))
  statuses = {}
  for stage in stages(sizes):
    if stage.name not in chosen:
      continue
    statuses[stage.name] = run_stage(w, stage, env)
    print(f"gpu_window: {stage.name} {statuses[stage.name]} ({w.left():.0f} s left)", flush=True)
    if stage.stops_window and statuses[stage.name] == "failed":
      w.record("window_end", seconds=time.monotonic() - start, statuses=statuses,
               message=f"{stage.name} {statuses[stage.name]}: nothing timed")
      return 1
  if statuses and all(s == "skipped" for s in statuses.values()):  # e.g. --deadline_s=0.5
    message = (f"no stage ran: each needs more than --deadline_s={deadline_s:g} s; allowed: "
               f"a deadline that fits the first stage's minimum")
    w.record("window_end", seconds=time.monotonic() - start, statuses=statuses, message=message)
    print(f"gpu_window: {message}", file=sys.stderr)
    return 1
  w.record("window_end", seconds=time.monotonic() - start, statuses=statuses)
  return int(any(s in ("failed", "timed_out") for s in statuses.values()))


if __name__ == "__main__":
  sys.exit(main())
