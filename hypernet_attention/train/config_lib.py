"""Helpers for `experiments/configs/*.py`: parse `get_config(arg)` strings, build models.

`get_config("model=hyla,size=local")` style arguments follow big_vision: comma-separated
`key=value` pairs with defaults; an unknown key or value is a `ValueError` that lists what
is allowed, raised before anything runs.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Mapping, Optional, Sequence

import ml_collections

from hypernet_attention.errors import BadInput  # pylint: disable=unused-import  (re-exported)


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
)


def _get(config: ml_collections.ConfigDict, key: str) -> Any:
  """`config.<dotted key>`, or None where a part of the path is absent."""
  node = config
  for name in key.split("."):
    node = node.get(name) if isinstance(node, ml_collections.ConfigDict) else None
  return node


def _is_int(value: Any) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def check_positive(config: ml_collections.ConfigDict) -> None:
  """Raises `BadInput` naming the first of `POSITIVE_FIELDS` that is not a positive int."""
  for key in POSITIVE_FIELDS:
    value = _get(config, key)
    if value is not None and (not _is_int(value) or value <= 0):
      raise BadInput(f"config.{key}={value!r} must be a positive integer")


def _interval(low: float, high: float, low_in: bool, high_in: bool) -> str:
  if high == math.inf:
    return f"a finite number {'>=' if low_in else '>'} {low:g}"
  return f"a number in {'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"


def check_ranges(config: ml_collections.ConfigDict) -> None:
  """Raises `BadInput` naming the first of `RANGES` that is not a finite number in range."""
  for key, low, high, low_in, high_in in RANGES:
    value = _get(config, key)
    if value is None:
      continue
    ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
          and math.isfinite(value) and (low <= value if low_in else low < value)
          and (value <= high if high_in else value < high))
    if not ok:
      raise BadInput(f"config.{key}={value!r}; allowed: "
                     f"{_interval(low, high, low_in, high_in)}")


def check_run(config: ml_collections.ConfigDict) -> None:
  """The run-level fields no single module owns: seed, schedule, stop step, eval, dtypes."""
  seed = config.get("seed")
  if not _is_int(seed) or not 0 <= seed < 2**32:
    raise BadInput(f"config.seed={seed!r}; allowed: an integer in [0, 2**32)")
  warmup, steps = _get(config, "optimizer.warmup_steps"), config.num_train_steps
  if warmup is not None and (not _is_int(warmup) or not 0 <= warmup < steps):
    raise BadInput(f"config.optimizer.warmup_steps={warmup!r}; allowed: an integer in "
                   f"[0, config.num_train_steps={steps})")
  split_seed = _get(config, "task.split_seed")
  if split_seed is not None and (not _is_int(split_seed) or not 0 <= split_seed < 2**32):
    raise BadInput(f"config.task.split_seed={split_seed!r}; allowed: None (the run's seed) "
                   "or an integer in [0, 2**32)")
  stop = config.get("stop_after_steps")
  if stop is not None and (not _is_int(stop) or stop <= 0):
    raise BadInput(f"config.stop_after_steps={stop!r}; allowed: None (no stop) or a positive "
                   "integer")
  splits = _get(config, "eval.splits")
  if splits is not None and (isinstance(splits, str) or not tuple(splits)):
    raise BadInput(f"config.eval.splits={splits!r}; allowed: a non-empty list of split names")
  ceiling = _get(config, "eval.ceiling_problems")
  if ceiling is not None and (not _is_int(ceiling) or ceiling < 0):
    raise BadInput(f"config.eval.ceiling_problems={ceiling!r}; allowed: an integer >= 0 "
                   "(0: no ceilings)")
  for key in ("model.dtype", "model.param_dtype"):
    value = _get(config, key)
    if value is not None and str(value) not in DTYPES:
      raise BadInput(f"config.{key}={value!r}; allowed: {', '.join(DTYPES)}")


def validate(config: ml_collections.ConfigDict) -> None:
  """Every config value whose type, range or finiteness the config alone decides, for the
  run and for each population member (`check_population`).

  Raises `BadInput` naming the first bad key, its value and what is allowed. Task and
  device checks (sizes against memory, the mesh) follow in `build.setup`.
  """
  check_positive(config)
  check_ranges(config)
  check_run(config)
  check_population(config)


# Settings a population member may set (`population.py`): each is data (a key, a table, a
# traced scalar), not code.
MEMBER_KEYS = ("seed", "task.split_seed", "optimizer.learning_rate",
               "optimizer.weight_decay", "optimizer.warmup_steps")
# What a population's workdir holds itself (`population_loop.py`, `lock.py`,
# `launch/run_local.py`): a member directory of one of these names would overwrite it.
RESERVED_NAMES = ("checkpoints", "corrupt_checkpoints", "config.json", "summary.json",
                  "population_summary.json", "lock.json", "accuracy_ceilings.json",
                  "run_local.json")
EVENTS_PREFIX = "events.out.tfevents"  # TensorBoard's event files.
# Experiments whose data are sampled on device, which a population needs (`population.py`);
# refused here, before a language model's vocabulary or data are touched.
POPULATION_EXPERIMENTS = ("sraven", "fuzzy_logic")


def _member_settings(config: ml_collections.ConfigDict) -> tuple[Any, ...]:
  """`config.population.members` as a tuple of mappings; `BadInput` for any other shape
  (a dict where the tuple goes: `({'seed': 1})` lacks its trailing comma)."""
  value = _get(config, "population.members")
  if value is None:
    return ()
  if not _is_sequence(value):
    raise BadInput(f"config.population.members={_plain(value)!r}; allowed: a tuple of dicts, one per "
                   "member (one member needs a trailing comma: ({'seed': 1},))")
  for i, member in enumerate(value):
    if not isinstance(member, (Mapping, ml_collections.ConfigDict)):
      raise BadInput(f"config.population.members[{i}]={member!r}; allowed: a dict of "
                     f"{list(MEMBER_KEYS)} (one member needs a trailing comma: "
                     "({'seed': 1},))")
    for key, setting in dict(member).items():
      if key not in MEMBER_KEYS:
        raise BadInput(
            f"config.population.members[{i}] sets {key!r}, which changes shapes or code; "
            f"members may differ only in {list(MEMBER_KEYS)} (run other keys as separate "
            "populations)")
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
  names = _get(config, "population.member_names") or ()
  if not _is_sequence(names):
    raise BadInput(f"config.population.member_names={_plain(names)!r}; allowed: a tuple of "
                   "directory names, one per member")
  if names and not size:
    raise BadInput(f"config.population.member_names={list(names)!r} but "
                   "config.population.members is empty; allowed: names only with members "
                   "(a single run takes no names)")
  names = tuple(names) or tuple(f"member{i}" for i in range(size))
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


def check_population(config: ml_collections.ConfigDict) -> list[ml_collections.ConfigDict]:
  """Checks every member of `config.population` as the single run it is, before any work,
  and returns their configs (empty for a single run).

  `BadInput` on the first problem: members that are not a tuple of dicts, a member key
  that is not batchable, bad member names, a member value a single run would refuse
  (prefixed by `config.population.members[i]`), two members that are the same run.
  """
  settings = _member_settings(config)
  if settings and config.get("experiment") not in POPULATION_EXPERIMENTS:
    raise BadInput(f"config.population.members set for experiment "
                   f"{config.get('experiment')!r}, which reads host-side data; allowed: "
                   f"populations of {', '.join(POPULATION_EXPERIMENTS)} (on-device tasks)")
  check_member_names(config, len(settings))
  configs, seen = [], {}
  for i in range(len(settings)):
    member = member_config(config, i)
    try:
      validate(member)
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
  return configs


# A bucket path: gs://<bucket>/<object path>, with GCS's bucket naming rules (lowercase
# letters, digits, '-', '_', '.'; starting and ending with a letter or digit) and no empty,
# '.' or '..' part (an object store keeps them literally: `gs://b/x/../y` is no `gs://b/y`).
BUCKET_PATH = re.compile(r"gs://[a-z0-9]([a-z0-9._-]{0,220}[a-z0-9])?(/[^/]+)*/?")
SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def check_bucket_path(path: str, flag: str = "--workdir") -> str:
  """`path` if it is a local path or a well-formed gs:// path; `BadInput` for a malformed
  bucket path (`gs://`, `gs:///x`, `gs:/b/x`, `GS://b/x`, `s3://...`), which would
  otherwise name an odd bucket or a local folder called `gs:`."""
  text = str(path)
  looks_remote = "://" in text or (SCHEME.match(text.strip()) is not None
                                    and text.strip()[:3].lower() == "gs:")
  if not looks_remote:
    return text
  parts = text[5:].split("/")
  if not BUCKET_PATH.fullmatch(text) or any(p in (".", "..") for p in parts[1:]):
    raise BadInput(f"{flag}={text!r} is not a valid bucket path; allowed: gs://<bucket>/<path> "
                   "(lowercase gs://, a bucket of lowercase letters, digits, '-', '_' or "
                   "'.', no empty, '.' or '..' parts), or a local path")
  return text


def workdir_path(workdir: Optional[str]) -> str:
  """`--workdir` as the run will use it: `~` expanded; empty, blank or a malformed gs://
  path refused."""
  if workdir is None or not str(workdir).strip():
    raise BadInput(f"--workdir={workdir!r}; allowed: a directory path (new, or holding this "
                   "run); leave the flag out for a fresh one under ./workdirs/")
  return os.path.expanduser(check_bucket_path(str(workdir)))


def output_path(path: Optional[str], flag: str, *, overwrite: bool = False) -> str:
  """An output file's path (`~` expanded); refused if missing, or existing without
  `--overwrite` (a tool never replaces a file silently)."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  if path is None or not str(path).strip():
    raise BadInput(f"{flag}={path!r}; allowed: the path of the file to write")
  path = os.path.expanduser(str(path))
  target = epath.Path(path)
  if target.is_dir():
    raise BadInput(f"{flag}={path!r} is a directory; allowed: a file path")
  if target.exists() and not overwrite:
    raise BadInput(f"{flag}={path!r} exists; allowed: a new path, or --overwrite to replace it")
  return path


def parse_arg(arg: Optional[str], allowed: Mapping[str, Sequence[Any]] | None = None,
              **defaults: Any) -> ml_collections.ConfigDict:
  """Parses `"k1=v1,k2=v2"` into a ConfigDict, typed like `defaults`.

  Args:
    arg: the string after the colon in `--config=path.py:arg` (None or '' for defaults).
    allowed: optional `key -> allowed values`; other values raise.
    **defaults: every accepted key with its default (the type of the default is used
      to convert the string).
  """
  result = dict(defaults)
  for item in (arg or "").split(","):
    item = item.strip()
    if not item:
      continue
    if "=" not in item:
      raise ValueError(f"config argument {item!r} is not key=value; keys: {sorted(defaults)}")
    key, value = (s.strip() for s in item.split("=", 1))
    if key not in defaults:
      raise ValueError(f"unknown config argument {key!r}; allowed: {sorted(defaults)}")
    kind = type(defaults[key])
    try:
      result[key] = value if kind is str else kind(value)
    except ValueError as e:
      raise ValueError(f"config argument {key}={value!r} is not a {kind.__name__}") from e
  for key, values in (allowed or {}).items():
    if result[key] not in values:
      raise ValueError(
          f"config argument {key}={result[key]!r} is not allowed; choose from {list(values)}")
  return ml_collections.ConfigDict(result)


def set_dotted(config: ml_collections.ConfigDict, key: str, value: Any) -> None:
  """`config.<key> = value` for a dotted `key` (e.g. 'model.activation'), as
  `--config.<key>=` would set it: an unknown key is a ValueError, never a new field, and
  a string given for a number or bool field is converted to that field's type."""
  *parents, leaf = key.split(".")
  node = config
  for name in parents + [leaf]:
    if not isinstance(node, ml_collections.ConfigDict) or name not in node:
      raise ValueError(f"unknown config key {key!r}")
    parent, node = node, node[name]
  if isinstance(value, str) and isinstance(node, (bool, int, float)):
    value = (value.lower() in ("1", "true")) if isinstance(node, bool) else type(node)(value)
  parent[leaf] = value


def check_preset(name: str) -> str:
  """Raises unless `name` is an attention preset of `hypernet_attention.attention`."""
  from hypernet_attention import attention  # pylint: disable=g-import-not-at-top
  if name not in attention.PRESETS:
    raise ValueError(f"unknown attention preset {name!r}; allowed: {sorted(attention.PRESETS)}")
  return name


def transformer_config(model: Mapping[str, Any], **overrides: Any):
  """`config.model` (+ task-derived fields) -> `transformer.TransformerConfig`."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from hypernet_attention import transformer  # pylint: disable=g-import-not-at-top
  fields = {f.name for f in dataclasses.fields(transformer.TransformerConfig)}
  kwargs = dict(model)
  kwargs.update(overrides)
  unknown = sorted(set(kwargs) - fields)
  if unknown:
    raise ValueError(f"unknown model config keys {unknown}; allowed: {sorted(fields)}")
  for key in ("dtype", "param_dtype"):
    if isinstance(kwargs.get(key), str):
      kwargs[key] = jnp.dtype(kwargs[key])
  check_preset(kwargs["attention"])
  return transformer.TransformerConfig(**kwargs)


def model_config(attention: str, **sizes: Any) -> ml_collections.ConfigDict:
  """`config.model` of the synthetic tasks: the paper's fixed choices, plus `sizes`.

  Fixed as in the authors' code (the paper's appendix): GeLU MLP, T5 relative bias with
  `bidirectional=False`, non-causal, dropout 0.1 on the latent code, float32.
  """
  check_preset(attention)
  model = ml_collections.ConfigDict(dict(
      attention=attention, feed_forward="gelu_mlp", position="t5", bidirectional=False,
      causal=False, attention_dropout=0.1, dtype="float32", implementation="auto",
      # Overrides the preset's value-network activation (the rebuttal's phi sweep).
      activation=ml_collections.config_dict.placeholder(str),
      num_experts=5, top_k=2))  # Used only with feed_forward="moe" (Table A1's MoE rows).
  model.update(sizes)
  return model


def follow_run_seed() -> ml_collections.FieldReference:
  """The default of `task.split_seed`: None, meaning "the run's `seed`".

  The paper re-draws the held-out split with each run's seed (the authors' SRAVEN held-out
  sets for seeds 0 and 1 share 13 of 82 combinations), so its error bars over seeds include
  split variance; None does the same. An int fixes the split across seeds (then the spread
  over seeds is initialization and data order only). `objectives.split_seed` resolves it.
  """
  return ml_collections.config_dict.placeholder(int)


def use_smoke_schedule(c: ml_collections.ConfigDict) -> None:
  """The loop settings every `size=smoke` config shares: 8 steps at batch 16, logged,
  evaluated and checkpointed every 4, on 32 eval problems. Seconds on a CPU; tests use it."""
  c.batch_size = 16
  c.num_train_steps = 8
  c.steps_per_loop = 4
  c.log_every_steps = 4
  c.eval_every_steps = c.checkpoint_every_steps = 4
  c.optimizer.update(warmup_steps=2)
  c.eval.update(num_problems=32, batch_size=16)


def base_config(*, experiment: str, seed: int = 0) -> ml_collections.ConfigDict:
  """Fields every experiment config has; the experiment file fills in the values."""
  c = ml_collections.ConfigDict()
  c.experiment = experiment
  c.seed = seed  # Initialization, training data order and dropout.
  c.task = ml_collections.ConfigDict()
  c.model = ml_collections.ConfigDict()
  c.batch_size = 128
  c.num_train_steps = 1000
  # Optimizer steps per host call (one jitted lax.scan); intervals below need not divide it.
  c.steps_per_loop = 50
  c.log_every_steps = 500
  c.eval_every_steps = 5000
  c.checkpoint_every_steps = 5000
  c.keep_checkpoints = 3
  c.async_checkpoints = True
  # Test hook: stop this invocation at this step (as if killed); rerun to resume.
  c.stop_after_steps = ml_collections.config_dict.placeholder(int)
  # jax_debug_nans for this run: stop at the first op that makes a NaN (slow; for hunting).
  c.debug_nans = False
  c.optimizer = ml_collections.ConfigDict(dict(
      learning_rate=1e-3, warmup_steps=1000, end_lr_fraction=0.1, weight_decay=0.1,
      b1=0.9, b2=0.999, eps=1e-8, grad_clip_norm=0.0,  # 0: no clipping.
      # True: the authors' decay_steps = steps - warmup (floor reached warmup steps early).
      authors_schedule=False))
  # Members trained together as one vmapped program (`train/population.py`): a tuple of
  # dicts over `config_lib.MEMBER_KEYS`; empty = a single run.
  c.population = ml_collections.ConfigDict(dict(members=(), member_names=()))
  c.eval = ml_collections.ConfigDict(dict(
      splits=("test", "ood"), num_problems=51_200, batch_size=1024,
      ceiling_problems=0))  # > 0: estimate each split's accuracy ceiling once per run.
  # Device mesh: `member` x `data` x `fsdp` (-1 = all remaining devices); `member` > 1
  # spreads a population's members over devices.
  c.mesh = ml_collections.ConfigDict(dict(member=1, data=-1, fsdp=1))
  return c
