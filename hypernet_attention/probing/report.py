"""One probe of one or several runs: restore -> codes -> decoders, controls, topographic
similarity, generated weights -> figures, `metrics.json` and `report.md`.

Feature sets probed: each layer's code on its own (`layer l`) and all layers concatenated.
Every score is on held-out tasks (SRAVEN: OOD rule combinations; fuzzy logic: held-out
combinations of known terms), next to chance, the permutation p-value, the same probe on
the step-0 (untrained) codes of the same seed, and the control-task selectivity; see
`decode.py` and `stats.py` for the definitions.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Optional, Sequence

from etils import epath
import numpy as np
import threadpoolctl

from hypernet_attention.probing import decode
from hypernet_attention.probing import extract
from hypernet_attention.probing import figures
from hypernet_attention.probing import stats
from hypernet_attention.probing import weights as weights_lib
from hypernet_attention.runs import run_files

ALL_LAYERS = "all layers"


@dataclasses.dataclass(frozen=True)
class ProbeOptions:
  num_problems: int = 1024  # per split
  batch_size: int = 256
  features: str = "all"  # SRAVEN: 'all' features or the authors' 'last'
  query: str = "fixed"  # fuzzy logic: the authors' one fixed query point, or 'random'
  permutations: int = 100  # decoder permutation null
  mantel_permutations: int = 999
  weight_problems: int = 256
  seed: int = 0
  progress: bool = True

  def __post_init__(self):
    for name in ("num_problems", "batch_size", "weight_problems"):
      if getattr(self, name) < 1:
        raise ValueError(f"{name}={getattr(self, name)}; allowed: a positive integer")
    for name in ("permutations", "mantel_permutations"):
      if getattr(self, name) < 0:
        raise ValueError(f"{name}={getattr(self, name)}; allowed: an integer >= 0")
    if self.features not in extract.FEATURE_CHOICES:
      raise ValueError(f"features={self.features!r}; allowed: {extract.FEATURE_CHOICES}")
    if self.query not in extract.QUERY_CHOICES:
      raise ValueError(f"query={self.query!r}; allowed: {extract.QUERY_CHOICES}")


def feature_sets(codes: extract.Codes) -> dict[str, np.ndarray]:
  n, num_layers = codes.codes_NLC.shape[:2]
  sets = {f"layer {l}": codes.codes_NLC[:, l] for l in range(num_layers)}
  sets[ALL_LAYERS] = codes.codes_NLC.reshape(n, -1)
  return sets


def side(codes: extract.Codes, x_NC: np.ndarray, split: int) -> decode.Side:
  keep = codes.split_N == split
  return decode.Side(x_NC[keep], codes.labels[keep], codes.task_N[keep], codes.unit_N[keep],
                     codes.stratum_N[keep])


def decode_codes(codes: extract.Codes, x_NC: np.ndarray, permutations: int, seed: int):
  """(fitting side, decoder result): fit on split 0, scored on the held-out tasks of split 1."""
  fit, score = side(codes, x_NC, 0), side(codes, x_NC, 1)
  if codes.multilabel:
    return fit, decode.decode_multilabel(fit, score, permutations, seed)
  return fit, decode.decode_multiclass(fit, score, len(codes.class_names), permutations, seed)


def _topographic(codes, x_NC, keep, options) -> stats.Topographic:
  tasks, means = stats.task_means(x_NC[keep], codes.task_N[keep], codes.stratum_N[keep])
  return stats.topographic_similarity(means, codes.task_meaning[tasks],
                                      options.mantel_permutations, options.seed)


def analyse(codes: extract.Codes, options: ProbeOptions, permutations: Optional[int] = None
            ) -> dict[str, dict[str, Any]]:
  """Per feature set: decoder result, selectivity, topographic similarity (held-out, all)."""
  permutations = options.permutations if permutations is None else permutations
  out = {}
  for name, x_NC in feature_sets(codes).items():
    fit, result = decode_codes(codes, x_NC, permutations, options.seed)
    if codes.multilabel:
      control = decode.selectivity_multilabel(fit, result.c, options.seed)
      extra = {"ridge_r2_authors_metric": decode.ridge_r2(fit.x_NC, fit.y)}
    else:
      control, extra = decode.selectivity(fit, result.c, options.seed), {}
    topo = {"held-out tasks": _topographic(codes, x_NC, codes.split_N == 1, options),
            "all tasks": _topographic(codes, x_NC, np.ones(len(x_NC), bool), options)}
    out[name] = dict(decode=result, selectivity=control, topographic=topo, **extra)
  return out


def headline(codes: extract.Codes) -> list[str]:
  return ["macro_f1"] if codes.multilabel else ["accuracy", "balanced_accuracy"]


def score_of(result, metric: str) -> float:
  return result.macro_f1 if metric == "macro_f1" else result.scores[metric]


def chance_of(result, metric: str) -> dict[str, float]:
  if metric == "macro_f1":
    return dict(result.chance)
  return {k: v[metric] for k, v in result.chance.items()}


def p_value_of(result, metric: str) -> float:
  return result.p_value if metric == "macro_f1" else result.p_value[metric]


@dataclasses.dataclass(frozen=True)
class RunProbe:
  name: str
  workdir: str
  codes: extract.Codes
  codes0: extract.Codes
  analysis: dict
  analysis0: dict
  weights: list
  seconds: float

  def curves(self) -> dict:
    """The series `figures.decoder_vs_layer` draws."""
    sets = list(self.analysis)
    scores = {}
    for metric in headline(self.codes):
      chance = {k: [chance_of(self.analysis[s]["decode"], metric)[k] for s in sets]
                for k in chance_of(self.analysis[sets[0]]["decode"], metric)}
      scores[metric] = dict(
          trained=[score_of(self.analysis[s]["decode"], metric) for s in sets],
          step0=[score_of(self.analysis0[s]["decode"], metric) for s in sets], chance=chance)
    return dict(name=f"{self.name} (step {self.codes.step})", feature_sets=sets, scores=scores)

  def metrics(self, options: ProbeOptions) -> dict:
    def block(analysis):
      return {name: dict(decode=a["decode"].summary(), selectivity=a["selectivity"],
                         topographic={k: t.summary() for k, t in a["topographic"].items()},
                         **{k: v for k, v in a.items()
                            if k not in ("decode", "selectivity", "topographic")})
              for name, a in analysis.items()}
    return dict(name=self.name, workdir=self.workdir, experiment=self.codes.experiment,
                setting=self.codes.setting, step=self.codes.step,
                splits=self.codes.split_names.tolist(), class_names=self.codes.class_names.tolist(),
                code_axes=self.codes.code_axes, num_samples=int(len(self.codes.task_N)),
                options=dataclasses.asdict(options), seconds=self.seconds,
                trained=block(self.analysis), step0=block(self.analysis0),
                generated_weights=[w.summary() for w in self.weights])


def probe_run(run, run0, name: str, options: ProbeOptions, out_dir: str) -> RunProbe:
  """Everything for one restored run (`run0`: its step-0 restore) into `out_dir`."""
  start = time.time()
  epath.Path(out_dir).mkdir(parents=True, exist_ok=True)
  kwargs = dict(num_problems=options.num_problems, batch_size=options.batch_size,
                features=options.features, progress=options.progress, query=options.query)
  codes = extract.extract_codes(run, **kwargs)
  codes.save(extract.codes_path(out_dir, codes.step))
  if run.step == 0:
    codes0 = codes
  else:
    codes0 = extract.extract_codes(run0, **kwargs)
    codes0.save(extract.codes_path(out_dir, 0))
  gen = weights_lib.generated_weights(run, options.weight_problems, options.features,
                                     query=options.query)
  # The probes are small: more BLAS/OpenMP threads only contend (t-SNE ran 15x slower
  # with them on a loaded 2-core machine).
  with threadpoolctl.threadpool_limits(1):
    analysis = analyse(codes, options)
    # The step-0 row is a baseline score: no permutation null of its own.
    analysis0 = analysis if run.step == 0 else analyse(codes0, options, permutations=0)
    probe = RunProbe(name, run.workdir, codes, codes0, analysis, analysis0, gen,
                     time.time() - start)
    figures.decoder_vs_layer([probe.curves()], _join(out_dir, "decoder_vs_layer.png"))
    figures.embeddings(codes, _join(out_dir, "embeddings.png"), seed=options.seed)
    figures.class_cosines(codes, _join(out_dir, "class_cosines.png"))
    figures.topographic({k: v["topographic"]["held-out tasks"] for k, v in analysis.items()},
                        _join(out_dir, "topographic.png"), options.seed)
    figures.generated_cosines(gen, codes.class_names, _join(out_dir, "generated_weights.png"))
  probe = dataclasses.replace(probe, seconds=time.time() - start)
  _write_json(_join(out_dir, "metrics.json"), probe.metrics(options))
  run_files.write_bytes(_join(out_dir, "report.md"), run_report(probe, options).encode())
  return probe


def _finite(data):
  """JSON has no NaN: undefined numbers (a correlation of constant codes) become null."""
  if isinstance(data, dict):
    return {k: _finite(v) for k, v in data.items()}
  if isinstance(data, (list, tuple)):
    return [_finite(v) for v in data]
  if isinstance(data, (float, np.floating)):
    return float(data) if np.isfinite(data) else None
  if isinstance(data, np.integer):
    return int(data)
  return data


def _write_json(path: str, data) -> None:
  run_files.write_bytes(path, json.dumps(_finite(data), indent=1).encode())


def _fmt(x: Optional[float], digits: int = 3) -> str:
  return "n/a" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.{digits}f}"


def table(probes: Sequence[RunProbe]) -> str:
  """One markdown row per (run, feature set): held-out score vs chance, step 0, controls."""
  metrics = headline(probes[0].codes)
  metric = "macro-F1" if probes[0].codes.multilabel else "accuracy / balanced acc."
  joined = lambda of, result: " / ".join(_fmt(of(result, m)) for m in metrics)
  first = next(iter(probes[0].analysis.values()))["decode"]
  head = (f"| run | code | {metric} | step 0 | chance ({' / '.join(first.chance)}) | perm. p | "
          "selectivity (real - control) | topographic rho (p; ceiling), held-out tasks |")
  rows = [head, "|" + "---|" * 8]
  for p in probes:
    for name, a in p.analysis.items():
      d, d0 = a["decode"], p.analysis0[name]["decode"]
      score, step0, pval = joined(score_of, d), joined(score_of, d0), joined(p_value_of, d)
      chance = " / ".join(_fmt(v) for v in chance_of(d, metrics[0]).values())
      s, t = a["selectivity"], a["topographic"]["held-out tasks"]
      rows.append(f"| {p.name} | {name} | {score} | {step0} | {chance} | {pval} | "
                  f"{_fmt(s['selectivity'])} ({_fmt(s['real'])} - {_fmt(s['control'])}) | "
                  f"{_fmt(t.rho)} ({_fmt(t.p_value)}; {_fmt(t.rho_ceiling, 2)}) |")
  return "\n".join(rows)


def settings_text(probe: RunProbe, options: ProbeOptions) -> str:
  c = probe.codes
  d = next(iter(probe.analysis.values()))["decode"]
  return (f"- run `{probe.workdir}`, step {c.step} (baseline: step 0 of the same seed)\n"
          f"- setting `{c.setting}`; code per sample and layer: {c.code_axes}\n"
          f"- fit on `{c.split_names[0]}`, score on `{c.split_names[1]}` "
          f"({options.num_problems} problems each, {len(c.task_N)} samples in all)\n"
          f"- probe: StandardScaler + L2 LogisticRegression, C in {decode.C_GRID.tolist()} "
          "by stratified group k-fold over tasks on the fitting side\n"
          f"- permutation null: {d.num_permutations} unit-level label shuffles; Mantel: "
          f"{options.mantel_permutations} task permutations\n"
          "- topographic similarity: Spearman(cosine distance of task mean codes, Hamming "
          "distance of task meanings), one-sided Mantel p\n"
          f"- probe time: {probe.seconds:.0f} s\n")


def run_report(probe: RunProbe, options: ProbeOptions) -> str:
  figs = "\n".join(f"![{f}]({f}.png)" for f in (
      "decoder_vs_layer", "embeddings", "class_cosines", "topographic", "generated_weights"))
  extra = ""
  if probe.codes.multilabel:
    extra = "\nAuthors' logged metric (ridge R^2 of the term matrix, training tasks only): " + \
        ", ".join(f"{k} {_fmt(a['ridge_r2_authors_metric'])}" for k, a in probe.analysis.items())
  return (f"# Latent-code probe: {probe.name}\n\n## Settings\n{settings_text(probe, options)}\n"
          f"## Decoding on held-out tasks\n{table([probe])}\n{extra}\n\n## Figures\n{figs}\n")


def comparison_report(probes: Sequence[RunProbe], options: ProbeOptions, out_dir: str) -> None:
  """Side-by-side table and figure of several runs in `out_dir`."""
  figures.decoder_vs_layer([p.curves() for p in probes], _join(out_dir, "decoder_vs_layer.png"))
  _write_json(_join(out_dir, "metrics.json"), {p.name: p.metrics(options) for p in probes})
  runs = "\n".join(f"- {p.name}: `{p.workdir}` step {p.codes.step}, per-run report "
                   f"[{p.name}/report.md]({p.name}/report.md), {p.seconds:.0f} s" for p in probes)
  tables = "\n\n".join(table([p for p in probes if p.codes.experiment == kind])
                        for kind in dict.fromkeys(p.codes.experiment for p in probes))
  run_files.write_bytes(_join(out_dir, "report.md"), (
      f"# Latent-code probes side by side\n\n{runs}\n\n{tables}\n\n"
      "![decoder_vs_layer](decoder_vs_layer.png)\n").encode())


def _join(directory: str, name: str) -> str:
  """`directory/name` for a local or gs:// directory, as given (not made absolute)."""
  return str(epath.Path(directory) / name)


def resolve_workdirs(workdirs: Sequence[str]) -> tuple[list[str], Optional[str]]:
  """The runs to probe: a run directory as given; a population (its `config.json` lists
  members) as its members' directories; a sweep root (no `config.json`) as every run and
  population member below it (`run_files.find_runs`).

  Returns the runs and the root if exactly one population or sweep root was given (its
  default output).
  """
  runs, roots = [], []
  for w in workdirs:
    root = run_files.path(w)
    if root.is_dir():
      try:
        config = run_files.read_config(w)
      except ValueError:
        config = {}  # Unreadable: `restore.load_config` names it.
      if config is None or run_files.is_population(config):
        below = run_files.find_runs(root)
        if below:
          runs.extend(_join(w, os.path.relpath(str(r), str(root))) for r in below)
          roots.append(w)
          continue
    runs.append(w)
  return runs, (roots[0] if len(roots) == 1 and len(workdirs) == 1 else None)


def run_names(workdirs: Sequence[str], attentions: Sequence[str]) -> list[str]:
  """The attention preset when that tells the runs apart, else the directory names, else
  their last two parts (members of several populations: `<population>/<member>`)."""
  for names in (list(attentions), [epath.Path(w).name for w in workdirs],
                ["/".join(epath.Path(w).parts[-2:]) for w in workdirs]):
    if len(set(names)) == len(names):
      return names
  return [f"run{i}" for i in range(len(workdirs))]


def output_dirs(runs: Sequence[str], root: Optional[str], output_dir: Optional[str]
                ) -> Optional[str]:
  """Where the side-by-side report goes (None: a single run, written to DIR/probe)."""
  if output_dir:
    return output_dir
  if len(runs) == 1:
    return None
  if root:
    return _join(root, "probe")
  raise ValueError(f"{len(runs)} workdirs given without --output_dir; allowed: one workdir, "
                   "one sweep root or population, or several workdirs with --output_dir")


def probe_workdirs(workdirs: Sequence[str], step: Optional[int], options: ProbeOptions,
                   output_dir: Optional[str] = None) -> list[RunProbe]:
  """Restores every run first (all bad input fails before any file is written), then probes
  each: a population or a root of them gives one probe per member."""
  from hypernet_attention.train import restore  # pylint: disable=g-import-not-at-top
  paths, root = resolve_workdirs(workdirs)
  combined = output_dirs(paths, root, output_dir)
  configs = [restore.load_config(path) for path in paths]
  for path, config in zip(paths, configs):
    if config.experiment not in extract.probed_experiments():
      raise ValueError(f"{path!r} is a {config.experiment!r} run; allowed experiments: "
                       f"{sorted(extract.probed_experiments())}")
  names = run_names(paths, [c.model.attention for c in configs])
  outs = [_join(combined, name) if combined else _join(path, "probe")
          for path, name in zip(paths, names)]
  for out in ([combined] if combined else []) + outs:  # The folder given first.
    run_files.check_output_dir(out, "--output_dir" if output_dir else "output folder")
  runs = [restore.restore_params(p, step) for p in paths]
  runs0 = [restore.restore_params(p, 0) if r.step else r for p, r in zip(paths, runs)]
  probes = [probe_run(run, run0, name, options, out)
            for run, run0, name, out in zip(runs, runs0, names, outs)]
  if combined:
    comparison_report(probes, options, combined)
  return probes
