"""What XLA:GPU makes of a program, read on a machine without a GPU.

Why: GPU windows are short and rare, and a question such as "does this layout remove the
transpose kernels the H100 trace showed?" needs no clock, only XLA:GPU's compiler. XLA
compiles for a CUDA device that is not there (deviceless ahead-of-time compilation): jax's
CUDA PJRT plugin builds a compile-only topology from a target description (the device's
properties; `TARGETS`), and `jit(...).lower(...).compile()` against it runs XLA:GPU's whole
pipeline: fusion, layout assignment, GEMM rewriting, scheduling. Two options make it work
without a device: autotuning off (nothing to time on), and GEMMs through cuBLAS rather than
Triton fusions (XLA's Triton GEMM backend has no default config without autotuning, so a
real H100 fuses some GEMMs that this program leaves as cuBLAS calls; layouts, transposes
and the element-wise fusions are the same). Inside `target.compiling_for("gpu")`, so the
ops take the choices a GPU would (tile sizes, paths).

`kernels` reads the compiled HLO: every kernel a call launches (fusions, cuBLAS calls,
copies), times the trip count of the loops around it, with the bytes it writes. Bytes
written is a proxy for HBM traffic, not a time: a GPU window times (`launch/gpu_window.py`).

Needs jax's CUDA plugin, no GPU, driver or CUDA libraries: `pip install jax-cuda13-plugin==V
jax-cuda13-pjrt==V` with V = jax's version (~140 MB; the `jax[cuda13]` extra would add the
CUDA wheels, GBs, which compiling does not need).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import re
from typing import Any, Callable

import jax

from hypernet_attention.errors import BadInput
from hypernet_attention.ops import target

# An H100 SXM as XLA:GPU's cost model and fusion heuristics see it (the values of XLA's
# `xla/tools/hlo_opt/gpu_specs/h100_sxm.txtpb`: the device's published properties).
H100 = """
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
TARGETS = {"h100": H100}
COMPILER_OPTIONS = {"xla_gpu_autotune_level": 0, "xla_gpu_enable_triton_gemm": False}
_INSTALL = (f"jax's CUDA plugin (pip install jax-cuda13-plugin=={jax.__version__} "
            f"jax-cuda13-pjrt=={jax.__version__}; no GPU or driver needed)")


@functools.cache
def device(name: str = "h100") -> jax.Device:
  """A compile-only device of TARGETS[name] (one per process), or BadInput in one line."""
  if name not in TARGETS:
    raise BadInput(f"GPU target {name!r}; allowed: {', '.join(TARGETS)}")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  try:
    topology = topologies.get_topology_desc(platform="cuda", topology_name="",
                                            target_config=TARGETS[name], topology="1x1x1")
  except (NotImplementedError, RuntimeError) as e:
    raise BadInput(f"compiling for a GPU without one needs {_INSTALL}; here: "
                   f"{type(e).__name__}: {str(e).splitlines()[0][:120]}") from None
  return topology.devices[0]


def compile_text(fn: Callable, *args: Any, name: str = "h100") -> str:
  """Optimized HLO of `jit(fn)` compiled for GPU `name`. `args`: arrays or
  `jax.ShapeDtypeStruct`s (placed on the compile-only device here)."""
  sharding = jax.sharding.SingleDeviceSharding(device(name))
  placed = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                        args)
  with target.compiling_for("gpu"):
    lowered = jax.jit(fn).trace(*placed).lower()
  return lowered.compile(compiler_options=COMPILER_OPTIONS).as_text()


@dataclasses.dataclass(frozen=True)
class Kernel:
  """One kernel of a compiled program: `launches` per call of the program."""
  name: str
  family: str  # the name without its suffix (`gemm_fusion_dot.28`), or a custom call's target
  launches: int
  bytes_written: int  # per launch: its result, or the update of an in-place slice update
  transposes: bool    # it moves data between layouts (a transpose or a layout copy)


_ITEM_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
               "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}
_SHAPE = re.compile(r"\b(" + "|".join(_ITEM_BYTES) + r")\[([\d,]*)\]")
_HEADER = re.compile(r"^(ENTRY )?%([\w.\-]+) .*\{$")
_INSTRUCTION = re.compile(r"^(?:ROOT )?%([\w.\-]+) = (.+?) ([\w\-]+)\((.*)$")
# What launches no kernel: bookkeeping, and control flow (its bodies are walked instead).
_NOT_KERNELS = {"parameter", "tuple", "get-tuple-element", "bitcast", "constant", "while",
                "conditional", "call", "after-all", "partition-id", "add-dependency",
                "opt-barrier", "domain"}


def shape_bytes(text: str) -> int:
  """Bytes of every array shape written in `text` (a tuple counts each element)."""
  return sum(_ITEM_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
             for dtype, dims in _SHAPE.findall(text))


def _computations(hlo: str) -> tuple[str, dict[str, list[tuple[str, str, str, str, bool]]]]:
  """(entry name, {computation: [(name, result type, opcode, rest of line, is root)]})."""
  entry, current, comps = None, None, {}
  for line in hlo.splitlines():
    header = _HEADER.match(line)
    if header:
      current = header.group(2)
      comps[current] = []
      entry = current if header.group(1) else entry
    elif line.startswith("}"):
      current = None
    elif current is not None:
      found = _INSTRUCTION.match(line.strip())
      if found:
        comps[current].append((*found.groups(), line.strip().startswith("ROOT ")))
  if entry is None:
    raise ValueError("no ENTRY computation: not an HLO module's text")
  return entry, comps


def _called(rest: str, key: str) -> list[str]:
  found = re.search(key + r"=\{?([^,}]*(?:,\s*%[\w.\-]+)*)\}?", rest)
  return re.findall(r"%([\w.\-]+)", found.group(1)) if found else []


def kernels(hlo: str) -> list[Kernel]:
  """Every kernel one call of the compiled module launches, in program order, with launches
  multiplied by the known trip counts of the while loops around it."""
  entry, comps = _computations(hlo)
  runs = {entry: 1}
  order = [entry]
  for comp in order:  # Grows as loop bodies and branches are found.
    for _, _, opcode, rest, _ in comps[comp]:
      if opcode == "while":
        trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', rest)
        inner = runs[comp] * (int(trips.group(1)) if trips else 1)
        bodies = _called(rest, "body") + _called(rest, "condition")
      elif opcode in ("conditional", "call"):
        inner = runs[comp]
        bodies = (_called(rest, "branch_computations") + _called(rest, "to_apply")
                  + _called(rest, "true_computation") + _called(rest, "false_computation"))
      else:
        continue
      for body in bodies:
        if body in comps and body not in runs:
          runs[body] = inner
          order.append(body)
  out = []
  for comp in order:
    for name, result, opcode, rest, _ in comps[comp]:
      if opcode in _NOT_KERNELS:
        continue
      fused = comps.get(next(iter(_called(rest, "calls")), ""), [])
      custom = re.search(r'custom_call_target="([^"]+)"', rest)
      out.append(Kernel(
          name=name, family=custom.group(1) if custom else re.sub(r"\.\d+$", "", name),
          launches=runs[comp],
          # A cuBLAS call's result is (output, workspace): the workspace is scratch.
          bytes_written=shape_bytes(_SHAPE.search(result).group(0)) if custom and (
              "cublas" in custom.group(1)) else _written(result, fused),
          transposes=opcode in ("transpose", "copy") or any(
              op in ("transpose", "copy") for _, _, op, _, _ in fused)))
  return out


def _written(result: str, fused) -> int:
  """A fusion whose root updates a slice in place writes the update, not the buffer."""
  root = next((i for i in fused if i[4]), None)
  if root is not None and root[2] == "dynamic-update-slice":
    update = re.findall(r"%([\w.\-]+)", root[3])[1]
    types = {n: r for n, r, _, _, _ in fused}
    if update in types:
      return shape_bytes(types[update])
  return shape_bytes(result)


def summary(program: list[Kernel]) -> dict[str, Any]:
  """Totals per call, and per kernel family sorted by bytes written."""
  families = collections.defaultdict(lambda: [0, 0, False])
  for k in program:
    f = families[k.family]
    f[0] += k.launches
    f[1] += k.launches * k.bytes_written
    f[2] = f[2] or k.transposes
  moved = [k for k in program if k.transposes]
  return dict(
      launches=sum(k.launches for k in program),
      bytes_written=sum(k.launches * k.bytes_written for k in program),
      transpose_launches=sum(k.launches for k in moved),
      transpose_bytes=sum(k.launches * k.bytes_written for k in moved),
      families=[dict(family=n, launches=v[0], bytes_written=v[1], transposes=v[2])
                for n, v in sorted(families.items(), key=lambda kv: -kv[1][1])])
