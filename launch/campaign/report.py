"""The campaign's report, made from the cell files alone: Table A1 beside the paper, paired
differences by seed, learning curves, rule decoding by layer, the step benchmark, and the
cells still to run with their estimated minutes (`python -m launch.campaign --report`)."""

from __future__ import annotations

import collections
import math
import os
from typing import Any, Optional, Sequence

import numpy as np

from hypernet_attention.runs import registry
from launch import collect
from launch.campaign import cells as cells_lib
from launch.campaign import plan
from launch.campaign import records as records_lib
from launch.campaign import runner
from launch.sweeps import common

DEFAULT_PATH = os.path.join("experiments", "results", "paper_scale.md")
TABLE_A1_RUNS = sum(len(c.members) for c in cells_lib.CELLS if c.stage in cells_lib.TABLE_A1_STAGES)
# The experiments of Table A1's cells, in the campaign's order (fuzzy logic, then SRAVEN).
TABLE_A1_EXPERIMENTS = tuple(dict.fromkeys(c.experiment for c in cells_lib.CELLS
                                           if c.stage in cells_lib.TABLE_A1_STAGES))
COLORS = {"softmax": "tab:blue", "linear": "tab:orange", "hyla": "tab:green"}


def _metric(experiment: str) -> str:
  return registry.get(experiment).metric


def table_a1_members(records: dict[str, dict[str, Any]], experiment: str,
                     stages: Sequence[str] = cells_lib.TABLE_A1_STAGES):
  """{row key: {setting: {seed: run}}} of the cells of `stages` (Table A1's: a, b, d, e), each
  finished member a `collect.Run` (its settings as config, its final metrics as summary),
  grouped as `collect` groups a sweep's runs; a seed that appears twice at one setting is
  counted once (the first cell's, in name order)."""
  runs = [collect.Run(f"{name}/{m['name']}", {
      "model.attention": r["model"], **m["settings"],
      "model.feed_forward": r["overrides"].get("model.feed_forward")}, m["final"], 0.0)
          for name, r in sorted(records.items())
          if r["kind"] == "train" and r["experiment"] == experiment
          and r["stage"] in stages for m in r["members"] if m["frozen_at_step"] is None]
  return {key: settings for (_, key, _), settings in collect.grid_rows(runs).items()}


def _stat(runs, key: str) -> collect.Stat:
  return collect.Stat.of([run.summary[key] for run in runs])


def _default_setting(experiment: str) -> tuple:
  d = cells_lib.paper(experiment).default_setting
  warmup = d.get("optimizer.warmup_steps", 100)  # The configs' default (fuzzy logic's).
  return (d["optimizer.learning_rate"], d["optimizer.weight_decay"], warmup)


def versus_paper(ours: collect.Stat, paper: tuple[float, float], paper_seeds: int = 3) -> str:
  """The paper's cell (mean +- s.e.), then `ours - paper` (x100) and Welch's two-sided p
  from the two summaries.

  Table A1 gives mean +- s.e. over 3 seeds, not the seeds, so a test on summaries is all
  its numbers allow; Welch's, because nothing says the two runs' seed spreads are equal.
  Without a second seed of ours there is no spread to test with: the difference alone.
  """
  from scipy import stats  # pylint: disable=g-import-not-at-top
  diff = f"{paper[0]:.2f} ± {paper[1]:.2f} | {ours.mean - paper[0]:+.1f}"
  n = len(ours.values)
  if n < 2:
    return diff
  p = stats.ttest_ind_from_stats(ours.mean, ours.se * math.sqrt(n), n, paper[0],
                                 paper[1] * math.sqrt(paper_seeds), paper_seeds,
                                 equal_var=False).pvalue
  return f"{diff} ({float(p):.2f})"


def _eval_error(members, key: str, seeds: collect.Stat) -> str:
  """The evaluation error (x100) of a row's mean from its members' re-evaluations: the
  s.e. across draws of each member, combined as the s.e. of their mean, and its ratio to
  the seeds' s.e.; '-' if any member is a single recorded draw (`records.with_redraws`)."""
  ses = [m.summary.get("eval_se", {}).get(key) for m in members]
  if any(se is None for se in ses):
    return "-"
  error = 100 * math.sqrt(sum(se**2 for se in ses)) / len(ses)
  return f"{error:.2f}" + ("" if math.isnan(seeds.se) else f" ({error / seeds.se:.2f} s.e.)")


def _order_text(key, means: dict, paper: dict) -> str:
  """Of the other rows run, those whose order against `key` is the paper's: 'k of m', and
  the rows that flip it."""
  others = [o for o in means if o != key and o in paper]
  flips = [common.TABLE_A1_ROWS[o] for o in others
           if (means[key] > means[o]) != (paper[key][0] > paper[o][0])]
  return (f"{len(others) - len(flips)} of {len(others)}"
          + (f" (flips: {', '.join(flips)})" if flips else "")) if others else "-"


def table_a1(records, experiment: str, stages: Sequence[str] = cells_lib.TABLE_A1_STAGES) -> str:
  """Table A1's rows of the cells of `stages` beside the paper's: every split's mean ± s.e.,
  the evaluation error, each seed's OOD value (with its own), ours - paper, the paper's order."""
  metric = _metric(experiment)
  rows = table_a1_members(records, experiment, stages)
  if not rows:
    return f"No finished cell of {experiment} yet.\n"
  paper = cells_lib.paper(experiment)
  grid_size = math.prod(len(v) for v in paper.grid.values())
  default = _default_setting(experiment)
  means = {key: _stat(settings[default].values(), f"ood/{metric}").mean
           for key, settings in rows.items() if default in settings}
  lines = ["| row | setting | n | " + " | ".join(f"{s} (ours)" for s in paper.splits)
           + " | eval. error | OOD per seed | paper OOD | ours - paper (p) | paper's order |",
           "|---" * (8 + len(paper.splits)) + "|"]
  for key, settings in rows.items():  # In Table A1's order.
    name, paper_ood = common.TABLE_A1_ROWS[key], paper.table_a1[key]
    complete = len(settings) == grid_size and all(len(s) >= 3 for s in settings.values())
    shown = [(default, "default")] if default in settings else []
    if complete:
      shown.append((collect.best_setting(settings, f"ood/{metric}"), "best of grid"))
    elif not shown:
      shown.append((next(iter(settings)), "only"))
    for setting, why in shown:
      members = [settings[setting][s] for s in sorted(settings[setting])]
      stats = [str(_stat(members, f"{s}/{metric}")) for s in paper.splits]
      per_seed = ", ".join(f"seed {s}: {m.summary[f'ood/{metric}'] * 100:.1f}" + (
          f" ± {100 * se:.1f}" if (se := m.summary.get("eval_se", {}).get(f"ood/{metric}"))
          else "") for s, m in sorted(settings[setting].items()))
      ours = _stat(members, f"ood/{metric}")
      text = common.setting_text(dict(zip(collect.HPARAMS, setting)))
      order = _order_text(key, means, paper.table_a1) if why == "default" else "-"
      lines.append(f"| {name} | {text} ({why}) | {len(members)} | " + " | ".join(stats)
                   + f" | {_eval_error(members, f'ood/{metric}', ours)} | {per_seed} | "
                   f"{versus_paper(ours, paper_ood)} | {order} |")
  return "\n".join(lines) + "\n"


# What each of HYLA's components is worth (Table A1's dense rows, the paper's Sec. 3 and
# Table A1 ablations): (component, row, baseline), each pair differing in that component.
ABLATION_PAIRS = (
    ("main rows", "hyla", "softmax"), ("main rows", "hyla", "linear"),
    ("main rows", "linear", "softmax"),
    ("RMSHead", "hyla", "hyla_no_rmshead"), ("RMSHead", "linear_rmshead", "linear"),
    ("RMSHead", "hyla_linear_value", "hyla_linear_value_no_rmshead"),
    ("nonlinearity (phi)", "hyla", "hyla_linear_value"),
    ("nonlinearity (phi)", "hyla_no_rmshead", "hyla_linear_value_no_rmshead"),
    ("generated hidden layer", "hyla", "linear_rmshead_nonlinear_value"),
    ("generated hidden layer", "hyla_linear_value", "linear_rmshead"),
    ("generated hidden layer", "hyla_linear_value_no_rmshead", "linear"),
    ("nonlinear value, read-out only", "linear_rmshead_nonlinear_value", "linear_rmshead"),
    ("softmax for RMSHead", "softmax_hyla", "hyla"),
    ("generated value network on softmax", "softmax_hyla", "softmax"),
    ("depth (Eq. 10)", "hyla_deep", "hyla"),
)


def ablation_text(records, experiment: str, partials=None) -> str:
  """Every pair of `ABLATION_PAIRS`, paired by seed at the default setting beside the
  paper's difference of means; a pair whose row has not finished is shown pending (with
  its progress where a window cut it off). '' when no pair of the experiment has run."""
  record = cells_lib.paper(experiment)
  paper, prefix = record.table_a1, record.cell_prefix
  lines = []
  for component, row, base in ABLATION_PAIRS:
    (pm, ps), (bm, bs) = paper[row, False], paper[base, False]
    paper_text = f"{pm - bm:+.2f} ± {math.hypot(ps, bs):.2f}"
    pair = _pair(records, experiment, row, base)
    if pair is None and not record.ablations_default_first:
      continue  # Its rows run over their whole grid at once (stage e): no default cell.
    if pair is None:
      missing = [m for m in (row, base) if not table_a1_members(records, experiment).get(
          (m, False), {}).get(_default_setting(experiment))]
      cells = [f"d_{prefix}_{m}_default" for m in missing]
      lines.append(f"| {component} | {row} - {base} | 0 | pending: " + ", ".join(
          c + (f" (at step {partials[c]['step']:,} of {partials[c]['num_steps']:,})"
               if c in (partials or {}) else "") for c in cells) + f" | | | | {paper_text} | |")
    else:
      lines.append(f"| {component} {paired(records, experiment, row, base)} {paper_text} | "
                   + ("same" if (pair.diff.mean > 0) == (pm > bm) else "**opposite**") + " |")
  if all("pending" in line for line in lines):  # Nothing run yet (or no line at all).
    return ""
  return ("| component | difference | seeds | mean ± s.e. (x100) | ahead in | p | per seed | "
          "paper (x100) | sign as paper |\n|---|---|---|---|---|---|---|---|---|\n"
          + "\n".join(lines) + "\n")


def _pair(records, experiment: str, row: str, baseline: str) -> Optional[collect.Paired]:
  """`row - baseline` seed by seed at the default setting (a seed fixes the held-out split,
  so the difference is free of the split's variance); None if no seed has both."""
  rows = table_a1_members(records, experiment)
  ood = lambda model: {s: m.summary[f"ood/{_metric(experiment)}"] for s, m in rows.get(
      (model, False), {}).get(_default_setting(experiment), {}).items()}
  return collect.Paired.of(f"{row} - {baseline}", ood(row), ood(baseline))


def paired(records, experiment: str, row: str, baseline: str) -> Optional[str]:
  """`_pair` as a table row: difference, seeds, mean ± s.e., wins, p, per seed."""
  q = _pair(records, experiment, row, baseline)
  if q is None:
    return None
  per_seed = ", ".join(f"seed {s}: {d:+.1f}" for s, d in zip(q.seeds, q.diff.values))
  return (f"| {q.label} | {len(q.seeds)} | {q.diff} | {q.wins} of {len(q.seeds)} | "
          f"{_p_text(q.p_value)} | {per_seed} |")


def _p_text(p: float) -> str:
  """A p-value for a table: 3 decimals, or 2 significant digits below 0.001 (never 0.000)."""
  return "-" if math.isnan(p) else f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def authors_split_text(records) -> str:
  """Stage h: the main rows on the authors' own splits, as Table A1's rows (`table_a1`), and
  per seed the known terms its split puts in no training task (`redraw.untrained_terms`)."""
  untrained = {}
  for _, r in sorted(records.items()):
    if r["kind"] == "train" and r["stage"] == cells_lib.AUTHORS_SPLIT_STAGE:
      for m in r["members"]:
        seed = m["settings"]["seed"]
        untrained[seed] = m.get("untrained_terms", untrained.get(seed))
  if not untrained:
    return "No cell of stage h yet.\n"
  notes = "; ".join(f"seed {s}: " + ("not re-evaluated" if t is None else
                                     f"terms {', '.join(map(str, t))} in no training task"
                                     if t else "every known term trained")
                    for s, t in sorted(untrained.items()))
  return (table_a1(records, cells_lib.FUZZY, (cells_lib.AUTHORS_SPLIT_STAGE,))
          + f"\nThe authors' splits ({notes}).\n")


def _versions(records: Sequence[dict[str, Any]]) -> str:
  pairs = sorted({(r["device"]["kind"], r["jax_version"]) for r in records})
  return "; ".join(f"{kind}, jax {v}" for kind, v in pairs)


def curves_figure(records, experiment: str, path: str,
                  partials: Optional[dict[str, dict[str, Any]]] = None) -> Optional[str]:
  """OOD metric vs step, one line per member of the Table A1 cells at the default setting;
  cells cut off by a window (`partials`) dashed."""
  metric = _metric(experiment)
  chosen = [r for _, r in sorted(records.items()) if r["kind"] == "train"
            and r["experiment"] == experiment and r["stage"] in cells_lib.MAIN_ROW_STAGES]
  cut = [p for n, p in sorted((partials or {}).items())
         if n not in records and p["experiment"] == experiment
         and p["stage"] in cells_lib.MAIN_ROW_STAGES]
  if not chosen and not cut:
    return None
  from matplotlib import figure  # pylint: disable=g-import-not-at-top
  fig = figure.Figure(figsize=(7, 4.5))  # No pyplot: nothing to close, no backend to pick.
  ax = fig.subplots()
  labelled = set()
  for r, is_cut in [(r, False) for r in chosen] + [(p, True) for p in cut]:
    for m in r["members"]:
      curve = m["curves"].get(f"ood/{metric}")
      if not curve:
        continue
      steps, values = zip(*curve)
      name = r["model"] + (f" (cut off at step {r['step']:,} of {r['num_steps']:,})"
                           if is_cut else "")
      label = name if name not in labelled else None
      labelled.add(name)
      ax.plot(steps, np.asarray(values) * 100, marker="o", markersize=3, label=label,
              color=COLORS.get(plan.model_family(r["model"])), alpha=0.8,
              linestyle="--" if is_cut else "-")
  if cut:
    ax.set_xlim(0, max(r["num_steps"] for r in chosen + cut) * 1.02)
  ax.set_xlabel("step")
  ax.set_ylabel(f"OOD {metric} x100")
  versions = "; ".join(dict.fromkeys(
      [_versions(chosen)] * bool(chosen)
      + [f"{p['device']['kind']}, jax {p['device']['jax_version']}" for p in cut]))
  ax.set_title(f"{cells_lib.paper(experiment).title}, one line per seed\n{versions}", fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fig.savefig(path, dpi=110)
  return path


def _decode_score(block: dict[str, Any]) -> Optional[float]:
  """Macro-F1 over terms (fuzzy logic) or accuracy over rules (SRAVEN) on held-out tasks."""
  return block.get("macro_f1", (block.get("scores") or {}).get("accuracy"))


def _score_text(block: dict[str, Any]) -> str:
  """The score, with its evaluation error and the one recorded draw once re-evaluated."""
  score, key = _decode_score(block), "macro_f1" if "macro_f1" in block else "accuracy"
  inner = block if key == "macro_f1" else block.get("scores") or {}
  se, recorded = inner.get("eval_se", {}).get(key), inner.get("recorded", {}).get(key)
  return _num(score) + ("" if se is None else f" ± {se:.3f} (one draw: {_num(recorded)})")


def _chance_max(block: dict[str, Any]) -> Optional[float]:
  chance = block.get("chance")
  return max((v for v in map(_headline, chance.values()) if v is not None),
             default=None) if isinstance(chance, dict) else None


def _verdict(d: dict[str, Any]) -> str:
  """Above every chance level, the untrained code and the permutation null (p < 0.05)."""
  trained, score = d["trained"], _decode_score(d["trained"])
  bars = [_chance_max(trained), _decode_score(d["step0"])]
  if score is None or any(b is None for b in bars):
    return "-"
  p = _headline(trained.get("p_value"))
  above = score > max(bars) and p is not None and p < 0.05
  return "**decodes**" if above else "no"


def decoding_text(records, figures: Optional[str] = None, out_dir: str = ".") -> str:
  """Stage c: per cell and layer, the held-out decoding score against every control the
  probing tool computes (chance levels, the step-0 code, a permutation p, the control task's
  selectivity, topographic similarity) and the authors' own in-distribution ridge R^2; with
  `figures`, one bar chart per experiment (Fig. 2B, Fig. 5F)."""
  probes = [r for _, r in sorted(records.items()) if r["kind"] == "probe"]
  if not probes:
    return ("No decoding cell yet (stage c decodes from the final parameters that stage a "
            "and b cells keep in paper_scale/params/).\n")
  lines = ["Held-out tasks only (probes fit on the training tasks' codes). Score: macro-F1 "
           "over terms (fuzzy logic, Fig. 2B) or accuracy over rules (SRAVEN, Fig. 5F). "
           "'decodes': above the best chance level, above the same seed's untrained code "
           "and permutation p < 0.05. Selectivity: real minus control task (Hewitt & Liang) "
           "on a sample-level split. Topographic rho: code distance vs meaning distance "
           "over held-out tasks (Mantel p). Ridge R^2: the authors' logged metric (training "
           "tasks, halves of a batch). Fuzzy logic's codes are read at one query point shared "
           "by every task, as the authors' latent callback reads them (`probe_latents "
           "--query=fixed`): layer 0's self-code then is one constant, since under HYLA it "
           "depends on the query token alone. The paper publishes no numbers for these "
           "figures.\n",
           "| cell | member | step | layer | score | step 0 | chance | perm. p | decodes | "
           "selectivity | topographic rho (p) | ridge R^2 |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in probes:
    for m in r["members"]:
      for layer, d in m["feature_sets"].items():
        trained = d["trained"]
        sel = (d.get("selectivity") or {}).get("selectivity")
        topo = (d.get("topographic") or {}).get("held-out tasks") or {}
        rho = (f"{topo['rho']:.3f} ({_num(topo.get('p_value'), '.3g')})"
               if topo.get("rho") is not None else "-")  # None: a constant code
        lines.append(
            f"| {r['cell']} | {m['name']} | {m['step']:,} | {layer} | "
            f"{_score_text(trained)} | {_score_text(d['step0'])} | "
            f"{_chance(trained.get('chance'))} | "
            f"{_num(trained.get('p_value'))} | {_verdict(d)} | {_num(sel)} | {rho} | "
            f"{_num(d.get('ridge_r2_authors_metric'))} |")
  text = "\n".join(lines) + "\n"
  for experiment in sorted({r["experiment"] for r in probes}):
    path = decoding_figure([r for r in probes if r["experiment"] == experiment], experiment,
                           os.path.join(figures, f"decoding_{experiment}.png")) if figures else None
    if path:
      text += f"\n![decoding by layer, {experiment}]({os.path.relpath(path, out_dir)})\n"
  return text


def _seed_of(cell: str) -> Optional[str]:
  """'seed1' of a cell named ..._seed1, else None."""
  last = cell.rsplit("_", 1)[-1]
  return last if last.startswith("seed") else None


def decoding_paired_text(records, pairs=(("hyla", "softmax"), ("hyla", "linear"))) -> str:
  """One model's held-out decoding minus another's, paired by seed: a seed fixes the split,
  so both are probed on the same held-out terms. Per seed, the Wilcoxon signed-rank test
  over those terms' F1; across seeds, the paired t-test over macro-F1 (`collect.Paired`).
  Stage c cells of one member named ..._seedN; '' when no seed has both models."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  codes = {(r["model"], int(_seed_of(r["cell"])[4:])): r["members"][0]["feature_sets"]
           for r in records.values()
           if r["kind"] == "probe" and _seed_of(r["cell"]) and len(r["members"]) == 1}
  lines = []
  for row, base in pairs:
    seeds = sorted(s for m, s in codes if m == row and (base, s) in codes)
    for layer in (codes[(row, seeds[0])] if seeds else ()):
      f1 = {m: {s: codes[(m, s)][layer]["trained"]["macro_f1"] for s in seeds} for m in (row, base)}
      if not any(f1[row].values()) or not any(f1[base].values()):
        continue  # A constant code (HYLA's layer 0 at the fixed query, above): no pair.
      for s in seeds:
        diff = np.array([a - b for a, b in zip(*(codes[(m, s)][layer]["trained"]["per_term_f1"]
                                                 for m in (row, base)))
                         if a is not None and b is not None])
        p = stats.wilcoxon(diff).pvalue if np.any(diff) else 1.0
        lines.append(f"| {row} - {base} | {layer} | seed {s} | {100 * f1[row][s]:.1f} | "
                     f"{100 * f1[base][s]:.1f} | {100 * (f1[row][s] - f1[base][s]):+.1f} | "
                     f"{(diff > 0).sum()} of {diff.size} terms | {_p_text(p)} (Wilcoxon) |")
      q = collect.Paired.of("", f1[row], f1[base])
      lines.append(f"| {row} - {base} | {layer} | **{len(seeds)} seed(s)** | "
                   f"{collect.Stat.of(list(f1[row].values()))} | "
                   f"{collect.Stat.of(list(f1[base].values()))} | {q.diff} | {q.wins} of "
                   f"{len(seeds)} | {_p_text(q.p_value)} (paired t) |")
  return ("Held-out macro-F1 x100, paired by seed (a seed fixes the held-out terms for both "
          "models; a re-evaluated cell's mean over its draws). Per seed: Wilcoxon signed-rank "
          "over the held-out terms' F1 of the cell's own recorded draw; over seeds: "
          "mean ± s.e., paired t-test (none below 2 seeds).\n\n| difference | layer | seed | "
          "first | second | first - second | ahead in | p |\n|---|---|---|---|---|---|---|---|\n"
          + "\n".join(lines) + "\n") if lines else ""


def decoding_figure(probes, experiment: str, path: str) -> Optional[str]:
  """Held-out decoding score by layer, one bar per model (trained), the untrained code as a
  black tick and the best chance level as a dashed line: the layout of the paper's Fig. 2B."""
  from matplotlib import figure  # pylint: disable=g-import-not-at-top
  layers = sorted(dict.fromkeys(layer for r in probes for m in r["members"]
                                for layer in m["feature_sets"]),
                  key=lambda layer: (layer.startswith("all"), layer))  # "all layers" last
  runs = [(r, m) for r in probes for m in r["members"]]
  if not layers or not runs:
    return None
  width = 0.8 / len(runs)
  # Several cells of one model (fuzzy logic's *_seed0, *_seed1, ...): their seeds in the legend.
  shared_model = len({r["model"] for r in probes}) < len(probes)
  fig = figure.Figure(figsize=(3.2 + 1.4 * len(layers), 3.8))
  ax = fig.subplots()
  chance = None
  for i, (r, m) in enumerate(runs):
    xs = np.arange(len(layers)) + (i - (len(runs) - 1) / 2) * width
    sets = m["feature_sets"]
    trained = [_decode_score(sets[l]["trained"]) if l in sets else np.nan for l in layers]
    step0 = [_decode_score(sets[l]["step0"]) if l in sets else np.nan for l in layers]
    ax.bar(xs, np.asarray(trained, float), width * 0.9,
           label=r["model"] + (f" {m['name']}" if len(r["members"]) > 1 else "")
           + (f" {_seed_of(r['cell'])}" if shared_model and _seed_of(r["cell"]) else ""),
           color=COLORS.get(plan.model_family(r["model"])), alpha=0.85)
    ax.scatter(xs, np.asarray(step0, float), marker="_", color="black", s=200, zorder=3,
               label="untrained (step 0)" if i == 0 else None)
    chance = max(filter(None, [chance] + [_chance_max(sets[l]["trained"]) for l in sets]),
                 default=None)
  if chance is not None:
    ax.axhline(chance, color="gray", linestyle="--", label=f"best chance ({chance:.2f})")
  ax.set_xticks(np.arange(len(layers)), layers)
  ax.set_ylabel(f"held-out {cells_lib.paper(experiment).decoding_metric}")
  ax.set_title(f"Decoding from the latent code, {cells_lib.paper(experiment).label}\n"
               f"{_versions(probes)}", fontsize=9)
  ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # off the bars
  ax.grid(alpha=0.3, axis="y")
  fig.tight_layout()
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fig.savefig(path, dpi=110)
  return path


def _headline(x):
  """Of per-metric values (SRAVEN's p-values), the accuracy's; a plain value as it is."""
  return x.get("accuracy", next(iter(x.values()), None)) if isinstance(x, dict) else x


def _num(x, spec: str = ".3f") -> str:
  x = _headline(x)
  return "-" if x is None else format(x, spec)


def _chance(chance) -> str:
  return ", ".join(f"{k} {_num(v)}" for k, v in chance.items()) if isinstance(chance, dict) else "-"


def benchmark_text(records) -> str:
  benches = [r for _, r in sorted(records.items()) if r["kind"] == "benchmark"]
  if not benches:
    return "Not run yet.\n"
  lines = ["| cell | device | jax | data | model | batch | steps/s | tokens/s | MFU | compile s |",
           "|---|---|---|---|---|---|---|---|---|---|"]
  for r in benches:
    for row in r["rows"]:
      data = ("random tokens" if row.get("synthetic_tokens")
              else "on device" if registry.get(r["experiment"]).on_device else "C4")
      tokens = row.get("tokens_per_s")
      mfu = row.get("mfu")
      lines.append(f"| {r['cell']} | {r['device']['kind']} | {r['jax_version']} | {data} | "
                   f"{row.get('label')} | {row.get('batch_size', '-')} | "
                   f"{row['steps_per_s']:.3g} | "
                   f"{'-' if tokens is None else f'{tokens:,.0f}'} | "
                   f"{'-' if not mfu else f'{mfu:.1%}'} | {row.get('compile_s', 0):.1f} |")
  return "\n".join(lines) + "\n"


def remaining(records, cell_set=cells_lib.CELLS, root: Optional[str] = None,
              device_kind: Optional[str] = None, partials=None) -> list[tuple]:
  """(cell, here, cpu, h100) minutes of every cell without a file, in priority order, from
  its workdir's checkpoint or else the step of its saved state (`partials`), at its own
  measured rate where no finished cell of its preset ran on that device."""
  recs = list(records.values())
  out = []
  for c in cell_set:
    if c.name in records:
      continue
    workdir = os.path.join(root, c.name) if root else None
    saved = (partials or {}).get(c.name)
    here = plan.estimate(c, device_kind, recs, workdir, saved) if device_kind else None
    out.append((c, here, plan.estimate(c, "cpu", recs, saved=saved),
                plan.estimate(c, plan.H100, recs, saved=saved)))
  return out


def plan_text(cell_set, records, device_kind: str, root: str,
              budget_minutes: Optional[float], partials=None,
              results_dir: str = records_lib.DEFAULT_DIR, redo=frozenset()) -> str:
  """The dry run's plan: what a runner with the same flags would start (--redo's cells too:
  their files stay the result until the rerun ends)."""
  lines = [f"Plan on {device_kind}" + (f", budget {budget_minutes:g} min" if budget_minutes
                                       else "") + " (minutes: this device / H100):",
           f"{'cell':42s} {'members':>7s} {'steps':>8s} {'here':>6s} {'H100':>6s}  note"]
  used = 0.0
  options = runner.Options(root, results_dir, budget_s=0)
  pending = {name: r for name, r in records.items() if name not in redo}
  for c, here, _, h100 in remaining(pending, cell_set, root, device_kind, partials):
    note = here.source if here else "no estimate on this device"
    if c.name in redo:
      note = "rerun (--redo); " + note
    if here and here.done_steps:
      note = f"resumes at step {here.done_steps:,}; " + note
    blocker = runner.blocker(c, options)
    if blocker:  # A source that finished before parameters were kept runs again to keep them.
      rerun = (f"; rerun it with `--redo={c.source}`" if c.source in records else "")
      note, here = f"blocked: {blocker}{rerun}", None
    if here and budget_minutes:
      fits = used + here.minutes <= budget_minutes
      used += here.minutes if fits else 0
      note = ("fits; " if fits else "does not fit; ") + note
    lines.append(f"{c.name:42s} {len(c.members) or 1:7d} {c.num_steps:8,d} "
                 f"{plan.fmt_minutes(here.minutes if here else None):>6s} "
                 f"{plan.fmt_minutes(h100.minutes if h100 else None):>6s}  {note}")
  done = [c.name for c in cell_set if c.name in pending]
  lines.append(f"{len(done)} of {len(cell_set)} cells done" + (
      f"; {used:.0f} of {budget_minutes:g} budget minutes planned" if budget_minutes else ""))
  return "\n".join(lines)


def remaining_text(records, partials=None) -> str:
  rows = remaining(records, partials=partials)
  by_stage = {}  # stage: [cells, member runs, CPU minutes, H100 minutes]
  for c, _, cpu, h100 in rows:
    add = (1, len(c.members) or 1, *(e.minutes if e else math.nan for e in (cpu, h100)))
    by_stage[c.stage] = [a + b for a, b in zip(by_stage.get(c.stage, (0, 0, 0.0, 0.0)), add)]
  lines = ["| stage | cells left | member runs | est. CPU hours | est. H100 minutes |",
           "|---|---|---|---|---|"]
  for stage, (n, members, cpu, h100) in by_stage.items():
    lines.append(f"| {stage} | {n} | {members} | {cpu / 60:.1f} | {h100:.0f} |")
  next_cells = ", ".join(f"`{c.name}`" for c, *_ in rows[:6])
  return "\n".join(lines) + f"\n\nNext in line: {next_cells}.\n"


def partial_text(records, partials: dict[str, dict[str, Any]]) -> str:
  """Cells a window cut off: how far they got and their OOD metric at each evaluation so far
  (mean over members, and each member), never mixed into the tables above."""
  rows = [p for _, p in sorted(partials.items())]
  if not rows:
    return "None.\n"
  lines = ["| cell | steps done | device | wall | OOD at each evaluation so far: step: mean "
           "(each seed), x100 |", "|---|---|---|---|---|"]
  for p in rows:
    metric = _metric(p["experiment"])
    by_step = collections.defaultdict(list)
    for m in p["members"]:
      for step, value in m["curves"].get(f"ood/{metric}", []):
        by_step[step].append(value * 100)
    evals = "; ".join(f"{step:,}: {np.mean(v):.1f} ({', '.join(f'{x:.1f}' for x in v)})"
                      for step, v in sorted(by_step.items()))
    # A rerun of a finished cell (--redo: e.g. to keep its parameters) resumes only with
    # --redo again; its finished file stays the result until the rerun ends.
    rerun = f" (rerun: `--redo={p['cell']}`)" if p["cell"] in records else ""
    lines.append(f"| {p['cell']}{rerun} | {p['step']:,} of {p['num_steps']:,} | "
                 f"{p['device']['kind']} (jax {p['device']['jax_version']}) | "
                 f"{p['wall_s'] / 60:.1f} min | {evals or '-'} |")
  return "\n".join(lines) + "\n"


def provenance(records) -> str:
  lines = ["| cell | device | jax | python | commit | wall | member-steps/s | finished |",
           "|---|---|---|---|---|---|---|---|"]
  for name, r in sorted(records.items()):
    rate = r.get("member_steps_per_s")
    device = r["device"]["kind"] + (f" ({r['device']['host_cpu']})"
                                    if r["device"].get("host_cpu") else "")
    lines.append(f"| {name} | {device} | {r['jax_version']} | {r.get('python', '?')} | "
                 f"{r['commit']} | {r['wall_s'] / 60:.1f} min | "
                 f"{'-' if not rate else f'{rate:.2f}'} | {r.get('finished_utc', '?')} |")
  return "\n".join(lines) + "\n"


def write(records: dict[str, dict[str, Any]], path: str = DEFAULT_PATH,
          partials: Optional[dict[str, dict[str, Any]]] = None,
          redraws: Optional[dict[str, dict[str, Any]]] = None) -> str:
  """Writes the report (and its figures under `<dir>/paper_scale/figures/`); returns a
  one-line summary. `partials`: progress of cells a window cut off (`partial.py`);
  `redraws`: cells re-evaluated on independent draws, whose numbers every table uses
  (`records.with_redraws`)."""
  partials = partials or {}
  records = records_lib.with_redraws(records, redraws or {})
  out_dir = os.path.dirname(path) or "."
  figures = os.path.join(out_dir, "paper_scale", "figures")
  paper = {c.name for c in cells_lib.CELLS}
  done = [r for n, r in records.items() if n in paper]
  runs = sum(len(r["members"]) for r in done
             if r["kind"] == "train" and r["stage"] in cells_lib.TABLE_A1_STAGES)
  parts = [
      "# Paper scale: the campaign's results beside the paper\n",
      "Made by `python -m launch.campaign --report` from the cell files in "
      "[paper_scale/](paper_scale/) alone (one JSON per finished cell: settings, final "
      "metrics and curves per member, device, jax version, commit, wall time). Cells run "
      "with `python -m launch.campaign --budget_minutes=N` (see `launch/campaign/`).\n",
      f"**How much of the paper's scale has run:** {len(done)} of {len(paper)} cells; "
      f"{runs} of Table A1's {TABLE_A1_RUNS} training runs (the paper's sizes and step "
      "counts; every number below is at the paper's full size).\n",
  ]
  for experiment in TABLE_A1_EXPERIMENTS:
    parts.append(f"## Table A1, {cells_lib.paper(experiment).title}\n")
    parts.append("Mean ± s.e. over seeds (x100; a row with one seed has no s.e.: a single "
                 "run). The default setting is the paper's (Table A1's main rows were also "
                 "tuned over a grid: 'best of grid' appears once a row's whole grid has 3 "
                 "seeds, picked by OOD as the paper did). The paper's column is its Table A1 "
                 "(best of grid, 3 seeds). 'ours - paper': the difference of the means and, "
                 "from two seeds of ours on, Welch's two-sided p from the two means and "
                 "s.e.s (the paper gives no per-seed values); a default row is set against "
                 "the paper's best of grid, which favours the paper. 'eval. error': the "
                 "s.e. of the row's mean over re-draws of its problems (each seed's beside "
                 "it, from `experiments/redraw_cells.py`; '-': a seed evaluated on one draw "
                 "only) and, in brackets, its ratio to the seeds' s.e., which should stay "
                 "under a third (a fresh draw of every problem moves the mean by ~1.4x it). "
                 "'paper's order': against how many of the other rows run the paper's "
                 "order holds.\n")
    parts.append(table_a1(records, experiment))
    ablation = ablation_text(records, experiment, partials)
    if ablation:
      parts.append("Which component carries HYLA's lead: each pair of Table A1's dense rows "
                   "that differ in one component, paired by seed at the default setting (one "
                   "seed = one held-out split; p: two-sided paired t-test, none below 2 "
                   "seeds), beside the paper's difference of its means (± the two s.e.s "
                   "combined; its rows are best of grid).\n")
      parts.append(ablation)
    figure = curves_figure(records, experiment,
                           os.path.join(figures, f"curves_{experiment}.png"), partials)
    if figure:
      rel = os.path.relpath(figure, out_dir)
      parts.append(f"![learning curves, {experiment}]({rel})\n")
  parts += ["## Fuzzy logic on the authors' own held-out splits (stage h)\n",
            "Our default split (`task.split_draw=covering`) is re-drawn until every known term "
            "is in some training task. The authors' code draws once (`task.split_draw=authors` "
            "reproduces its draw exactly), so held-out tasks may hold a term no training task has "
            "(the terms per seed below the table; how many tasks for seed 2: "
            "`experiments/configs/fuzzy_logic.py`). Same default setting as stage a.\n",
            authors_split_text(records)]
  parts += ["## Decoding the operation from the latent code, by layer (Fig. 2, Fig. 5F)\n",
            decoding_text(records, figures, out_dir),
            decoding_paired_text(records),
            "## C4 50M training step\n", benchmark_text(records),
            "## Cut off by a window's end (resumable)\n",
            "Progress of cells whose window ended first, from `paper_scale/partial/`: not "
            "results (the learning rate is still on its cosine schedule), shown so that a "
            "window's work is seen. Each has its resume state beside it where it fit in "
            "16 MiB; the next runner anywhere resumes it (`launch/campaign/partial.py`).\n",
            partial_text(records, partials),
            "## Cells still to run\n",
            "Estimated from finished cells on the same device kind where there are some, "
            "else from the repository's measured single-run rates with no population gain "
            "(`launch/campaign/plan.py`); a cut-off cell from its saved step.\n",
            remaining_text(records, partials),
            "## Where each cell ran\n", provenance(records)]
  os.makedirs(out_dir, exist_ok=True)
  with open(path, "w") as f:
    f.write("\n".join(parts))
  return (f"Report: {len(done)} of {len(paper)} cells done, {runs} of {TABLE_A1_RUNS} "
          f"Table A1 runs -> {path}")
