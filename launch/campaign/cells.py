"""The paper-scale campaign's cells, in the order they should run (issue "Paper-scale campaign").

A cell is one job of a paper sweep: one model and config, trained as one population whose members
are seeds x grid settings (`hypernet_attention/train/population.py`), or a probe of a trained cell's
members, or a benchmark. Cells are the unit that adds up across short accelerator windows: each
finished cell becomes one small JSON file under `experiments/results/paper_scale/` (`records.py`),
named by `Cell.name`, so the names here are stable: renaming one orphans its file.

Priority: the stages of `STAGES`, in order (what a user asks first, cheapest first within
a stage); each stage's letter, title and role in the report are declared there once."""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Optional

from hypernet_attention.runs import preflight
from hypernet_attention.runs import registry
from hypernet_attention.runs import run_files
from launch import grouping
from launch import jobs
from launch.sweeps import common
from launch.sweeps import fig4_sraven_scaling
from launch.sweeps import fig5c_heads_sraven
from launch.sweeps import figa5_holdout_sraven

# Each stage: its letter (its cells' name prefix and `Cell.stage`) and what it runs.
STAGES = {
    "a": "fuzzy logic, Table A1 main rows (softmax, linear, HYLA), paper size, the paper's "
        "default setting (lr 1e-3, wd 0.1, warmup 100), one cell per seed so that a 2-core CPU "
        "finishes one in a session; seeds interleaved so that paired comparisons come first",
    "b": "SRAVEN, Table A1 main rows, paper size (width 1, depth 4, 156,250 steps), "
        "lr 1e-3, wd 0.1, warmup 1000, 3 seeds per cell",
    "c": "decoding from the latent codes of a's seed-0 cells (Fig. 2) and b's members "
        "(Fig. 5F), from the final parameters every finished train cell keeps",
    "d": "fuzzy logic's ablation and '+ MoE' rows of Table A1 at the default setting (3 "
        "seeds, one population each; the paper's claim that both of HYLA's changes matter rests "
        "on them), then the rest of each main row's grid (Table A1 reports the best grid point)",
    "e": "the ablation and '+ MoE' rows over the rest of their grids (fuzzy logic: "
        "the default setting ran in d) or their whole grid (SRAVEN)",
    "f": "Fig. 4's corners, Fig. 5C (heads), Fig. A5 (held-out fraction) at the "
        "default setting",
    "g": "the C4 50M training step: tokens/s, MFU, peak memory, softmax vs HYLA",
    "h": "fuzzy logic's main rows on the authors' own held-out splits "
        "(task.split_draw=authors), seed 2 first: at 70% held out the authors' seed-2 split "
        "trains neither term 5 nor 6, which our default (covering) re-draws away"}
# What the report reads from each stage: Table A1's rows (every run of a Table A1 row at
# the paper's size, each run once), the main rows' learning curves, the authors' splits.
TABLE_A1_STAGES = ("a", "b", "d", "e")
MAIN_ROW_STAGES = ("a", "b")
AUTHORS_SPLIT_STAGE = "h"
# Fuzzy logic's ablation rows in the order stage d runs them: the three that separate
# HYLA's two changes first (Table A1: RMSHead on linear attention, HYLA without RMSHead,
# HYLA with a linear value network), then the rest.
ABLATION_ORDER = ("linear_rmshead", "hyla_no_rmshead", "hyla_linear_value",
                  "linear_rmshead_nonlinear_value", "hyla_linear_value_no_rmshead",
                  "softmax_hyla", "hyla_deep")
KINDS = ("train", "probe", "benchmark")
# The experiments of the paper's cells. What the campaign knows about each (default
# setting, grid, reported splits, steps, the paper's numbers) is its record's
# (`registry.Paper`), read through `paper()`.
FUZZY = "fuzzy_logic"
SRAVEN = "sraven"
C4 = "c4_lm"
# Stage h's override: the held-out split drawn as the authors' code draws it.
AUTHORS_SPLIT_KEY = "task.split_draw"
SYNTHETIC_TOKENS = (("synthetic_tokens", True),)  # benchmark_training.py's switch.


@dataclasses.dataclass(frozen=True)
class Cell:
  """One unit of the campaign.

  `train`: `config` (the config file's argument) + `overrides` shared by every member, and
  `members` (each a dict of `population.MEMBER_KEYS`) named by `member_names`.
  `probe`: decodes the rules from the latent codes of the members of cell `source`
  (`overrides`: flags of `experiments/probe_latents.py`, e.g. fewer problems for a smoke).
  `benchmark`: times `num_steps`-step chunks of the training step of `models` at size
  `config` (`experiments/benchmark_training.py`; `overrides`: its flags, True for a switch)."""
  name: str
  stage: str
  kind: str
  experiment: str
  title: str
  config: str = ""
  model: str = ""
  overrides: tuple[tuple[str, Any], ...] = ()
  members: tuple[dict[str, Any], ...] = ()
  num_steps: int = 0
  source: Optional[str] = None  # `probe`: the train cell whose members are probed.
  models: tuple[str, ...] = ()  # `benchmark`: the presets timed side by side.

  @property
  def member_names(self) -> tuple[str, ...]:
    """`lr0.003,wd0.03,seed1` (just `seed1` at the default setting): readable, unique."""
    def part(key, value):  # `lr0.003`, `seed1`
      return common.SHORT.get(key, key) + (f"{value:g}" if isinstance(value, float) else str(value))
    return tuple(",".join(part(k, v) for k, v in m.items()) for m in self.members)

  def point(self) -> dict[str, Any]:
    """The population job as a sweep point (`launch.jobs` turns it into flags)."""
    return {"config": self.config, **dict(self.overrides),
            grouping.MEMBERS_KEY: self.members, grouping.NAMES_KEY: self.member_names}


def recorded_config(cell: Cell) -> dict[str, Any]:
  """The config.json a run of train cell `cell` records: its config file's `get_config`
  with the overrides and members of its command line, parsed as the entry point parses
  them (`runs/preflight.py`, no JAX)."""
  args = jobs.flags_list(jobs.job_args(cell.point(), cell.experiment, workdir=""))
  overrides = [a for a in args if a.startswith("--config.")]
  return run_files.config_to_json(preflight.load(cell.experiment, cell.config, overrides))


def run_differences(cell: Cell, recorded: Any) -> list[str]:
  """Where a run's recorded config (its workdir's or resume state's config.json) differs
  from what `cell` trains, every field compared as a resume compares them (the learning
  rate, the task's data, the model's code paths alike; only `run_files.RESUME_FREE_KEYS`
  and switches added since at their off value may differ), first field first, each as
  "key: recorded -> the cell's"; [] if it is the cell's run."""
  if not isinstance(recorded, dict):
    return [f"{run_files.CONFIG}: {recorded!r} -> an object"]
  # The trainer's own resume rule, so that what is published is what would resume.
  return run_files._config_differences(  # pylint: disable=protected-access
      recorded, recorded_config(cell))


def paper(experiment: str) -> registry.Paper:
  """The paper's settings and numbers of `experiment` (its record's); a ValueError naming
  the experiments that have them for one that is not in the paper."""
  record = registry.get(experiment)
  if record.paper is None:
    allowed = [n for n, e in registry.EXPERIMENTS.items() if e.paper is not None]
    raise ValueError(f"experiment {experiment!r} has no paper settings; allowed: {allowed}")
  return record.paper


def _train(name, stage, experiment, model, members, title, config=None, overrides=(),
           num_steps=None) -> Cell:
  # The paper-size config of the experiment's record (`registry.Experiment.campaign_config`).
  config = config or registry.get(experiment).campaign_config.format(model=model, width=1, depth=4)
  return Cell(name, stage, "train", experiment, title, config=config, model=model,
              overrides=tuple(overrides), members=tuple(members),
              num_steps=num_steps or paper(experiment).num_steps)


def _default_members(seeds=common.SEEDS):
  """At the default setting the members differ only in seed (the setting is an override)."""
  return [{"seed": s} for s in seeds]


def _default_overrides(experiment):
  return tuple(paper(experiment).default_setting.items())


def _stage_a() -> list[Cell]:
  return [_train(f"a_fuzzy_{m}_seed{s}", "a", FUZZY, m, _default_members((s,)),
                 f"fuzzy logic, {m}, default setting, seed {s}",
                 overrides=_default_overrides(FUZZY))
          for s in common.SEEDS for m in ("hyla", "softmax", "linear")]


def _stage_b() -> list[Cell]:
  return [_train(f"b_sraven_{m}", "b", SRAVEN, m, _default_members(),
                 f"SRAVEN, {m}, default setting, 3 seeds", overrides=_default_overrides(SRAVEN))
          for m in ("hyla", "softmax", "linear")]


def _stage_c() -> list[Cell]:
  """Decoding from the latent codes of a and b's kept parameters: fuzzy logic's terms of
  held-out tasks (Fig. 2; seed 0 of each main row first), SRAVEN's rules (Fig. 5F), then
  fuzzy logic's seeds 1 and 2 (the paper's Fig. 2B is one run; three seeds say whether one
  model's code decodes better than another's, which seed 0 alone cannot)."""
  fuzzy = lambda seeds: [Cell(f"c_fuzzy_decoding_{m}_seed{s}", "c", "probe", FUZZY,
                              f"term decoding (Fig. 2) of a_fuzzy_{m}_seed{s}", model=m,
                              source=f"a_fuzzy_{m}_seed{s}")
                         for s in seeds for m in ("hyla", "softmax", "linear")]
  sraven = [Cell(f"c_sraven_decoding_{m}", "c", "probe", SRAVEN,
                 f"rule decoding (Fig. 5F) of b_sraven_{m}", model=m, source=f"b_sraven_{m}")
            for m in ("hyla", "softmax", "linear")]
  return fuzzy(common.SEEDS[:1]) + sraven + fuzzy(common.SEEDS[1:])


def _grid_members(experiment, exclude_default: bool) -> list[dict[str, Any]]:
  default = paper(experiment).default_setting
  settings = [s for s in common.product(**paper(experiment).grid)
              if not (exclude_default and all(s.get(k) == v for k, v in default.items()))]
  return [{**s, "seed": seed} for s in settings for seed in common.SEEDS]


def _ablation_rows() -> list[tuple[str, bool]]:
  """Table A1's rows beyond the main ones: (preset, with MoE), in stage d's order."""
  assert set(ABLATION_ORDER) == set(common.TABLE_A1_PRESETS) - set(common.MAIN_MODELS)
  return [(p, False) for p in ABLATION_ORDER] + [(p, True) for p in common.TABLE_A1_MOE_PRESETS]


MOE = ("model.feed_forward", "moe")  # the override that makes a Table A1 row its MoE row


def _moe(moe: bool) -> tuple[tuple[str, Any], ...]:
  return (MOE,) if moe else ()


def is_moe(overrides: dict[str, Any]) -> bool:
  """Whether a cell's (or a cell file's) overrides select the MoE feed-forward (`_moe`)."""
  key, value = MOE
  return overrides.get(key) == value


def _stage_d() -> list[Cell]:
  defaults = [_train(f"d_{paper(e).cell_prefix}_{p}{'_moe' if moe else ''}_default", "d", e, p,
                     _default_members(), f"{paper(e).label.lower()}, {p}"
                     f"{' + MoE' if moe else ''}, default setting, 3 seeds",
                     overrides=_default_overrides(e) + _moe(moe))
              for e in (FUZZY, SRAVEN) if paper(e).ablations_default_first
              for p, moe in _ablation_rows()]
  return defaults + [_train(f"d_{paper(e).cell_prefix}_{m}_grid", "d", e, m,
                            _grid_members(e, exclude_default=True),
                            f"{e}, {m}, the rest of its grid")
                     for e in (FUZZY, SRAVEN) for m in common.MAIN_MODELS]


def _stage_e() -> list[Cell]:
  """The ablation rows over their grid: the rest of it where stage d ran the default."""
  return [_train(f"e_{paper(e).cell_prefix}_{p}{'_moe' if moe else ''}", "e", e, p,
                 _grid_members(e, exclude_default=paper(e).ablations_default_first),
                 f"{e}, {p}{' + MoE' if moe else ''}, "
                 + ("the rest of its grid" if paper(e).ablations_default_first
                    else "its whole grid"), overrides=_moe(moe))
          for e in (FUZZY, SRAVEN) for p, moe in _ablation_rows()]


def _stage_f() -> list[Cell]:
  def cell(name, m, title, key, value, **kwargs):  # SRAVEN, default setting, one override.
    return _train(f"f_{name}", "f", SRAVEN, m, _default_members(), title,
                  overrides=_default_overrides(SRAVEN) + ((key, value),), **kwargs)
  problems, batch = fig4_sraven_scaling.PROBLEMS, fig4_sraven_scaling.BATCH_SIZE
  config = registry.get(SRAVEN).campaign_config
  fig4 = [cell(f"fig4_{m}_w{w}_d{d}_{n // 1_000_000}m", m, f"Fig. 4 corner: {m}, width {w}, "
               f"depth {d}, {n // 1_000_000}M problems", "num_train_steps", n // batch,
               config=config.format(model=m, width=w, depth=d), num_steps=n // batch)
          for m in common.MAIN_MODELS
          for w, d, n in itertools.product((1, 4), (4, 16), (problems[0], problems[-1]))]
  return fig4 + [
      cell(f"fig5c_{m}_heads{h}", m, f"Fig. 5C: {m}, {h} heads", "model.num_heads", h)
      for m, h in itertools.product(common.MAIN_MODELS, fig5c_heads_sraven.HEADS)] + [
      cell(f"figa5_{m}_holdout{f:g}", m, f"Fig. A5: {m}, {f:g} held out",
           "task.holdout_fraction", f)
      for m, f in itertools.product(common.MAIN_MODELS, figa5_holdout_sraven.HOLDOUT_FRACTIONS)]


def _stage_g() -> list[Cell]:
  # Random tokens: the step is the same, and a lent GPU's image has neither TensorFlow nor
  # seqio nor a way to the C4 vocabulary (gs://). Batch 64 x 512 on one device: the paper's
  # 256 rows were spread over 16 TPU v5e chips (16 each), and all 256 on one device need
  # ~100-130 GiB (XLA's analysis on CPU), more than an H100 has.
  return [Cell("g_c4_50m_step", "g", "benchmark", C4,
               "C4 50M training step, batch 64 x 512 on one device: softmax vs HYLA",
               config="50m", models=("softmax", "hyla"), num_steps=20,
               overrides=SYNTHETIC_TOKENS + (("config_overrides", "batch_size=64"),))]


def _stage_h() -> list[Cell]:
  return [_train(f"h_fuzzy_{m}_authors_split_seed{s}", "h", FUZZY, m, _default_members((s,)),
                 f"fuzzy logic, {m}, default setting, the authors' split of seed {s}",
                 overrides=_default_overrides(FUZZY) + ((AUTHORS_SPLIT_KEY, "authors"),))
          for s in (2, 0, 1) for m in ("hyla", "softmax", "linear")]


CELLS: tuple[Cell, ...] = tuple(_stage_a() + _stage_b() + _stage_c() + _stage_d()
                                + _stage_e() + _stage_f() + _stage_g() + _stage_h())
BY_NAME = {c.name: c for c in CELLS}
assert len(BY_NAME) == len(CELLS), "cell names must be unique"
assert all(c.stage in STAGES and c.name.startswith(c.stage + "_") for c in CELLS)

# A campaign in a minute on a CPU (`--set=smoke`): every kind of cell at `size=smoke`, for
# trying the runner and for the tests. Its cells are never mixed with the paper's.
SMOKE_STEPS = 8  # config_common.use_smoke_schedule


def _smoke() -> list[Cell]:
  return [
      *(_train(f"smoke_{name}_{m}", stage, e, m, [{"seed": 0}, {"seed": 1}],
               f"smoke: {label}, {m}", config=f"model={m},size=smoke", num_steps=SMOKE_STEPS)
        for name, stage, e, label, m in [("fuzzy", "a", FUZZY, "fuzzy logic", "hyla"),
                                         ("fuzzy", "a", FUZZY, "fuzzy logic", "softmax"),
                                         ("sraven", "b", SRAVEN, "SRAVEN", "hyla")]),
      Cell("smoke_sraven_decoding_hyla", "c", "probe", SRAVEN, "smoke: decoding of SRAVEN hyla",
           model="hyla", source="smoke_sraven_hyla",
           overrides=(("num_problems", 64), ("permutations", 2))),
      Cell("smoke_c4_step", "g", "benchmark", C4, "smoke: C4 step on random tokens",
           config="smoke", models=("softmax", "hyla"), num_steps=2, overrides=SYNTHETIC_TOKENS)]


SMOKE_CELLS: tuple[Cell, ...] = tuple(_smoke())
SETS = {"paper": CELLS, "smoke": SMOKE_CELLS}
BY_NAME.update({c.name: c for c in SMOKE_CELLS})
