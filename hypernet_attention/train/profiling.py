"""Where a train step's time goes, per JAX op: a `jax.profiler` trace mapped to op names.

XLA:CPU's trace names each executed HLO instruction (`ynn_fusion.33`, `dot.12`), which says little.
The compiled HLO text carries each instruction's JAX `op_name` metadata (e.g.
`.../transpose(jvp(Transformer))/layers_2/attention/relative_position/hn,qkn->hqk`), so this module
joins the two and sums the time per op over layers.

On a GPU the trace has a device process (`/device:GPU:0`) whose stream events are the
kernels: only those count (the host's thunk events would count each op twice), and a kernel
is named after its HLO fusion with `.` as `_` (`gemm_fusion_dot_28` for `gemm_fusion_dot.28`),
which `instruction_ops` also answers to. Kernels no HLO instruction names (cuBLAS's
`nvjet_*`, launched by a custom call) are rows of their own, `(kernel nvjet_...)`, so the
step's time adds up (experiments/results/gpu_windows/2026-11-26_h100)."""

from __future__ import annotations

import collections
import dataclasses
import glob
import gzip
import json
import os
import re
import tempfile
from typing import Any, Callable

import jax
import ml_collections

from hypernet_attention.train import benchmark

_INSTRUCTION = re.compile(r"\s*%?(\S+) = (\S+?)(?:\{[^}]*\})? \w+\(")
_OP_NAME = re.compile(r'op_name="([^"]*)"')


@dataclasses.dataclass(frozen=True)
class OpTime:
  """Time per train step of one JAX op, summed over layers (`layers_N` -> `layers_L`)."""
  op: str        # op_name, `FWD`/`BWD` for the model's forward and backward pass.
  shape: str     # Output shape of the (first) HLO instruction, e.g. f32[128,16,36,36].
  ms_per_step: float
  instructions: int  # HLO instructions summed into this row.


@dataclasses.dataclass(frozen=True)
class Profile:
  ms_per_step: float       # All HLO instructions together.
  ops: list[OpTime]        # Largest first.
  trace_dir: str


def _op_key(op_name: str) -> str:
  op = re.sub(r"layers_\d+", "layers_L", op_name)
  # jax 0.11 names the body of a closed call `eval_jaxpr/`; 0.10 did not: same keys on both.
  op = re.sub(r"(^|/)eval_jaxpr/", r"\1", op)
  op = re.sub(r"^.*?/while/body/(closed_call/)?", "", op)
  op = re.sub(r"^jit\([^)]*\)/", "", op)  # A host-fed step: one jitted step, no loop.
  return op.replace("transpose(jvp(Transformer))", "BWD").replace("jvp(Transformer)", "FWD")


def instruction_ops(hlo_text: str) -> dict[str, tuple[str, str]]:
  """{HLO instruction name: (output shape, op key)} from compiled HLO text, each name also
  as a GPU kernel spells it (`.` as `_`) where that names no other instruction."""
  table, kernel_names = {}, {}
  for line in hlo_text.splitlines():
    match = _INSTRUCTION.match(line)
    if match:
      op_name = _OP_NAME.search(line)
      name = match.group(1)
      key = _op_key(op_name.group(1)) if op_name else f"({name.split('.')[0]}, no op name)"
      table[name] = (match.group(2), key)
      kernel_names[name.replace(".", "_")] = table[name]
  return {**kernel_names, **table}


def event_durations_us(events: list[dict]) -> tuple[collections.Counter, bool]:
  """({event name: summed microseconds}, whether they are a device's kernels): the device
  processes' events where the trace has any (GPU, TPU), else every event (XLA:CPU)."""
  devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") ==
             "process_name" and str(e.get("args", {}).get("name", "")).startswith("/device:")}
  durations = collections.Counter()
  for event in events:
    if event.get("ph") == "X" and "dur" in event and (not devices or event["pid"] in devices):
      durations[event["name"]] += event["dur"]
  return durations, bool(devices)


def trace_events(trace_dir: str) -> list[dict]:
  paths = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
  if not paths:
    raise FileNotFoundError(f"no perfetto trace under {trace_dir}")
  with gzip.open(max(paths, key=os.path.getmtime)) as f:
    return json.load(f)["traceEvents"]


def op_times(events: list[dict], ops: dict[str, tuple[str, str]], steps: int) -> list[OpTime]:
  """The trace's time per step by op key, largest first; on a device, kernels no
  instruction names are rows `(kernel NAME)` of unknown shape."""
  durations, on_device = event_durations_us(events)
  per_op, shapes, counts = collections.Counter(), {}, collections.Counter()
  for name, micros in durations.items():
    if name in ops:
      shape, key = ops[name]
    elif on_device:
      shape, key = "?", f"(kernel {name})"
    else:
      continue
    per_op[key] += micros
    shapes.setdefault(key, shape)
    counts[key] += 1
  return [OpTime(key, shapes[key], micros / steps / 1e3, counts[key])
          for key, micros in per_op.most_common()]


def profile_train_step(config: ml_collections.ConfigDict, steps: int = 10,
                       trace_dir: str | None = None) -> Profile:
  """Compiles `config`'s train chunk, runs it once, then traces one `steps`-step chunk.

  The program whose instructions the trace names is the one `benchmark.prepare` compiled:
  the scanned `steps`-step chunk (on-device data) or the one-step function a host-fed
  experiment (C4) runs `steps` times."""
  prepared = benchmark.prepare(config, steps)
  trace_dir = trace_dir or tempfile.mkdtemp(prefix="profile_step_")
  with jax.profiler.trace(trace_dir, create_perfetto_trace=True):
    prepared.run_chunk(steps)
  rows = op_times(trace_events(trace_dir), instruction_ops(prepared.plan.compiled.as_text()), steps)
  return Profile(sum(r.ms_per_step for r in rows), rows, trace_dir)


def kernel_ms(fn: Callable, args: Any, calls: int) -> dict[str, float]:
  """Milliseconds per call of each device kernel of `jit(fn)(*args)`, largest first, from a
  trace of `calls` calls after one untraced: by name (a Mosaic kernel by its body's, e.g.
  `hyla_dv_mosaic_gpu_kernel`; XLA's by fusion). Empty without a device (XLA:CPU)."""
  jitted = jax.jit(fn)
  jax.block_until_ready(jitted(*args))
  with tempfile.TemporaryDirectory() as folder:
    with jax.profiler.trace(folder, create_perfetto_trace=True):
      for _ in range(calls):
        out = jitted(*args)
      jax.block_until_ready(out)
    durations, on_device = event_durations_us(trace_events(folder))
  return {name: micros / calls / 1e3 for name, micros in durations.most_common() if on_device}
