"""How long a cell will take on a device, and which cells fit in a budget.

An estimate comes, in this order, from (1) finished cells of the same experiment and model
preset on the same device kind (their cell files: member-steps per wall-second, evaluation and
compilation included), (2) the cell's own run so far on that device kind, where a window cut it
off (its progress record in `partial/`), (3) finished cells of the same model family there (a
last resort among measurements: HYLA+'s two-hidden-layer value network, Eq. 10, makes its step
dearer than HYLA's), or (4) the single-run training rates measured in the repository (the
`reference_rates` of the experiment's record, `registry.Paper`, each with its source), assuming
no population gain (conservative: a window then runs fewer cells than it could, never more).
Cells of another width or depth (Fig. 4) scale by width x depth; a MoE feed-forward cell with no
finished MoE cell to go by takes its dense family's rate over MOE_STEP_COST. Probes and
benchmarks take twice the longest finished cell of their kind and experiment on the device kind,
else a fixed allowance."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Optional, Sequence

from hypernet_attention.runs import registry
from hypernet_attention.runs import run_files
from launch.campaign import cells as cells_lib

COMPILE_S = {"cpu": 60.0, "gpu": 30.0, "tpu": 30.0}
EVAL_OVERHEAD = 1.15  # Evaluations and checkpoints on top of the training steps.
FIXED_MINUTES = {("probe", "cpu"): 30.0, ("probe", "gpu"): 8.0, ("probe", "tpu"): 8.0,
                 ("benchmark", "cpu"): 15.0, ("benchmark", "gpu"): 5.0, ("benchmark", "tpu"): 5.0}
H100 = "NVIDIA H100 80GB HBM3"
# A MoE feed-forward step over the dense one (fuzzy logic, paper size, a 2-core CPU; the timing
# is in experiments/reference.md, "The paper-scale campaign").
MOE_STEP_COST = 4.3


@dataclasses.dataclass(frozen=True)
class Estimate:
  minutes: float
  source: str
  done_steps: int = 0  # Steps a resumable workdir on this machine already has.


def family(device_kind: str) -> str:
  kind = device_kind.lower()
  return "cpu" if kind == "cpu" else "tpu" if "tpu" in kind else "gpu"


def model_family(preset: str) -> str:
  return next((f for f in ("hyla", "softmax", "linear") if preset.startswith(f)), "hyla")


def scale(cell: cells_lib.Cell) -> float:
  """Step cost relative to the reference size (Fig. 4: width x depth / 4)."""
  width = re.search(r"width=(\d+)", cell.config)
  depth = re.search(r"depth=(\d+)", cell.config)
  if not (width and depth):
    return 1.0
  return int(width.group(1)) * int(depth.group(1)) / 4


def checkpointed_step(workdir: str) -> int:
  """The newest checkpoint step in `workdir` (0 if none): where a rerun resumes."""
  directory = os.path.join(workdir, run_files.CHECKPOINTS)
  if not os.path.isdir(directory):
    return 0
  return max((int(n) for n in os.listdir(directory) if n.isdigit()), default=0)


def measured_rate(cell: cells_lib.Cell, device_kind: str, records: Sequence[dict[str, Any]],
                  saved: Optional[dict[str, Any]] = None) -> Optional[tuple[float, str]]:
  """Member-steps per wall-second of `cell` on `device_kind` and where that comes from: the
  best of finished cells of its model preset (same experiment, size and feed-forward), else
  the cell's own cut-off run (`saved`: its progress record), else the best of its model
  family. The best, not the median: a cell slowed by a shared machine would otherwise keep
  every later cell from starting, and a cell that overruns is only checkpointed, not lost."""
  moe = cells_lib.is_moe(dict(cell.overrides))
  like = [r for r in records
          if r["kind"] == "train" and r["device"]["kind"] == device_kind
          and r["experiment"] == cell.experiment and r.get("member_steps_per_s")
          and model_family(r["model"]) == model_family(cell.model)
          and r.get("scale", 1.0) == scale(cell)
          and cells_lib.is_moe(r.get("overrides", {})) == moe]
  preset = [r["member_steps_per_s"] for r in like if r["model"] == cell.model]
  if preset:
    return max(preset), f"measured: {len(preset)} {cell.model} cell(s) on {device_kind}"
  if saved and saved["device"]["kind"] == device_kind and saved["step"] and saved["wall_s"]:
    return (saved["step"] * len(cell.members) / saved["wall_s"],
            f"measured: its own {saved['step']:,} steps on {device_kind}")
  if like:
    return (max(r["member_steps_per_s"] for r in like),
            f"measured: {len(like)} {model_family(cell.model)} cell(s) on {device_kind}")
  return None


def estimate(cell: cells_lib.Cell, device_kind: str, records: Sequence[dict[str, Any]],
             workdir: Optional[str] = None,
             saved: Optional[dict[str, Any]] = None) -> Optional[Estimate]:
  """Minutes `cell` needs on `device_kind` from where its workdir is, or from the step of
  `saved` (a cut-off cell's progress record in `partial/`, whose state the runner unpacks
  into a workdir without a checkpoint); None if unknown."""
  fam = family(device_kind)
  if cell.kind != "train":
    walls = [r["wall_s"] for r in records if r["kind"] == cell.kind and r.get("wall_s")
             and r["experiment"] == cell.experiment and r["device"]["kind"] == device_kind]
    if walls:  # Twice the longest: these cells are short, and a shared machine slows them.
      return Estimate(2 * max(walls) / 60, f"measured: {len(walls)} cell(s) on {device_kind}")
    minutes = FIXED_MINUTES.get((cell.kind, fam))
    return Estimate(minutes, "allowance") if minutes else None
  done = min(checkpointed_step(workdir) if workdir else 0, cell.num_steps) or min(
      saved["step"] if saved else 0, cell.num_steps)
  member_steps = (cell.num_steps - done) * len(cell.members)
  measured = measured_rate(cell, device_kind, records, saved)
  if measured:
    rate, source = measured
    return Estimate(member_steps / rate / 60, source, done)
  if cells_lib.is_moe(dict(cell.overrides)):  # no MoE cell done here: the dense rate, scaled
    dense = estimate(dataclasses.replace(cell, overrides=tuple(
        o for o in cell.overrides if o != cells_lib.MOE)), device_kind, records, workdir,
                     saved)
    return dense and Estimate(dense.minutes * MOE_STEP_COST,
                              f"{dense.source} x {MOE_STEP_COST} (MoE)", dense.done_steps)
  paper = registry.get(cell.experiment).paper
  reference = paper.reference_rates.get(fam) if paper else None
  if reference is None:
    return None
  rates, source = reference
  rate = rates[model_family(cell.model)] / scale(cell) / EVAL_OVERHEAD
  return Estimate((member_steps / rate + COMPILE_S[fam]) / 60, source, done)


def fmt_minutes(minutes: Optional[float]) -> str:
  return "?" if minutes is None else f"{minutes:.0f}" if minutes >= 10 else f"{minutes:.1f}"
