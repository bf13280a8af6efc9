"""Registers and spills of the Mosaic kernels, from ptxas, compiled for an H100 without a GPU.

Why: a Hopper thread holds at most 255 registers; a kernel that needs more spills to local
memory, in its inner loop, and no CPU test sees it. XLA compiles for a CUDA device that is
not there (deviceless ahead-of-time compilation: jax's CUDA PJRT plugin builds a
compile-only H100 from a target description), and that runs Mosaic's whole pipeline down to
ptxas, whose report (`MOSAIC_GPU_DUMP_PTXAS`) gives each kernel's registers and spill bytes
(kernels.md has the tables).

  pip install jax-cuda12-plugin==V jax-cuda12-pjrt==V nvidia-cuda-nvcc-cu12   # V: jax's
  python experiments/tune_kernels.py --ptxas --configs=mosaic:64x8x8:kernel:paired

`prepare()` must run before JAX picks its backends (the plugin's CUDA version checks need a
CUDA install this machine does not have; they are skipped, as nothing runs). Mosaic also
tries to disassemble with nvdisasm, absent from the wheels: its one "nvdisasm invocation
failed" line per kernel on stderr is harmless."""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import subprocess
import tempfile
from typing import Any, Callable
from unittest import mock

from hypernet_attention.errors import BadInput

# An H100 SXM as XLA:GPU sees it (XLA's `xla/tools/hlo_opt/gpu_specs/h100_sxm.txtpb`).
H100_TARGET = """
gpu_device_info {
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: 3352320000000 l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: 84978434048 shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 } registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
device_description_str: "NVIDIA H100 80GB HBM3"
"""
_INSTALL = ("jax's CUDA plugin and ptxas (pip install jax-cuda12-plugin==V jax-cuda12-pjrt==V "
            "nvidia-cuda-nvcc-cu12, V = jax's version; no GPU or driver needed)")


def prepare() -> str:
  """Before JAX's backends exist: let the CUDA plugin load without a CUDA install, and put
  the nvidia-cuda-nvcc wheel's ptxas first on PATH (another ptxas allocates registers
  differently, so the numbers name theirs). Returns its version ('' if the wheel is absent)."""
  os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"
  os.environ["MOSAIC_GPU_DUMP_PTXAS"] = "1"
  try:
    import nvidia.cuda_nvcc  # pylint: disable=g-import-not-at-top
  except ImportError:
    return ""
  folder = os.path.join(list(nvidia.cuda_nvcc.__path__)[0], "bin")
  os.environ["PATH"] = folder + os.pathsep + os.environ.get("PATH", "")
  version = subprocess.run([os.path.join(folder, "ptxas"), "--version"], capture_output=True,
                           text=True, check=False).stdout
  found = re.search(r"V(\d+\.\d+\.\d+)", version)
  return found.group(1) if found else ""


def device():
  """A compile-only H100, or BadInput in one line saying what to install."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    topology = topologies.get_topology_desc(platform="cuda", topology_name="",
                                            target_config=H100_TARGET, topology="1x1x1")
  except Exception as err:  # pylint: disable=broad-except
    raise BadInput(f"no compile-only H100 here ({type(err).__name__}: "
                   f"{str(err).strip()[:120]}); needs {_INSTALL}") from None
  return topology.devices[0]


# A Hopper multiprocessor (H100 SXM, H200; CUDA's occupancy rules for compute capability 9.0):
# 4 warp schedulers; 64 K registers, given to each warp in units of 256; 228 KiB of shared memory,
# of which the driver keeps 1 KiB per CTA; at most 64 warps and 32 CTAs.
SCHEDULERS, REGISTERS, REGISTER_UNIT = 4, 65_536, 256
SMEM, SMEM_PER_CTA_RESERVED, SMEM_UNIT = 233_472, 1024, 128
MAX_WARPS, MAX_CTAS = 64, 32


@dataclasses.dataclass(frozen=True)
class Occupancy:
  """How many CTAs of a kernel one multiprocessor holds, by registers and by shared memory, and so
  how many warps each scheduler can pick from: at one, every stall of that warp is an idle issue
  slot."""
  ctas_by_registers: int
  ctas_by_smem: int
  ctas: int
  warps_per_scheduler: float


def occupancy(registers: int, smem_bytes: int, warps_per_cta: int = 4) -> Occupancy:
  """From ptxas's registers per thread, the CTA's shared memory (bytes, what Mosaic allocates)
  and its warps (4 per warpgroup); Nsight Compute's launch__occupancy_limit_* for the same
  inputs (tests/measure/test_ptxas.py holds it to the window's rows)."""
  per_warp = -(-registers * 32 // REGISTER_UNIT) * REGISTER_UNIT
  by_registers = REGISTERS // per_warp // warps_per_cta
  allocated = -(-(smem_bytes + SMEM_PER_CTA_RESERVED) // SMEM_UNIT) * SMEM_UNIT
  by_smem = SMEM // allocated
  ctas = min(by_registers, by_smem, MAX_CTAS, MAX_WARPS // warps_per_cta)
  return Occupancy(by_registers, by_smem, ctas, ctas * warps_per_cta / SCHEDULERS)


def parse(report: str) -> dict[str, int]:
  """ptxas's report of one kernel -> registers, spill_stores, spill_loads (bytes)."""
  registers = re.search(r"Used (\d+) registers", report)
  spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
  if not registers:
    raise ValueError(f"not a ptxas report: {report.strip()[:120]!r}")
  return dict(registers=int(registers.group(1)), spill_stores=int(spills.group(1)) if spills else 0,
              spill_loads=int(spills.group(2)) if spills else 0)


def hot_loop(ptx: str) -> dict[str, int]:
  """The loop of a kernel's PTX (a label and a later branch back to it) whose own body, nested
  loops left out (barrier waits spin in small ones), holds the most `fma` instructions: its static
  instructions, FMAs and shared-memory loads. Per execution: the key or query tile loop of the
  forward and the dV kernel, the value-column loop of the dS kernel."""
  lines = [line.strip() for line in ptx.splitlines()]
  labels = {line[:-1]: i for i, line in enumerate(lines) if re.fullmatch(r"\$\w+:", line)}
  loops = sorted({(labels[m.group(1)], i) for i, line in enumerate(lines)
                  for m in [re.search(r"\bbra(?:\.uni)?\s+(\$\w+);", line)]
                  if m and labels.get(m.group(1), i) < i}, key=lambda r: r[1] - r[0])
  if not loops:
    raise ValueError("hot_loop: no loop in this PTX")
  best = None
  for start, stop in loops:
    inner = [(a, b) for a, b in loops if start <= a and b <= stop and (a, b) != (start, stop)]
    ops = [re.sub(r"^@!?%\w+\s+", "", lines[i]).split()[0] for i in range(start, stop + 1)
           if lines[i].endswith(";") and not lines[i].startswith((".", "//"))
           and not any(a <= i <= b for a, b in inner)]
    found = dict(instructions=len(ops), fma=sum(op.startswith("fma.") for op in ops),
                 ld_shared=sum(op.startswith("ld.shared") for op in ops))
    if best is None or found["fma"] > best["fma"]:
      best = found
  return best


def kernels(fn: Callable, *shapes: Any) -> list[dict[str, Any]]:
  """`parse` of every Mosaic kernel in `jit(fn)` (`shapes`: `jax.ShapeDtypeStruct`s) compiled for
  `device()`, with its entry's name (kernel: e.g. hyla_ds), threads per CTA (PTX's .maxntid), the
  shared memory Mosaic allocates (smem_bytes) and its PTX's `hot_loop` (loop_*). Mosaic numbers its
  dumps per name (jax 0.12: resources _0, PTX _1), so a name's k-th report goes with its k-th."""
  import jax  # pylint: disable=g-import-not-at-top
  sharding = jax.sharding.SingleDeviceSharding(device())
  placed = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding) for s in shapes]
  with tempfile.TemporaryDirectory() as folder:
    # Read by Mosaic at each kernel's compile; restored after, so that no later compile dumps
    # into a folder that is gone.
    with mock.patch.dict(os.environ, MOSAIC_GPU_DUMP_TO=folder, MOSAIC_GPU_DUMP_PTX="1"):
      jax.jit(fn).trace(*placed).lower(lowering_platforms=("cuda",)).compile(
          {"xla_gpu_autotune_level": 0})

    def dumps(suffix):  # {name: [path, ...] in Mosaic's numbering}
      found = {}
      for path in sorted(glob.glob(os.path.join(folder, "*" + suffix)),
                         key=lambda p: int(re.findall(r"_(\d+)\.", p)[-1])):
        name = re.sub(r"_\d+$", "", os.path.basename(path)[:-len(suffix)])
        found.setdefault(name, []).append(path)
      return found

    reports, resources = dumps(".ptxas"), dumps(".resources.txt")
    rows = []
    for name, paths in reports.items():
      for path, used in zip(paths, resources[name]):
        ptx = open(path[:-len(".ptxas")] + ".ptx").read()
        smem = re.search(r"smem_scratch_bytes=(\d+)", open(used).read())
        threads = re.search(r"\.maxntid (\d+)", ptx)
        rows.append({"kernel": name, **parse(open(path).read()), "threads": int(threads.group(1)),
                     "smem_bytes": int(smem.group(1)),
                     **{f"loop_{k}": v for k, v in hot_loop(ptx).items()}})
    return rows
