r"""One GPU window, one command: what issue 41 measures on a device, each result kept at once.

  bash launch/gpu_window.sh                       # on the GPU machine, .whl carried
  python -m launch.gpu_window --out=DIR           # the same, where the packages are
  python -m launch.gpu_window --out=DIR --dry_run # the whole sequence at tiny sizes, on CPU

Stages, in order; each is a subprocess with its own time limit, clipped by the overall
--deadline_s (a stage without its minimum time left is recorded as skipped, never started),
so a slow stage costs only its own budget. The default window is issue 52's: the fused HYLA
kernel correct on the GPU, then timed:
  env          versions, device, commit (`--commit`, else git, else unknown) and a digest of
               the sources that ran
  rung_forward, rung_backward, rung_dq
               the Mosaic kernels one at a time (forward; + the backward's dS and dV kernels; + its
               dQ and dK matmul kernels), each alone in its own process at B=1, T=128, under
               compute-sanitizer's memcheck (`hypernet_attention/measure/mosaic_rungs.py`):
               a kernel that faults kills its process's CUDA context, and memcheck names the
               faulting access; a failure ends the window
  mosaic_parity  bf16 values and gradients against the float64 reference at T=1000
               (`measure/parity.check`), alone; a wrong answer ends the window
  rung_forward_overlap, mosaic_parity_overlap, rung_forward_paired, mosaic_parity_paired
               the same two checks of the forward's other schedules (mosaic_rungs.SCHEDULES):
               Blocks.overlap (the next key tile's score wgmmas under this tile's value
               network) and Blocks.paired at 64x8x8 (two value columns per accumulator); a
               failure here leaves that schedule's rows out and the window goes on
  mosaic_time_4096, mosaic_time_1024, mosaic_time_16384
               fwd and fwd+bwd (B=4, H=8, D=V=64, causal) of the Mosaic kernels, plain and paired
               (and overlapped at T=4096), beside cuDNN and blockwise 256 x 256 in one process per
               length (`experiments/tune_kernels.py`; at T=4096 with each row's kernels by name from
               a trace); a kernel is left out unless its parity passed in this window
  counters     ncu's hardware counters of the Mosaic kernels in one fwd+bwd at T=4096 (time,
               occupancy, issue slots, warp stall reasons, pipes): what bounds each kernel
  tiles        the forward's other tiles at T=4k beside cuDNN and blockwise 256 x 256
               (`experiments/tune_kernels.py`; 64x8x2 plain and overlapped, 64x8x4 paired, 64x16x4)
  c4_b64       the C4 50M train step, batch 64, random tokens: softmax, HYLA (auto) and,
               once its parity passed in this window, HYLA through the Mosaic kernels
               (`experiments/benchmark_training.py --synthetic_tokens`)
What earlier windows measured with XLA's kernels (every implementation's parity and
attention sweep, the C4 step's trace, batch 256, the populations) stands in their READMEs
(experiments/results/gpu_windows/); the tools that measured it run by hand (the population
gain: `experiments/benchmark_training.py --experiment=sraven --size=paper --members=1,3,24`).

Output in --out: gpu_window.jsonl (one JSON object per line, appended and flushed as each result
exists: kind = window, env, rung, parity, ncu, c4_step, tune, stage, window_end) and gpu_window.log
(every stage's output). Exit status: 0, or 1 if parity failed or a stage failed.

Imports no JAX (the launch layer runs where JAX is not installed); the stages do.
"""

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
# Of a 600 s device call: the machine's start, the wrapper's wheel install and the copy
# back of $OUT come first and last.
H100_DEADLINE_S = 520


@dataclasses.dataclass(frozen=True)
class Sizes:
  """Everything that differs between a GPU window and the CPU dry run."""
  c4_size: str
  c4_batch: int
  steps: int
  repeats: int
  tune: tuple[str, ...]  # experiments/tune_kernels.py flags, and its --configs:
  tune_configs: tuple[str, ...]
  scale: float  # Stage budgets are seconds on an H100 times this.
  deadline_s: float
  # The Mosaic ladder (`hypernet_attention/measure/mosaic_rungs.py`): B,T,H,D of each rung,
  # parity's lengths, and the tile sweep's lengths.
  rung_shape: tuple[int, int, int, int] = (1, 128, 8, 64)
  counters_shape: tuple[int, int, int, int] = (4, 4096, 8, 64)  # B,T,H,D under ncu.
  mosaic_parity_lens: str = "1000"
  mosaic_time_lens: tuple[int, ...] = (4096, 1024, 16384)


GPU = Sizes(
    c4_size="50m", c4_batch=64, steps=5, repeats=2,
    tune=("--seq_len=4096", "--batch=4", "--heads=8", "--head_dim=64", "--dtype=bfloat16",
          "--calls=20", "--repeats=3"),
    # The forward's other tiles that ptxas 12.9 compiles without spilling (measure/ptxas.py, H100):
    # 64x8x2 at 160 registers (3 programs per SM, not 2; twice the score recomputation) and
    # overlapped at 192; 64x8x4 paired at 166 (today's instructions, 3 programs per SM); 64x16x4 at
    # 249 (half the key tiles); blockwise. Named only: 64x32x1 (246), XLA's dQ/dK path
    # (mosaic:64x8x4:xla; for the first kernels it gained nothing for ~70 s of compile, H200).
    tune_configs=("mosaic:64x8x2:kernel", "mosaic:64x8x2:kernel:overlap",
                  "mosaic:64x8x4:kernel:paired", "mosaic:64x16x4:kernel", "blockwise:256x256"),
    scale=1.0, deadline_s=H100_DEADLINE_S)
# Tiny sizes on the CPU, float32 (Mosaic's interpret mode); one length.
DRY_RUN = Sizes(
    c4_size="smoke", c4_batch=2, steps=2, repeats=1,
    tune=("--interpret", "--seq_len=64", "--batch=1", "--heads=2", "--head_dim=16",
          "--dtype=float32", "--calls=1", "--repeats=1"),
    tune_configs=("blockwise:32x32", "mosaic:64x8x4:kernel"),
    scale=3.0, deadline_s=600, rung_shape=(1, 64, 2, 16), counters_shape=(1, 64, 2, 16),
    mosaic_parity_lens="64", mosaic_time_lens=(64,))
# Stage budgets below are seconds on an H100, from what today's kernels measured on an H200
# (2026-11-27: experiments/results/gpu_windows/2026-11-27_h200_registers): env 4 s,
# rung_forward 11.5, rung_backward 13.7, rung_dq 14.2, mosaic_parity 29 at T=1000,
# mosaic_time_4096 28 (T=1024 and 16384 not yet timed: 20 and ~60 expected); C4 with three
# models ran past 100 s. Each other schedule adds a rung (~12 s), a parity (~29) and rows to
# the mosaic_time stages (~10 s each; the overlapped forward at T=4096 only); counters ~40
# (a rung's ~14 at T=4096, with ncu's ~20 replays of 5 kernels of 1-10 ms); tiles ~70 s:
# ~410 s expected before the C4 step, which gets the rest (~110 s of the 520).


@dataclasses.dataclass
class Window:
  """One window's output folder and clock."""
  out: str
  sizes: Sizes
  deadline: float  # time.monotonic() after which no stage runs.
  dry_run: bool

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
    models = "softmax,hyla"
    why_not = _mosaic_not_passed(w, "mosaic")
    if why_not:
      w.record("c4_step", batch_size=batch, model=MOSAIC_C4, status="skipped", message=why_not)
    else:
      models += "," + MOSAIC_C4
    return _python("experiments/benchmark_training.py", "--experiment=c4_lm",
                   f"--size={w.sizes.c4_size}", "--synthetic_tokens", f"--models={models}",
                   f"--steps={w.sizes.steps}", f"--repeats={w.sizes.repeats}",
                   f"--config_overrides=batch_size={batch}")

  # Three models took ~75 s at batch 64 (H100, 2026-11-27); with the Mosaic model as a third,
  # 100 s ran out (H200, 2026-11-27): the budget is doubled. A batch that does not fit ends
  # the stage as "refused" with benchmark_training's one line (`run_stage`).
  return Stage(f"c4_b{batch}", 200, argv, _json_line("c4_step"), min_s=min_s)


def _rows(w: Window) -> list[dict]:
  """The rows this window has recorded so far."""
  path = os.path.join(w.out, JSONL)
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _mosaic_not_passed(w: Window, implementation: str) -> Optional[str]:
  """Why a Mosaic forward (`implementation`: parity's name, mosaic or mosaic_SCHEDULE) may not share
  a process with other measurements yet: a kernel that faults kills the process's CUDA context (the
  H100 window of 2026-11-27), so it is timed beside others only after its bfloat16 parity passed in
  this same window (the rungs and `mosaic_parity` run it alone, in their own processes)."""
  parity = [r for r in _rows(w) if r.get("kind") == "parity" and r.get("implementation") ==
            implementation and r.get("dtype") == "bfloat16"]
  bad = [r for r in parity if r.get("status") != "pass"]
  if bad:
    return (f"{implementation}'s parity in this window: {bad[0]['status']} at "
            f"T={bad[0].get('seq_len')} {bad[0].get('dtype')}")
  if not parity:
    return f"{implementation} has not passed bfloat16 parity in this window"
  return None


def _passed_configs(w: Window, configs: list[str], **row) -> list[str]:
  """`configs` without the Mosaic ones unless Mosaic passed here (a `tune` row says why):
  timing a kernel that is wrong or does not compile only costs time."""
  kept = []
  for config in configs:
    why_not = config.startswith("mosaic:") and _mosaic_not_passed(
        w, "_".join(["mosaic", *config.split(":")[3:]]))  # its schedule's own parity
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
    return _mosaic_not_passed(w, "mosaic") or (
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
  return Stage("counters", budget_s, argv, parse, min_s=40, requires=requires)


def _rung(rung: str, budget_s: float, stops_window: bool = True) -> Stage:
  """One rung of the Mosaic ladder, alone in its process, under memcheck; a failure (a fault, a
  memcheck error, wrong numbers) ends the window (`stops_window`): nothing after it is timed."""
  def argv(w: Window, _limit: float) -> list[str]:
    batch, seq_len, heads, head_dim = w.sizes.rung_shape
    # Autotuning would launch hundreds of XLA kernels under the sanitizer; no preallocation
    # keeps memcheck's shadow memory small.
    return ["env", "XLA_PYTHON_CLIENT_PREALLOCATE=false", "XLA_FLAGS=--xla_gpu_autotune_level=0",
            *_sanitizer(), *_python("-m", "hypernet_attention.measure.mosaic_rungs", rung,
                                    f"--batch={batch}", f"--seq_len={seq_len}",
                                    f"--heads={heads}", f"--head_dim={head_dim}")]
  return Stage(f"rung_{rung}", budget_s, argv, _json_line("rung"), min_s=20,
               stops_window=stops_window)


def stages(sizes: Sizes) -> list[Stage]:
  """The window's stages in order (see the module docstring)."""
  def tiles(w: Window, _limit: float) -> list[str]:
    configs = _passed_configs(w, list(w.sizes.tune_configs))
    return _python("experiments/tune_kernels.py", *w.sizes.tune, f"--configs={','.join(configs)}")

  def mosaic_parity(*flags: str) -> Callable[[Window, float], list[str]]:
    def argv(w: Window, _limit: float) -> list[str]:
      batch, _, heads, head_dim = w.sizes.rung_shape
      return _python("-m", "hypernet_attention.measure.mosaic_rungs", "parity",
                     f"--seq_lens={w.sizes.mosaic_parity_lens}", f"--batch={batch}",
                     f"--heads={heads}", f"--head_dim={head_dim}", *flags)
    return argv

  def rung_passed(schedule: str) -> Callable[[Window], Optional[str]]:
    def why_not(w: Window) -> Optional[str]:
      if not any(r.get("kind") == "rung" and r.get("rung") == f"forward_{schedule}" and
                 r.get("status") == "pass" for r in _rows(w)):
        return f"the {schedule} forward has not passed its rung in this window"
      return None
    return why_not

  def mosaic_time(seq_len: int) -> Callable[[Window, float], list[str]]:
    def argv(w: Window, _limit: float) -> list[str]:
      # The matmul kernels only (the previous kernels' XLA dQ path measured 65.5 vs 66.6 ms,
      # H200, T=4096, no gain worth 70 s of compile); `tiles` times both.
      overlap = ["mosaic:64x8x4:kernel:overlap"] if seq_len == 4096 or w.dry_run else []
      configs = _passed_configs(w, ["mosaic:64x8x4:kernel", *overlap,
                                    "mosaic:64x8x8:kernel:paired", "blockwise:256x256"],
                                seq_len=seq_len)
      tune = [f for f in w.sizes.tune if not f.startswith("--seq_len=")]
      if seq_len > 4096:  # Quadratic cost: 5 calls per measurement keep T=16k near a minute.
        tune = [f for f in tune if not f.startswith("--calls=")] + ["--calls=5"]
      if w.dry_run:
        configs = [c.replace("256x256", "32x32") for c in configs]
      # At T=4096, each row's kernels by name from a trace (forward, dS, dV, dQ/dK, XLA's
      # layout work): where the time goes, for the next kernel change.
      profile = ["--profile"] if seq_len == 4096 or w.dry_run else []
      return _python("experiments/tune_kernels.py", *tune, f"--seq_len={seq_len}",
                     f"--configs={','.join(configs)}", *profile)
    return argv

  env_probe = lambda w, _limit: _python("-c", ENV_PROBE)
  # The default window (issue 52): the Mosaic ladder, alone and under memcheck, then its
  # bf16 parity, then its time beside cuDNN and blockwise (budgets: the measured times
  # above with ~40% room).
  return [
      Stage("env", 20, env_probe, _json_line("env"), min_s=10),
      _rung("forward", 30),
      _rung("backward", 40),
      _rung("dq", 40),
      Stage("mosaic_parity", 80, mosaic_parity(), _json_line("parity"), min_s=40,
            stops_window=True),
      *(stage for schedule in ("overlap", "paired") for stage in (
          _rung(f"forward_{schedule}", 30, stops_window=False),
          Stage(f"mosaic_parity_{schedule}", 60, mosaic_parity(f"--schedule={schedule}"),
                _json_line("parity"), min_s=40, requires=rung_passed(schedule)))),
      *(Stage(f"mosaic_time_{t}", 120, mosaic_time(t), _json_line("tune"), min_s=60)
        for t in sizes.mosaic_time_lens),
      _counters(90),
      Stage("tiles", 150, tiles, _json_line("tune"), min_s=40),
      _c4(sizes.c4_batch, min_s=30),
  ]


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
  w = Window(args.out, sizes, time.monotonic() + deadline_s, args.dry_run)
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
