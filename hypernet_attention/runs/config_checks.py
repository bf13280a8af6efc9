"""Every check a config needs before any work, in one place, with the messages users see.

`validate(config)` takes the values the config alone decides: types, ranges, finiteness,
the run's schedule and intervals, the attention preset, and a population's members, each as
the single run it is (`check_population`), and the names the model and the task choose
among (`presets.check_model_names`, the record's `names`). It runs once, where the config
enters (`experiment_main` in `runtime.py`, `preflight.py` on the launching machine before
anything is copied or submitted, `loop.train_and_evaluate` and `lm.train_and_sample` for library
callers), and returns a `Checked`: the config with what later stages would otherwise look up
again (its registry record, its members' configs and directory names), the only thing
`build.setup` and `population.setup` take. What needs the training host (the task's memory, the
mesh, batch divisibility) is checked there (`objectives.build`, `sharding.py`, `data.py`). A
restore validates a run's recorded config as it reads it (`restore.py`).

JAX is not imported here (the attention presets are plain data in `presets.py`), so a
launching machine without JAX can run `validate` and `check_preset`."""

from __future__ import annotations

import difflib
import math
from typing import Any, Mapping, NamedTuple, Sequence

import ml_collections

from hypernet_attention import presets
from hypernet_attention.errors import BadInput
from hypernet_attention.errors import check_choice
from hypernet_attention.runs import registry
from hypernet_attention.runs.run_files import MEMBER_KEYS
from hypernet_attention.runs.run_files import MEMBER_NAME

# Config fields that must be positive integers wherever they appear (sizes and intervals).
POSITIVE_FIELDS = (
    "batch_size", "num_train_steps", "steps_per_loop", "log_every_steps", "eval_every_steps",
    "checkpoint_every_steps", "keep_checkpoints", "eval.num_problems", "eval.batch_size",
    "model.num_layers", "model.emb_dim", "model.num_heads", "model.qk_dim", "model.v_dim",
    "model.mlp_dim")
# Floating-point dtypes a model may compute or store its parameters in.
DTYPES = ("float32", "bfloat16", "float16")
# Real-valued fields: (key, lowest, highest, lowest allowed?, highest allowed?). Every one
# must also be finite; a value outside trains silently wrong (a negative learning rate
# ascends the gradient, a negative clip norm flips every gradient, dropout 1 drops all).
RANGES = (
    ("optimizer.learning_rate", 0.0, math.inf, False, False),
    ("optimizer.weight_decay", 0.0, math.inf, True, False),
    ("optimizer.end_lr_fraction", 0.0, 1.0, True, True),
    ("optimizer.b1", 0.0, 1.0, True, False),
    ("optimizer.b2", 0.0, 1.0, True, False),
    ("optimizer.eps", 0.0, math.inf, False, False),
    ("optimizer.grad_clip_norm", 0.0, math.inf, True, False),
    ("model.attention_dropout", 0.0, 1.0, True, False),
    ("preemption_grace_s", 0.0, math.inf, True, False))


def get_dotted(config: ml_collections.ConfigDict, key: str) -> Any:
  """`config.<dotted key>`, or None where a part of the path is absent."""
  node = config
  for name in key.split("."):
    node = node.get(name) if isinstance(node, ml_collections.ConfigDict) else None
  return node


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def check_run(config: ml_collections.ConfigDict) -> None:
  """Sizes (`POSITIVE_FIELDS`), finite numbers in range (`RANGES`) and the run-level fields no
  single module owns: seed, schedule (the authors' needs a cosine part), stop step, eval
  (whole batches), dtypes. All a population member may change (`MEMBER_KEYS`) is checked
  here. Raises `BadInput` naming the first bad key."""
  for key in POSITIVE_FIELDS:
    value = get_dotted(config, key)
    if value is not None and (not _is_int(value) or value <= 0):
      raise BadInput(f"config.{key}={value!r} must be a positive integer")
  for key, low, high, low_in, high_in in RANGES:
    value = get_dotted(config, key)
    if value is not None and not (
        (_is_int(value) or isinstance(value, float)) and math.isfinite(value)
        and (low <= value if low_in else low < value)
        and (value <= high if high_in else value < high)):
      allowed = (f"a finite number {'>=' if low_in else '>'} {low:g}" if high == math.inf else
                 f"a number in {'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}")
      raise BadInput(f"config.{key}={value!r}; allowed: {allowed}")
  for key, or_none in (("seed", ""), ("task.split_seed", "None (the run's seed) or ")):
    seed = get_dotted(config, key)
    if (seed is not None or not or_none) and (not _is_int(seed) or not 0 <= seed < 2**32):
      raise BadInput(f"config.{key}={seed!r}; allowed: {or_none}an integer in [0, 2**32)")
  warmup, steps = get_dotted(config, "optimizer.warmup_steps"), config.num_train_steps
  if warmup is not None and (not _is_int(warmup) or not 0 <= warmup < steps):
    raise BadInput(f"config.optimizer.warmup_steps={warmup!r}; allowed: an integer in "
                   f"[0, config.num_train_steps={steps})")
  stop = config.get("stop_after_steps")
  if stop is not None and (not _is_int(stop) or stop <= 0):
    raise BadInput(f"config.stop_after_steps={stop!r}; allowed: None (no stop) or a positive "
                   "integer")
  splits = get_dotted(config, "eval.splits")
  if splits is not None and (isinstance(splits, str) or not tuple(splits)):
    raise BadInput(f"config.eval.splits={splits!r}; allowed: a non-empty list of split names")
  ceiling = get_dotted(config, "eval.ceiling_problems")
  if ceiling is not None and (not _is_int(ceiling) or ceiling < 0):
    raise BadInput(f"config.eval.ceiling_problems={ceiling!r}; allowed: an integer >= 0 "
                   "(0: no ceilings)")
  for key in ("model.dtype", "model.param_dtype"):
    value = get_dotted(config, key)
    if value is not None and str(value) not in DTYPES:
      raise BadInput(f"config.{key}={value!r}; allowed: {', '.join(DTYPES)}")
  if config.eval.num_problems % config.eval.batch_size:
    raise BadInput(f"config.eval.num_problems={config.eval.num_problems} is not a multiple of "
                   f"config.eval.batch_size={config.eval.batch_size}")
  opt = config.optimizer
  if opt.get("authors_schedule", False) and (config.num_train_steps - 2 * opt.warmup_steps <= 0):
    raise BadInput(
        f"optimizer.authors_schedule=True needs num_train_steps > 2 * warmup_steps (its "
        f"cosine lasts num_train_steps - 2 * warmup_steps); got num_train_steps="
        f"{config.num_train_steps}, warmup_steps={opt.warmup_steps}")


def check_preset(name: str) -> str:
  """Raises `BadInput` unless `name` is an attention preset (`presets.PRESETS`, the rows
  `attention.py` builds)."""
  if name not in presets.PRESETS:
    raise BadInput(f"unknown attention preset {name!r}; allowed: {sorted(presets.PRESETS)}")
  return name


class Checked(NamedTuple):
  """A config `validate` passed, with what it looked up: the run's record and, for a
  population, each member's config and directory name. Why a type: what the layers below
  (`build.setup`, `population.setup`) receive says that the config was checked where it
  entered (the module docstring), so they check nothing again and look nothing up again."""
  config: ml_collections.ConfigDict
  experiment: registry.Experiment
  members: tuple[ml_collections.ConfigDict, ...] = ()
  member_names: tuple[str, ...] = ()


def validate(config: ml_collections.ConfigDict | Checked) -> Checked:
  """Every config value whose type, range or finiteness the config alone decides, for the
  run and for each population member (`check_population`); a `Checked` is returned as it is.

  Raises `BadInput` naming the first bad key, its value and what is allowed. Task and
  device checks (sizes against memory, the mesh) follow in `build.setup`."""
  if isinstance(config, Checked):
    return config
  try:
    experiment = registry.get(config.get("experiment"))
  except ValueError as e:
    raise BadInput(f"config.experiment: {e}") from None
  check_run(config)
  check_preset(config.model.attention)
  members, names = check_population(config, experiment)
  # The task's choices, refused after the model's as the same one line (`errors.check_choice`).
  choices = [(f"config.{key}", value, allowed) for key, allowed in experiment.names.items()
             if (value := get_dotted(config, key)) is not None]
  presets.check_model_names(config.model, "config.model.")
  for choice in choices:
    check_choice(*choice)
  return Checked(config, experiment, members, names)


def unknown_key(config: ml_collections.ConfigDict, key: str) -> str | None:
  """Why the dotted `key` (as in `--config.<key>=`) is not a field of `config`, naming the
  nearest key where it strays (or, with none near, the keys allowed there); None if it is."""
  parts = key.split(".")
  node = config
  for i, name in enumerate(parts):
    where = ".".join(parts[:i])
    if not isinstance(node, ml_collections.ConfigDict):
      return f"unknown config key {key!r}: {where!r} is a value, not a group of keys"
    if name not in node:
      near = difflib.get_close_matches(name, list(node.keys()), n=1)
      if near:
        return f"unknown config key {key!r}; did you mean {'.'.join(parts[:i] + near)!r}?"
      return (f"unknown config key {key!r}; allowed{f' in {where!r}' if where else ''}: "
              f"{sorted(node.keys())}")
    node = node[name]
  return None


def set_dotted(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
  """`config.<key> = value` for a dotted `key` (e.g. 'model.activation'), as
  `--config.<key>=` would set it: an unknown key is a ValueError, never a new field, and
  a string given for a number or bool field is converted to that field's type."""
  if (problem := unknown_key(config, key)) is not None:
    raise ValueError(problem)
  parent_key, _, leaf = key.rpartition(".")
  parent = get_dotted(config, parent_key) if parent_key else config
  node = parent[leaf]
  if isinstance(value, str) and isinstance(node, (bool, int, float)):
    value = _typed(key, value, type(node))
  parent[leaf] = value


# A string given for a field of this type -> (its value or None, what is allowed).
_CONVERSIONS = {
    bool: (lambda text: {"1": True, "true": True, "0": False, "false": False}.get(
        text.strip().lower()), "true or false"),
    int: (int, "an integer"),
    float: (float, "a number")}


def _typed(key: str, text: str, kind: type) -> Any:
  convert, allowed = _CONVERSIONS[kind]
  try:
    value = convert(text)
  except ValueError:
    value = None
  if value is None:
    raise ValueError(f"config.{key}={text!r}; allowed: {allowed}")
  return value


# What a population's workdir holds itself (`population_loop.py`, `lock.py`,
# `launch/run_local.py`): a member directory of one of these names would overwrite it.
RESERVED_NAMES = ("checkpoints", "corrupt_checkpoints", "config.json", "summary.json",
                  "population_summary.json", "lock.json", "accuracy_ceilings.json",
                  "run_local.json")
EVENTS_PREFIX = "events.out.tfevents"  # TensorBoard's event files.


def _member_settings(config: ml_collections.ConfigDict) -> tuple[Any, ...]:
  """`config.population.members` as a tuple of mappings; `BadInput` for any other shape
  (a dict where the tuple goes: `({'seed': 1})` lacks its trailing comma)."""
  value = get_dotted(config, "population.members")
  if value is None:
    return ()
  if not _is_sequence(value):
    raise BadInput(f"config.population.members={_plain(value)!r}; allowed: a tuple of dicts, "
                   "one per member (one member needs a trailing comma: ({'seed': 1},))")
  for i, member in enumerate(value):
    if not isinstance(member, (Mapping, ml_collections.ConfigDict)):
      raise BadInput(f"config.population.members[{i}]={member!r}; allowed: a dict of "
                     f"{list(MEMBER_KEYS)} (one member needs a trailing comma: "
                     "({'seed': 1},))")
    for key, setting in dict(member).items():
      if key not in MEMBER_KEYS:
        raise BadInput(
            f"config.population.members[{i}] sets {key!r}, which changes shapes or code; members "
            f"may differ only in {list(MEMBER_KEYS)} (run other keys as separate populations)")
      if not (isinstance(setting, (int, float, str)) and not isinstance(setting, bool)
              or setting is None and key == "task.split_seed"):
        raise BadInput(f"config.population.members[{i}]: {key}={setting!r}; allowed: a number")
  return tuple(dict(m) for m in value)


def _plain(value: Any) -> Any:
  """A ConfigDict as the dict it was given as (its repr is multi-line YAML)."""
  return value.to_dict() if isinstance(value, ml_collections.ConfigDict) else value


def _is_sequence(value: Any) -> bool:
  """A tuple or list (not a string, dict or ConfigDict, which iterate too)."""
  return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _bad_name(name: Any) -> bool:
  return (not isinstance(name, str) or not name.strip() or name != name.strip()
          or name.startswith(".") or any(c in name for c in "/\\:") or not name.isprintable()
          or len(name.encode()) > 255 or name in RESERVED_NAMES
          or name.startswith(EVENTS_PREFIX))


def check_member_names(config: ml_collections.ConfigDict, size: int) -> tuple[str, ...]:
  """Each member's directory name (`population.member_names`, or member0, member1, ...);
  `BadInput` unless there is one unique, plain name per member that no file of the
  population's own workdir has."""
  names = get_dotted(config, "population.member_names") or ()
  if not _is_sequence(names):
    raise BadInput(f"config.population.member_names={_plain(names)!r}; allowed: a tuple of "
                   "directory names, one per member")
  if names and not size:
    raise BadInput(f"config.population.member_names={list(names)!r} but config.population.members "
                   "is empty; allowed: names only with members (a single run takes no names)")
  names = tuple(names) or tuple(MEMBER_NAME.format(i) for i in range(size))
  bad = [n for n in names if _bad_name(n)]
  if len(names) != size or len(set(names)) != len(names) or bad:
    raise BadInput(
        f"config.population.member_names={list(names)!r}"
        + (f" ({bad[0]!r} is not allowed)" if bad else "")
        + f"; allowed: one unique directory name per member ({size} members): printable, "
        "no '/', '\\' or ':', not starting with '.', not one of the workdir's own "
        f"{list(RESERVED_NAMES)} or {EVENTS_PREFIX}*")
  return names


def member_config(config: ml_collections.ConfigDict, index: int) -> ml_collections.ConfigDict:
  """The single run that member `index` is: the population's config with the member's
  settings and no population (what its `config.json` records)."""
  member = ml_collections.ConfigDict(config.to_dict())
  for key, value in _member_settings(config)[index].items():
    try:
      set_dotted(member, key, value)
    except (ValueError, TypeError) as e:
      raise BadInput(f"config.population.members[{index}]: {key}={value!r} ({e})") from None
  member.population.members = ()
  member.population.member_names = ()
  return member


def check_population(config: ml_collections.ConfigDict, experiment: registry.Experiment
                     ) -> tuple[tuple[ml_collections.ConfigDict, ...], tuple[str, ...]]:
  """Checks every member of `config.population` as the single run it is (`check_run`: all
  else it shares with the population), before any work, and returns their configs and
  directory names (both empty for a single run).

  `BadInput` on the first problem: members that are not a tuple of dicts, a member key
  that is not batchable, bad member names, a member value a single run would refuse
  (prefixed by `config.population.members[i]`), two members that are the same run."""
  settings = _member_settings(config)
  # Refused before a language model's vocabulary or data are touched (the record says
  # which experiments train populations: on-device tasks with split tables).
  if settings and not experiment.population:
    why = "reads host-side data" if not experiment.on_device else "trains no population"
    raise BadInput(f"config.population.members set for experiment {experiment.name!r}, "
                   f"which {why}; allowed: populations of "
                   f"{', '.join(registry.names(population=True))} (on-device tasks)")
  if settings and config.get("debug_nans"):  # It would stop all members at one's first NaN.
    raise BadInput("config.debug_nans=True with config.population.members; allowed: false (a "
                   "population freezes a diverged member): find the op in that member's own run")
  names = check_member_names(config, len(settings))
  configs, seen = [], {}
  for i in range(len(settings)):
    member = member_config(config, i)
    try:
      check_run(member)
    except BadInput as e:
      raise BadInput(f"config.population.members[{i}]: {e}") from None
    run = member.to_json_best_effort(sort_keys=True)
    if run in seen:
      raise BadInput(
          f"config.population.members[{seen[run]}] and [{i}] are the same run "
          f"({settings[i]!r}); allowed: members that differ (a seed, the split's seed, the "
          "learning rate, weight decay or warmup)")
    seen[run] = i
    configs.append(member)
  return tuple(configs), names
