r"""Tabulates a sweep's root: best hyperparameters per method, mean +- s.e. over seeds.

  python -m launch.collect --root=/work/runs/table_a1_fuzzy_local --sweep=table_a1_fuzzy_local

Reads every `config.json` (and `summary.json` where the run finished) under --root. Runs are
grouped into cells by what varies across the sweep apart from the seed and the optimizer
grid (`HPARAMS`): for Table A1 a cell is a method (attention preset, + MoE). In each cell,
each grid setting's selection metric is averaged over its finished seeds and the best
setting is reported: its OOD metric x100, mean +- standard error over seeds (s.e. = sample
std / sqrt(n); one seed has none), beside the paper's Table A1 number. Every row is also
compared with softmax attention seed by seed (`paired`): a seed fixes the held-out split,
so the paired difference is free of the split's variance.

Selection (--select): `ood` picks the setting by the OOD metric itself, as the paper did
(so the reported OOD number is optimistically biased: it is the best of the grid on the
same data); `test` picks by the in-distribution test metric, the honest choice (the OOD
data play no part in picking). Partial sweeps are fine: each cell says how many seeds it
has, and with --sweep the jobs without a summary are listed as missing.

Writes table_a1.md, table_a1.csv and table_a1.png (bars with s.e. error bars) to --out
(default: --root) and prints the markdown.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import io
import json
import math
import os
import sys
from typing import Any, Optional, Sequence

from absl import flags
import numpy as np

from hypernet_attention import errors
from hypernet_attention.runs import cli
from hypernet_attention.runs import registry
from hypernet_attention.runs import run_files
from launch import jobs
from launch import run_local
from launch import sweeps
from launch.sweeps import common

HPARAMS = ("optimizer.learning_rate", "optimizer.weight_decay", "optimizer.warmup_steps")
# Keys that never define a cell: the seed, and what may differ between a run and its resume
# (runs written before such a key existed lack it).
IGNORED = ("seed",) + run_files.RESUME_FREE_KEYS
SELECTIONS = ("ood", "test")


@dataclasses.dataclass(frozen=True)
class Run:
  """One workdir: its flattened config and, if finished, its summary."""
  workdir: str
  config: dict[str, Any]
  summary: Optional[dict[str, Any]]
  cpu_s: float  # CPU time of its run_local processes (0 when not run by run_local).

  @property
  def frozen_at_step(self) -> Optional[int]:
    """A population member whose loss turned non-finite: it finished, frozen at its last
    finite state (`population_loop.py`), so it is a failed run, not a result."""
    return (self.summary or {}).get("frozen_at_step")

  @property
  def finished(self) -> bool:
    return self.summary is not None and self.frozen_at_step is None


@dataclasses.dataclass(frozen=True)
class Stat:
  """Mean and standard error over seeds (x100), and the per-seed values."""
  mean: float
  se: float  # nan for a single seed.
  values: tuple[float, ...]

  @classmethod
  def of(cls, values: Sequence[float]) -> "Stat":
    v = np.asarray(values, np.float64) * 100
    se = float(v.std(ddof=1) / math.sqrt(len(v))) if len(v) > 1 else float("nan")
    return cls(float(v.mean()), se, tuple(float(x) for x in v))

  def __str__(self) -> str:
    return f"{self.mean:.2f}" + ("" if math.isnan(self.se) else f" ± {self.se:.2f}")


@dataclasses.dataclass(frozen=True)
class Cell:
  """One table row: a cell's best grid setting and what it scored."""
  label: str
  key: tuple  # (attention preset, MoE?) for Table A1 rows.
  # The other settings that vary across the root ((key, value) pairs): one sweep's cells
  # share it; only cells of one group are compared with each other (`paired`).
  group: tuple
  setting: dict[str, Any]  # The best setting's HPARAMS values.
  num_settings: int  # Grid settings with at least one finished seed.
  ood: Stat
  test: Stat
  seeds: tuple[int, ...]
  paper: Optional[tuple[float, float]]


@dataclasses.dataclass(frozen=True)
class Paired:
  """A row minus the baseline row, seed by seed, on the seeds both have.

  A seed fixes the held-out split, the data order and the initialization, so the two runs of
  one seed share their split: pairing takes the split's variance (large on these tasks) out
  of the comparison, which unpaired error bars cannot."""
  label: str
  seeds: tuple[int, ...]
  diff: Stat  # OOD metric x100, row minus baseline.
  wins: int  # Seeds where the row scores above the baseline.
  p_value: float  # Two-sided paired t-test (scipy.stats.ttest_rel); nan below 2 seeds.

  @classmethod
  def of(cls, label: str, row: dict[int, float], base: dict[int, float]) -> Optional["Paired"]:
    """`row` minus `base` ({seed: OOD metric}) on the seeds both have; None if none."""
    from scipy import stats  # pylint: disable=g-import-not-at-top
    seeds = tuple(sorted(set(row) & set(base)))
    if not seeds:
      return None
    x, y = np.array([row[s] for s in seeds]), np.array([base[s] for s in seeds])
    p_value = float(stats.ttest_rel(x, y).pvalue) if len(seeds) > 1 else float("nan")
    return cls(label, seeds, Stat.of(x - y), int((x > y).sum()), p_value)


def _read_cpu(workdir: str) -> float:
  path = run_files.path(workdir) / run_local.TIMES
  if not path.exists():
    return 0.0
  return sum(json.loads(line)["cpu_s"] for line in path.read_text().splitlines() if line.strip())


def _read_run(directory: str) -> Run:
  """One workdir; `BadInput` naming the file that cannot be read."""
  config = run_files.read_config(directory)  # `find_runs` found it; BadInput if unusable.
  summary = run_files.read_summary(directory)
  if summary is not None and not isinstance(summary, dict):
    raise errors.BadInput(f"{run_files.path(directory) / run_files.SUMMARY} is not a "
                              "summary (a JSON object)")
  try:
    cpu_s = _read_cpu(directory)
  except (OSError, ValueError, KeyError, TypeError):
    cpu_s = 0.0  # Timing only: the run itself is fine.
  return Run(directory, run_files.flatten(config), summary, cpu_s)


def load_runs(root: str, warn=None) -> list[Run]:
  """Every readable workdir under `root` (a directory holding config.json, local or gs://),
  sorted by path.

  A run whose config.json or summary.json cannot be read is skipped, and `warn` (default:
  stderr) gets one line naming the file."""
  warn = warn or (lambda line: print(line, file=sys.stderr, flush=True))
  runs = []
  for directory in run_files.find_runs(root):
    try:
      runs.append(_read_run(str(directory)))
    except errors.BadInput as e:
      warn(f"warning: skipping {directory}: {e}")
  for run in runs:
    if run.frozen_at_step is not None:
      warn(f"warning: {run.workdir} failed: its loss turned non-finite at step "
           f"{run.frozen_at_step} (a frozen population member); not counted")
  return _once(runs, warn)


def _once(runs: Sequence[Run], warn) -> list[Run]:
  """Each run once: the same point trained twice (a population's member and a single
  run, two members of one population, a copied workdir) would count as two seeds. Keeps
  the first finished copy (by path) and warns naming both."""
  kept: dict[str, Run] = {}
  for run in sorted(runs, key=lambda r: (not r.finished, r.workdir)):
    point = json.dumps({k: v for k, v in run.config.items() if k.split(".")[0] not in IGNORED
                        or k == "seed"}, sort_keys=True, default=str)
    if point in kept:
      warn(f"warning: {run.workdir} is the same run as {kept[point].workdir} (same config); "
           "counted once")
      continue
    kept[point] = run
  return sorted(kept.values(), key=lambda r: r.workdir)


def _cell_keys(runs: Sequence[Run]) -> list[str]:
  """Config keys that vary across the runs, other than the seed, the grid and resume keys."""
  keys = sorted(set().union(*(r.config for r in runs)))
  return [k for k in keys if k not in HPARAMS and k.split(".")[0] not in IGNORED
          and len({json.dumps(r.config.get(k)) for r in runs}) > 1]


# The settings that make a row (the model); every other varying setting makes a group.
ROW_KEYS = ("model.attention", "model.feed_forward")


def grid_rows(runs: Sequence[Run], keys: Sequence[str] = ()) -> dict[tuple, dict[tuple, dict]]:
  """{(row label, row key, group): {grid setting (HPARAMS values): {seed: run}}} of finished
  `runs`, in Table A1's row order, then by label. `keys`: the settings that vary across them
  (`_cell_keys`); those other than the row's make the group, named in the label. A seed
  found twice at one setting counts once (the first run's). Both tables are made from it:
  `tabulate` here and the campaign's report."""
  rows: dict = collections.defaultdict(lambda: collections.defaultdict(dict))
  for run in runs:
    c = run.config
    key = (c["model.attention"], c.get("model.feed_forward") == "moe")
    name = common.TABLE_A1_ROWS.get(key, key[0] + (" + MoE" if key[1] else ""))
    label = ", ".join([name] + [f"{k}={c.get(k)}" for k in keys if k not in ROW_KEYS])
    group = tuple((k, json.dumps(c.get(k))) for k in keys if k not in ROW_KEYS)
    rows[label, key, group][tuple(c.get(h) for h in HPARAMS)].setdefault(c["seed"], run)
  order = list(common.TABLE_A1_ROWS)
  rank = lambda row: (order.index(row[1]) if row[1] in order else len(order), row[0])
  return {row: rows[row] for row in sorted(rows, key=rank)}


def best_setting(settings: dict[tuple, dict], key: str) -> tuple:
  """Of `grid_rows`' settings of one row, the one whose runs' mean `key` (a summary metric,
  `ood/r2`) is highest; the first of equals."""
  return max(settings, key=lambda s: np.mean([r.summary[key] for r in settings[s].values()]))


def tabulate(runs: Sequence[Run], select: str = "ood") -> list[Cell]:
  """One Cell per group of finished runs, in Table A1's row order."""
  if select not in SELECTIONS:
    raise ValueError(f"select={select!r}; allowed: {', '.join(SELECTIONS)}")
  finished = [r for r in runs if r.finished]
  if not finished:
    return []
  experiments = {r.config["experiment"] for r in finished}
  if len(experiments) > 1:
    raise errors.BadInput(f"runs of several experiments {sorted(experiments)} under one root; "
                     "collect one experiment at a time")
  experiment = registry.get(experiments.pop())
  published = experiment.paper.table_a1 if experiment.paper else {}
  metric = lambda runs, split: [r.summary[f"{split}/{experiment.metric}"] for r in runs]
  cells = []
  for (label, key, group), settings in grid_rows(finished, _cell_keys(finished)).items():
    setting = best_setting(settings, f"{select}/{experiment.metric}")
    best = [settings[setting][s] for s in sorted(settings[setting])]
    cells.append(Cell(label, key, group, dict(zip(HPARAMS, setting)), len(settings),
                      Stat.of(metric(best, "ood")), Stat.of(metric(best, "test")),
                      tuple(r.config["seed"] for r in best), published.get(key)))
  return cells


def paired(cells: Sequence[Cell], baseline: tuple = ("softmax", False)) -> list[Paired]:
  """Every other row against the `baseline` row (Table A1's softmax attention) of its own
  group (the same settings apart from the model and the seed): never across sweeps."""
  bases = {c.group: c for c in cells if c.key == baseline}
  ood = lambda c: {s: v / 100 for s, v in zip(c.seeds, c.ood.values)}
  pairs = [Paired.of(c.label, ood(c), ood(bases[c.group])) for c in cells
           if c.group in bases and c is not bases[c.group]]
  return [q for q in pairs if q]


def paired_markdown(pairs: Sequence[Paired], baseline: str, metric: str) -> str:
  lines = [f"Paired by seed against {baseline} (same seed = same held-out split): OOD "
           f"{metric} x100 of the row minus {baseline}'s, mean ± s.e. over the seeds both "
           "have; p is a two-sided paired t-test (with 3 seeds only a large, consistent "
           "difference reaches p < 0.05).", "",
           "| row | seeds | difference | row ahead in | p |", "|---|---|---|---|---|"]
  for q in pairs:
    p = "" if math.isnan(q.p_value) else f"{q.p_value:.3f}"
    lines.append(f"| {q.label} | {len(q.seeds)} | {q.diff} | {q.wins} of {len(q.seeds)} | {p} |")
  return "\n".join(lines)


def missing_jobs(root: str, sweep_name: str, runs: Optional[Sequence[Run]] = None) -> list[str]:
  """The sweep's points with no summary.json in a `<point name>` directory under `root`
  (`<root>/<point name>`, or `<root>/<population>/<point name>` for a population's member)."""
  points = sweeps.load(sweep_name).get_sweep()
  runs = load_runs(root) if runs is None else runs
  finished = {os.path.basename(r.workdir) for r in runs if r.summary is not None}
  return [jobs.point_name(p) for p in points if jobs.point_name(p) not in finished]


def markdown(cells: Sequence[Cell], select: str, metric: str) -> str:
  lines = [f"OOD {metric} x100 of each row's best setting (picked by `{select}/{metric}`), "
           "mean ± s.e. over seeds (a row with one seed is a single run: no s.e.). The "
           "paper's column is its Table A1 (paper size, best of its grid, 3 seeds).", "",
           "| row | seeds | best setting (settings tried) | OOD (ours) | test (ours) | "
           "paper OOD |", "|---|---|---|---|---|---|"]
  for c in cells:
    paper = "" if c.paper is None else f"{c.paper[0]:.2f} ± {c.paper[1]:.2f}"
    lines.append(f"| {c.label} | {len(c.seeds)} ({','.join(map(str, c.seeds))}) | "
                 f"{common.setting_text(c.setting)} ({c.num_settings}) | {c.ood} | {c.test} | "
                 f"{paper} |")
  return "\n".join(lines)


def csv_text(cells: Sequence[Cell]) -> str:
  """The table as CSV (written through epath: --out may be a bucket)."""
  with io.StringIO(newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["row", "seeds", *HPARAMS, "settings_tried", "ood_mean", "ood_se",
                     "test_mean", "test_se", "paper_mean", "paper_se"])
    for c in cells:
      paper = c.paper or ("", "")
      writer.writerow([c.label, " ".join(map(str, c.seeds)),
                       *(c.setting[h] for h in HPARAMS), c.num_settings,
                       c.ood.mean, c.ood.se, c.test.mean, c.test.se, *paper])
    return f.getvalue()


def plot(cells: Sequence[Cell], title: str) -> bytes:
  """Grouped bars: ours and the paper's OOD metric per row, s.e. error bars; PNG bytes."""
  from matplotlib import figure  # pylint: disable=g-import-not-at-top
  x = np.arange(len(cells))
  fig = figure.Figure(figsize=(max(4, 1.2 * len(cells) + 2), 4))  # No pyplot: nothing to close.
  ax = fig.subplots()
  ax.bar(x - 0.2, [c.ood.mean for c in cells], 0.4, yerr=[np.nan_to_num(c.ood.se) for c in cells],
         capsize=3, label="ours")
  ax.bar(x + 0.2, [c.paper[0] if c.paper else np.nan for c in cells], 0.4,
         yerr=[c.paper[1] if c.paper else 0 for c in cells], capsize=3, label="paper")
  ax.set_xticks(x, [f"{c.label}\n(n={len(c.seeds)})" for c in cells], fontsize=8)
  ax.set_ylabel("OOD x100")
  ax.set_title(title, fontsize=9)
  ax.legend()
  fig.tight_layout()
  png = io.BytesIO()
  fig.savefig(png, format="png", dpi=120)
  return png.getvalue()


def check_sweep(runs: Sequence[Run], sweep_name: str) -> None:
  """Refuses a `--sweep` whose experiment is not the runs' (its jobs would all be listed
  as missing)."""
  expected = sweeps.load(sweep_name).EXPERIMENT
  found = sorted({r.config["experiment"] for r in runs} - {expected})
  if found:
    raise errors.BadInput(f"--sweep={sweep_name} is a {expected!r} sweep but the runs "
                              f"under the root are {found}; allowed: the sweep that filled "
                              "the root (or no --sweep)")


def report(root: str, sweep_name: Optional[str], select: str, out: str) -> str:
  """Writes table_a1.{md,csv,png} to `out` and returns the markdown (with missing jobs)."""
  runs = load_runs(root)
  if sweep_name:
    check_sweep(runs, sweep_name)
  cells = tabulate(runs, select)
  if not cells:
    raise errors.BadInput(f"no finished run (summary.json) under {root!r}")
  metric = registry.get(runs[0].config["experiment"]).metric
  text = markdown(cells, select, metric)
  pairs = paired(cells)
  if pairs:
    text += "\n\n" + paired_markdown(pairs, "softmax attention", metric)
  unfinished = [os.path.relpath(r.workdir, root) for r in runs if r.summary is None]
  failed = [f"{os.path.relpath(r.workdir, root)} (frozen at step {r.frozen_at_step})"
            for r in runs if r.frozen_at_step is not None]
  missing = missing_jobs(root, sweep_name, runs) if sweep_name else []
  finished = [r for r in runs if r.finished]
  text += (f"\n\n{len(finished)} finished runs under {root}; CPU time of their training "
           f"processes {sum(r.cpu_s for r in finished) / 3600:.2f} h (run_local), wall time "
           f"{sum(r.summary['wall_time_s'] for r in finished) / 3600:.2f} h (summaries).")
  lists = [(f"Missing jobs of sweep {sweep_name} ({len(missing)})", missing) if missing
           else ("Unfinished runs", unfinished),
           ("Failed runs (non-finite loss; not counted)", failed)]
  text += "".join(f"\n\n{title}:\n" + "\n".join(f"- {name}" for name in names)
                  for title, names in lists if names)
  out = run_files.path(out, "--out")
  out.mkdir(parents=True, exist_ok=True)
  run_files.write_bytes(out / "table_a1.md", (text + "\n").encode())
  run_files.write_bytes(out / "table_a1.csv", csv_text(cells).encode())
  run_files.write_bytes(out / "table_a1.png", plot(
      cells, f"{os.path.basename(os.path.normpath(root))}: best of grid by {select}/{metric}"))
  return text


def _define_flags() -> None:
  """Defined only when run as a program, so that tests and tools can import this module."""
  flags.DEFINE_string("root", None, "Sweep root: workdirs (with config.json) below it.")
  flags.DEFINE_enum("sweep", None, sweeps.SWEEPS,
                    "The sweep that filled --root: lists its missing jobs.")
  flags.DEFINE_enum("select", "ood", SELECTIONS,
                    "Metric that picks each row's best setting: ood (the paper's practice) "
                    "or test (in-distribution; the honest choice).")
  flags.DEFINE_string("out", None, "Output folder (default: --root).")


def main(argv: list[str]) -> None:
  del argv
  f = flags.FLAGS
  if f.root is None or not str(f.root).strip() or not run_files.path(f.root, "--root").is_dir():
    raise errors.BadInput(f"--root={f.root!r}; allowed: an existing sweep folder")
  root = str(run_files.path(f.root, "--root"))
  out = run_files.check_output_dir(f.out or root, "--out")
  print(report(root, f.sweep, f.select, str(out)))


if __name__ == "__main__":
  _define_flags()
  cli.run(main)
