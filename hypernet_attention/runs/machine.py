"""The host a process ran on, as far as its float results depend on it (no JAX)."""

from __future__ import annotations

import os
import platform
from typing import Any

# /proc/cpuinfo fields that name a CPU where "model name" does not (a VM's "AMD EPYC").
_CPU_FIELDS = ("model name", "cpu family", "model", "stepping")
# Instruction sets that XLA:CPU's dot and reduction kernels (YNNPACK) choose between at run
# time: the same code, config and jax round differently on hosts that differ in them.
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile")


def _cpuinfo(path: str) -> tuple[dict[str, str], set[str]]:
  """The first CPU's `_CPU_FIELDS` and flags; empty where /proc/cpuinfo cannot be read."""
  fields, flags = {}, set()
  try:
    with open(path) as f:
      for line in f:
        key, _, value = (part.strip() for part in line.partition(":"))
        if key in _CPU_FIELDS:
          fields.setdefault(key, value)
        elif key == "flags" and not flags:
          flags = set(value.split())
  except OSError:
    pass
  return fields, flags


def host_cpu(fields: dict[str, str] | None = None) -> str:
  """The CPU's model name (a campaign cell file's `device.host_cpu`)."""
  fields = _cpuinfo("/proc/cpuinfo")[0] if fields is None else fields
  return fields.get("model name") or platform.processor() or "unknown"


def host(cpuinfo: str = "/proc/cpuinfo") -> dict[str, Any]:
  """What a process's float32 results and CPU timings depend on besides code, config and jax
  version: the CPU (model and the instruction sets above), the cores it may use, XLA_FLAGS.
  Training is bit-reproducible on one host, not across hosts that differ here (issue 43;
  experiments/reference.md, "What is bit-reproducible")."""
  fields, flags = _cpuinfo(cpuinfo)
  cpu = host_cpu(fields)
  if "cpu family" in fields:
    cpu += " (family {}, model {}, stepping {})".format(
        *(fields.get(k, "?") for k in _CPU_FIELDS[1:]))
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {"cpu": cpu, "isa": [f for f in ISA_FLAGS if f in flags], "cores": cores,
          "xla_flags": os.environ.get("XLA_FLAGS", "")}
