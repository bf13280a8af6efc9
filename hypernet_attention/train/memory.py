"""Does one training chunk fit in memory? Asked of XLA's compiled program before any work.

A batch too large for the device otherwise shows itself after the state is built: as the allocator's
RESOURCE_EXHAUSTED traceback (GPU, TPU) or the kernel's OOM killer (CPU). Shape arithmetic cannot
predict it (fusion, scan, buffer reuse and donation move the peak by several times); the compiled
executable's `memory_analysis()` is XLA's own buffer assignment. Compiling the first chunk ahead of
time costs nothing extra: the jitted call that follows finds the same executable in JAX's cache
(`tests/e2e/test_compile_once.py` counts the traces of whole runs with this check on)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Optional, Sequence

import jax

from hypernet_attention import errors

_GIB = 2.0**30


def _size(num_bytes: float) -> str:
  return (f"{num_bytes / _GIB:.2f} GiB" if num_bytes >= 2**30 / 10
          else f"{num_bytes / 2**20:.1f} MiB")


@dataclasses.dataclass(frozen=True)
class Footprint:
  """Bytes per device of one compiled chunk (XLA's buffer assignment)."""
  arguments: int  # The state (and a host batch) handed in.
  outputs: int  # Outputs not written over donated arguments (metrics, mostly).
  temporaries: int  # Activations, gradients, optimizer temporaries.

  @property
  def total(self) -> int:
    return self.arguments + self.outputs + self.temporaries


def footprint(compiled: jax.stages.Compiled) -> Optional[Footprint]:
  """None where the backend reports no analysis."""
  stats = compiled.memory_analysis()
  if stats is None:
    return None
  return Footprint(
      arguments=int(stats.argument_size_in_bytes),
      outputs=max(int(stats.output_size_in_bytes - stats.alias_size_in_bytes), 0),
      temporaries=int(stats.temp_size_in_bytes))


@dataclasses.dataclass(frozen=True)
class Capacity:
  """The memory one chunk's devices draw on."""
  bytes: int
  described: str  # For the message: whose memory, and how much.
  shared_by: int  # Devices of this process that draw on it (CPU devices share the host's).


def host_available_bytes() -> Optional[int]:
  """The kernel's estimate of memory available without swapping (`MemAvailable`), capped by
  a cgroup v2 limit (containers); None where neither can be read."""
  available = None
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          available = int(line.split()[1]) * 1024
  except (OSError, ValueError, IndexError):
    pass
  try:
    with open("/sys/fs/cgroup/memory.max") as f:
      limit = f.read().strip()
    with open("/sys/fs/cgroup/memory.current") as f:
      used = int(f.read().strip())
    if limit != "max":
      left = int(limit) - used
      available = left if available is None else min(available, left)
  except (OSError, ValueError):
    pass
  return available


def capacity(devices: Sequence[Any]) -> Optional[Capacity]:
  """What this process's first device can hold; None where it cannot be known."""
  local = [d for d in devices if d.process_index == jax.process_index()] or list(devices)
  device = local[0]
  if device.platform == "cpu":
    available = host_available_bytes()
    if available is None:
      return None
    return Capacity(available, f"this host has {_size(available)} available"
                    + (f", shared by its {len(local)} CPU devices" if len(local) > 1 else ""),
                    len(local))
  stats = device.memory_stats() or {}
  if "bytes_limit" not in stats:
    return None
  return Capacity(int(stats["bytes_limit"]),
                  f"one {device.device_kind} gives XLA {_size(stats['bytes_limit'])}", 1)


@dataclasses.dataclass(frozen=True)
class Fit:
  """What one chunk needs and what it has; either None where unknown."""
  need: Optional[Footprint]
  have: Optional[Capacity]

  def describe(self) -> str:
    if self.need is None:
      return "its memory is unknown (no analysis on this backend)"
    return (f"it needs {_size(self.need.total)} per device"
            + (f"; {self.have.described}" if self.have else ""))


def check_fits(compiled: jax.stages.Compiled, devices: Sequence[Any], batch_size: int,
               members: int = 1) -> Fit:
  """Raises `errors.BadInput` naming the batch size when one chunk cannot fit. Several
  processes on CPU are not checked: each host's free memory differs, and all processes must
  take the same decision."""
  need = footprint(compiled)
  if devices[0].platform == "cpu" and jax.process_count() > 1:
    return Fit(need, None)
  have = capacity(devices)
  if need is None or have is None or need.total * have.shared_by <= have.bytes:
    return Fit(need, have)
  what = f"batch_size={batch_size}" + (f" with {members} members" if members > 1 else "")
  per_device = have.bytes / have.shared_by
  fixed = need.arguments + need.outputs  # The state mostly: it does not shrink with a batch.
  # Temporaries grow about in proportion to the batch.
  fits = math.floor(batch_size * (per_device - fixed) / max(need.temporaries, 1))
  smaller = ("a smaller model (model.emb_dim, model.mlp_dim, model.num_layers)"
             + (", fewer members" if members > 1 else ""))
  if fixed >= per_device:
    advice = (f"the state alone needs {_size(fixed)} per device: {smaller} or more devices "
              "to shard it")
  elif fits < 1:  # Not even one example: a smaller batch is no advice that can be followed.
    advice = (f"even batch_size=1 would not fit (about {_size(need.temporaries / batch_size)} of "
              f"temporaries per example beside {_size(fixed)} of state): {smaller} or more devices")
  else:
    advice = (f"a batch_size of about {fits} or less would fit"
              + (", or fewer members" if members > 1 else "") + "; or more devices")
  raise errors.BadInput(
      f"{what} does not fit in memory: one training chunk needs {_size(need.total)} per device "
      f"(XLA's analysis of the compiled step: {_size(need.arguments)} state and inputs, "
      f"{_size(need.temporaries)} temporaries) and {have.described}; allowed: {advice}")
