r"""The paper-scale campaign: runs the next cells within a budget; reports what is done.

  python -m launch.campaign --dry_run                    # the plan and estimates, runs nothing
  python -m launch.campaign --budget_minutes=25          # run what fits in 25 minutes
  setsid nohup python -m launch.campaign --budget_minutes=150 > campaign.out 2>&1 &
  cat workdirs/campaign/progress.txt                     # what runs, how far, what is left
  python -m launch.campaign --report                     # experiments/results/paper_scale.md

Cells run in the priority order of `cells.STAGES`. Each finished cell is one JSON file in
--results_dir (commit it: windows on different machines add up); finished cells are skipped
(--redo=NAME reruns one); a cell cut off by the budget leaves its progress and resume state
in --results_dir/partial/ (commit them too), and the next runner anywhere resumes it.
--cells picks cells by name or shell pattern (`a_*`, `b_sraven_hyla`).
"""

from __future__ import annotations

import fnmatch
import math
import os
import signal
import time

from absl import flags

from hypernet_attention import errors
from hypernet_attention.runs import cli
from hypernet_attention.runs import run_files
from launch.campaign import cells as cells_lib
from launch.campaign import partial
from launch.campaign import records
from launch.campaign import report
from launch.campaign import runner


def _define_flags() -> None:
  """Defined only when run as a program, so that other tools can import this module."""
  flags.DEFINE_float("budget_minutes", None, "Wall-clock minutes this invocation may use; "
                     "cells that would not finish in what is left are not started.")
  flags.DEFINE_list("cells", None, "Cell names or shell patterns (default: every cell of "
                    "--set, in priority order).")
  flags.DEFINE_enum("set", "paper", list(cells_lib.SETS), "Which cells: the paper's, or a "
                    "smoke campaign that runs in a minute on a CPU.")
  flags.DEFINE_string("root", os.path.join("workdirs", "campaign"), "Workdirs, one per cell, "
                      "and progress.txt.")
  flags.DEFINE_string("results_dir", records.DEFAULT_DIR, "Cell files (commit them).")
  flags.DEFINE_list("redo", [], "Cells to rerun although their file exists: a finished "
                    "workdir is moved aside and the cell trains afresh (the file is replaced "
                    "only when the rerun finishes).")
  flags.DEFINE_bool("dry_run", False, "Print the plan with estimates; run nothing.")
  flags.DEFINE_bool("report", False, "Write the report from the cell files; run nothing.")
  flags.DEFINE_string("report_path", report.DEFAULT_PATH, "Where --report writes (figures go "
                      "beside it, in paper_scale/figures/).")
  flags.DEFINE_integer("max_concurrent", 1, "Cells run at once (1: two at once on one GPU "
                       "each run at half the speed, experiments/results/training_throughput.md).")
  flags.DEFINE_float("stop_margin_s", 120.0, "SIGTERM a running cell this many seconds before "
                     "the budget ends (it checkpoints and exits).")
  flags.DEFINE_string("device_kind", None, "--dry_run: plan for this device kind instead of "
                      "asking jax (e.g. 'cpu', 'NVIDIA H100 80GB HBM3').")

def select(patterns, cell_set: str) -> list[cells_lib.Cell]:
  pool = cells_lib.SETS[cell_set]
  if not patterns:
    return list(pool)
  for p in patterns:
    if not any(fnmatch.fnmatchcase(c.name, p) for c in pool):
      raise errors.BadInput(f"--cells={p!r} matches no cell of --set={cell_set}; allowed: "
                            f"names or patterns of {', '.join(c.name for c in pool[:6])}, "
                            f"... (python -m launch.campaign --dry_run lists them)")
  return [c for c in pool if any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]


def _check_flags(cells) -> None:
  f = flags.FLAGS
  if f.budget_minutes is None and not (f.dry_run or f.report):
    raise errors.BadInput("--budget_minutes is required to run cells; allowed: minutes "
                          "> 0 (or --dry_run / --report)")
  if f.budget_minutes is not None and not (math.isfinite(f.budget_minutes)
                                           and f.budget_minutes > 0):
    raise errors.BadInput(f"--budget_minutes={f.budget_minutes}; allowed: a number of minutes > 0")
  if f.max_concurrent < 1:
    raise errors.BadInput(f"--max_concurrent={f.max_concurrent}; allowed: an integer >= 1")
  if not (math.isfinite(f.stop_margin_s) and f.stop_margin_s >= 0):
    raise errors.BadInput(f"--stop_margin_s={f.stop_margin_s}; allowed: seconds >= 0")
  unknown = [r for r in f.redo if r not in {c.name for c in cells}]
  if unknown:
    raise errors.BadInput(f"--redo={','.join(unknown)}: not among the selected cells; "
                          "allowed: names of cells --cells selects")
  if not f.root.strip():
    raise errors.BadInput("--root=''; allowed: a directory path")
  # A folder to be (a file there, or above it, is named; created if missing).
  run_files.check_output_dir(f.root, "--root")
  if f.report:
    if os.path.isdir(f.report_path) or not f.report_path.endswith(".md"):
      raise errors.BadInput(f"--report_path={f.report_path!r}; allowed: a Markdown file path "
                            "ending in .md (its figures go beside it)")
    run_files.output_path(f.report_path, "--report_path", overwrite=True)  # Below a file: refused.


def _on_sigterm(signum, frame):
  del signum, frame
  raise SystemExit(cli.PREEMPTED_EXIT_CODE)


def main(argv) -> int:
  del argv
  # First: a SIGTERM from now on stops cleanly (exit 75), even before any cell has started.
  signal.signal(signal.SIGTERM, _on_sigterm)
  f = flags.FLAGS
  cells = select(f.cells, f.set)
  _check_flags(cells)
  existing = records.read_all(f.results_dir)  # A corrupt cell file fails here, first.
  if f.report:
    print(report.write(existing, f.report_path, partial.read_all(f.results_dir),
                       records.read_redraws(f.results_dir)))
    return 0
  if not f.dry_run:
    records.check_writable(f.results_dir)
    if f.device_kind is not None:
      # A run records the device that ran it: another kind there would publish, say, a
      # CPU's rates as an H100's, and later plans would read them so.
      raise errors.BadInput(f"--device_kind={f.device_kind!r} without --dry_run; "
                            "allowed: only with --dry_run (a run asks jax what it runs on)")
  device = ({"kind": f.device_kind, "jax_version": "?"} if f.device_kind else runner.device_info())
  if f.dry_run:
    print(report.plan_text(cells, existing, device["kind"], f.root, f.budget_minutes,
                           partial.read_all(f.results_dir), f.results_dir, frozenset(f.redo)))
    return 0
  options = runner.Options(
      root=os.path.abspath(f.root), results_dir=os.path.abspath(f.results_dir),
      budget_s=f.budget_minutes * 60, redo=frozenset(f.redo),
      max_concurrent=f.max_concurrent, stop_margin_s=f.stop_margin_s)
  start = time.time()
  print(f"campaign on {device['kind']} (jax {device['jax_version']}): {len(cells)} cell(s) "
        f"selected, {len(existing)} done before; budget {f.budget_minutes:g} min; "
        f"progress in {os.path.join(options.root, runner.PROGRESS)}", flush=True)
  outcomes = runner.Campaign(cells, options, device,
                             log=lambda s: print(f"{time.strftime('%H:%M:%S')} {s}",
                                                 flush=True)).run()
  count = {s: sum(o.status == s for o in outcomes)
           for s in ("finished", "stopped", "failed", "skipped", "done")}
  print(f"Result: {count['finished']} cell(s) finished, {count['stopped']} stopped "
        f"(resumable), {count['failed']} failed, {count['skipped']} not started, "
        f"{count['done']} done before; {(time.time() - start) / 60:.1f} min. Cell files in "
        f"{f.results_dir}; `python -m launch.campaign --report` updates the report.")
  return 1 if count["failed"] else 0


if __name__ == "__main__":
  _define_flags()
  cli.run(main)
