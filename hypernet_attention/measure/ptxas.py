"""Registers and spills of the Mosaic kernels, from ptxas, compiled for an H100 without a GPU.

Why: a Hopper thread holds at most 255 registers; a kernel that needs more spills to local
memory, in its inner loop, and no CPU test sees it. XLA compiles for a CUDA device that is
not there (deviceless ahead-of-time compilation: jax's CUDA PJRT plugin builds a
compile-only H100 from a target description), and that runs Mosaic's whole pipeline down to
ptxas, whose report (`MOSAIC_GPU_DUMP_PTXAS`) gives each kernel's registers and spill bytes.
So a tile's register cost is known before a GPU window spends minutes on it; e.g. (ptxas
12.9.86, 2026-11-27, B=4 T=1024 H=8 D=V=64 bf16) the first backward kernel: 255 registers
and ~9 KB of spill stores per thread, the suspect of its 58 ms at T=4096 on an H200, and
its replacement none (experiments/results/kernels.md has the table).

  pip install jax-cuda12-plugin==V jax-cuda12-pjrt==V nvidia-cuda-nvcc-cu12   # V: jax's
  python experiments/tune_kernels.py --ptxas --configs=mosaic:64x8x4:kernel,mosaic:64x16x4:xla

`prepare()` must run before JAX picks its backends (the plugin's CUDA version checks need a
CUDA install this machine does not have; they are skipped, as nothing runs). Mosaic also
tries to disassemble with nvdisasm, absent from the wheels: its one "nvdisasm invocation
failed" line per kernel on stderr is harmless.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import tempfile
from typing import Any, Callable

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
  the nvidia-cuda-nvcc wheel's ptxas first on PATH. Without it XLA compiles with another
  ptxas (the registers forward at Blocks(64, 16, 2): 232 registers instead of 199), so
  the numbers name their ptxas. Returns its version ('' if the wheel is absent)."""
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


def parse(report: str) -> dict[str, int]:
  """ptxas's report of one kernel -> registers, spill_stores, spill_loads (bytes)."""
  registers = re.search(r"Used (\d+) registers", report)
  spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
  if not registers:
    raise ValueError(f"not a ptxas report: {report.strip()[:120]!r}")
  return dict(registers=int(registers.group(1)),
              spill_stores=int(spills.group(1)) if spills else 0,
              spill_loads=int(spills.group(2)) if spills else 0)


def kernels(fn: Callable, *shapes: Any) -> list[dict[str, int]]:
  """`parse` of every Mosaic kernel in `jit(fn)` compiled for `device()`, in the order
  Mosaic compiled them (program order). `shapes`: `jax.ShapeDtypeStruct`s."""
  import jax  # pylint: disable=g-import-not-at-top
  sharding = jax.sharding.SingleDeviceSharding(device())
  placed = [jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sharding) for s in shapes]
  previous = os.environ.get("MOSAIC_GPU_DUMP_TO")
  with tempfile.TemporaryDirectory() as folder:
    os.environ["MOSAIC_GPU_DUMP_TO"] = folder  # read by Mosaic at each kernel's compile
    try:
      jax.jit(fn).trace(*placed).lower(lowering_platforms=("cuda",)).compile(
          {"xla_gpu_autotune_level": 0})
    finally:  # no later compile dumps into a folder that is gone
      if previous is None:
        del os.environ["MOSAIC_GPU_DUMP_TO"]
      else:
        os.environ["MOSAIC_GPU_DUMP_TO"] = previous
    reports = sorted(glob.glob(os.path.join(folder, "*.ptxas")),
                     key=lambda p: int(re.findall(r"\d+", os.path.basename(p))[-1]))
    return [parse(open(p).read()) for p in reports]
