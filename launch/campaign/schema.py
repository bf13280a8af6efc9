"""What a cell file and a progress file hold, checked field by field when one is read.

Both are JSON that people commit, merge and may edit by hand, and `--dry_run`, `--report`
and the runner's estimates read them field by field. A file edited into something the
readers cannot use (a string where a number is, members missing, curves as strings, another
experiment than its cell's, a negative wall time that turns an estimate negative) is
refused where it is read, in one line naming the file and the field, never as a TypeError
deep in a table. A field is checked as its readers use it: its type, and its range where
it enters an estimate or a table (wall time, rates, steps, learning rate)."""

from __future__ import annotations

import json
import math
import os
from typing import Any, Callable, Optional

from hypernet_attention import errors
from hypernet_attention.runs import registry
from launch.campaign import cells as cells_lib

Check = Callable[[Any, str], None]  # (value, where) -> None, or raises `_Bad`.


class _Bad(Exception):
  """`where` holds `value` (`_ABSENT`: nothing), and `allowed` is what it may hold."""

  def __init__(self, where: str, value: Any, allowed: str):
    super().__init__(where)
    self.where, self.value, self.allowed = where, value, allowed


_ABSENT = object()


def _shown(value: Any, limit: int = 60) -> str:
  if value is _ABSENT:
    return "missing"
  text = repr(value)
  return text if len(text) <= limit else text[:limit] + "..."


def _or_null(check: Check, optional: bool) -> Check:
  """`check`, and with `optional` None as well."""
  return (lambda value, where: value is None or check(value, where)) if optional else check


def number(low: float = -math.inf, *, positive: bool = False, integer: bool = False,
           optional: bool = False) -> Check:
  """A finite number (an integer if `integer`) >= `low` (> 0 if `positive`); None too if
  `optional`."""
  allowed = ("an integer" if integer else "a finite number") + (
      " > 0" if positive else f" >= {low:g}" if low > -math.inf else "") + (
      " or null" if optional else "")

  def check(value, where):
    if (isinstance(value, bool) or not isinstance(value, int if integer else (int, float))
        or not math.isfinite(value) or value < low or (positive and value <= 0)):
      raise _Bad(where, value, allowed)
  return _or_null(check, optional)


def text(choices: Optional[tuple[str, ...]] = None, optional: bool = False) -> Check:
  allowed = (f"one of {', '.join(choices)}" if choices else "a string") + (
      " or null" if optional else "")

  def check(value, where):
    if not isinstance(value, str) or (choices is not None and value not in choices):
      raise _Bad(where, value, allowed)
  return _or_null(check, optional)


def boolean(value, where):
  if not isinstance(value, bool):
    raise _Bad(where, value, "true or false")


def anything(value, where):
  del value, where


def items(item: Check, min_len: int = 0, length: Optional[int] = None) -> Check:
  """A list of `item`s, of at least `min_len` (or exactly `length`)."""
  allowed = (f"a list of {length}" if length is not None
             else f"a list of at least {min_len}" if min_len else "a list")

  def check(value, where):
    if not isinstance(value, list) or len(value) < min_len or (
        length is not None and len(value) != length):
      raise _Bad(where, value, allowed)
    for i, v in enumerate(value):
      item(v, f"{where}[{i}]")
  return check


def table(value_check: Check, optional: bool = False, nonempty: bool = False) -> Check:
  """An object whose every value passes `value_check` (keys are free: tags, layers)."""
  allowed = ("a non-empty object" if nonempty else "an object") + (" or null" if optional else "")

  def check(value, where):
    if not isinstance(value, dict) or (nonempty and not value):
      raise _Bad(where, value, allowed)
    for k, v in value.items():
      value_check(v, f"{where}[{k!r}]")
  return _or_null(check, optional)


def fields(required: dict[str, Check], optional: Optional[dict[str, Check]] = None,
           nullable: bool = False) -> Check:
  """An object with the `required` fields and, if present, the `optional` ones (others
  are left alone: older and newer writers add fields that no reader reads)."""
  optional = optional or {}

  def check(value, where):
    if not isinstance(value, dict):
      raise _Bad(where, value, "an object")
    for key, field_check in {**required, **optional}.items():
      inner = f"{where}.{key}" if where else key
      if key in value:
        field_check(value[key], inner)
      elif key in required:
        field_check(_ABSENT, inner)  # Says what the field may hold,
        raise _Bad(inner, _ABSENT, "any value")  # or, for `anything`, that it must be there.
  return _or_null(check, nullable)


# A curve: [[step, value], ...]; curves: {tag: curve}.
CURVES = table(items(items(number(), length=2)))
DEVICE = fields({"kind": text()}, {"jax_version": text(), "host_cpu": text(optional=True)})


def _common() -> dict[str, Check]:
  """The fields both files share (the experiments as registered when a file is read)."""
  return {"cell": text(), "stage": text(tuple(cells_lib.STAGES)),
          "experiment": text(tuple(registry.EXPERIMENTS)), "model": text()}


NUMBER_OR_NULL = number(optional=True)


def numbers(value, where):
  """A number or null, or (SRAVEN's score per metric, where fuzzy logic has one) an object."""
  check = table(NUMBER_OR_NULL, nonempty=True) if isinstance(value, dict) else NUMBER_OR_NULL
  try:
    check(value, where)
  except _Bad:
    raise _Bad(where, value, "a number, null or a non-empty object of them") from None


DECODE = fields({}, {"macro_f1": NUMBER_OR_NULL, "chance": table(numbers, optional=True),
                     "scores": fields({}, {"accuracy": NUMBER_OR_NULL}, nullable=True),
                     "p_value": numbers})
TRAIN_MEMBER = fields({
    "name": text(), "frozen_at_step": number(0, integer=True, optional=True),
    "settings": fields({"seed": number(0, integer=True),
                        "optimizer.learning_rate": number(positive=True),
                        "optimizer.weight_decay": number(0),
                        "optimizer.warmup_steps": number(0, integer=True)},
                       {"task.split_seed": number(0, integer=True, optional=True)}),
    "final": table(number()), "curves": CURVES})
PROBE_MEMBER = fields({
    "name": text(), "step": number(0, integer=True), "splits": items(text()),
    "feature_sets": table(fields(
        {"trained": DECODE, "step0": DECODE},
        {"selectivity": fields({}, {"selectivity": NUMBER_OR_NULL}, nullable=True),
         "topographic": table(fields({"rho": NUMBER_OR_NULL, "p_value": NUMBER_OR_NULL},
                                     nullable=True), optional=True),
         "ridge_r2_authors_metric": NUMBER_OR_NULL}))})
BENCHMARK_ROW = fields({"label": text(), "steps_per_s": number(positive=True)},
                       {"tokens_per_s": number(positive=True, optional=True),
                        "mfu": number(0, optional=True), "compile_s": number(0),
                        "batch_size": number(1, integer=True), "synthetic_tokens": boolean})
# A cell file's fields by the cell's kind, on top of the common ones.
BY_KIND = {
    "train": fields({"members": items(TRAIN_MEMBER, min_len=1), "num_steps": number(
        1, integer=True), "member_steps_per_s": number(positive=True, optional=True)},
                    {"scale": number(positive=True), "params": text(optional=True),
                     "member_steps_per_s_training": number(0, optional=True)}),
    "probe": fields({"source": text(), "members": items(PROBE_MEMBER, min_len=1)}),
    "benchmark": fields({"rows": items(BENCHMARK_ROW, min_len=1)})}


_RESTORE = "restore it from git (`git checkout -- <file>`) or delete it"


def cell_file(path: str, schema: int) -> dict[str, Any]:
  """The cell file at `path`, checked (`records.read`)."""
  common = fields({**_common(), "kind": text(cells_lib.KINDS), "device": DEVICE,
                   "jax_version": text(), "commit": text(), "wall_s": number(0),
                   "overrides": table(anything)},
                  {"processes": items(table(anything)), "python": text(), "title": text(),
                   "config": text()})
  return _read(path, "cell file", f"{_RESTORE} to rerun the cell", schema,
               [common, lambda r, where: BY_KIND[r["kind"]](r, where)])  # The kind, once checked.


def progress_file(path: str, schema: int) -> dict[str, Any]:
  """The progress file at `path`, checked (`partial.read`)."""
  return _read(path, "progress file", f"{_RESTORE} (the cell then starts afresh)", schema, [
      fields({**_common(), "step": number(0, integer=True), "num_steps": number(1, integer=True),
              "device": fields({"kind": text(), "jax_version": text()}), "wall_s": number(0),
              "members": items(fields({"name": text(), "curves": CURVES}))},
             {"title": text(), "commit": text()})])


def _read(path: str, label: str, fix: str, schema: int, checks: list[Check]) -> Any:
  """The JSON at `path` once checked: the schema first (a newer writer's file is named as
  that, not as a bad field), then the fields in order, then what the file says against its
  name and its cell's definition."""
  def refuse(message: str):
    raise errors.BadInput(f"{label} {path!r}: {message}; {fix}")

  try:
    with open(path) as f:
      record = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    raise errors.BadInput(f"{label} {path!r} is unreadable ({e}); {fix}") from None
  try:
    fields({"schema": number(integer=True)})(record, "")
    if record["schema"] != schema:
      refuse(f"schema {record['schema']!r}; allowed: {schema}")
    for check in checks:
      check(record, "")
  except _Bad as e:
    refuse(f"field {e.where} is {_shown(e.value)}; allowed: {e.allowed}" if e.where
           else f"holds {_shown(e.value)}; allowed: {e.allowed}")
  expected = os.path.splitext(os.path.basename(path))[0]
  if record["cell"] != expected:
    refuse(f"holds cell {record['cell']!r}; allowed: a file named after its cell "
           f"({record['cell']}.json)")
  problems = _against_the_cell(record)
  if problems:
    refuse(problems[0])
  return record


def _against_the_cell(record: dict[str, Any]) -> list[str]:
  """What a file says that its cell's definition (`cells.py`) does not: kind, stage,
  experiment, model, a progress file's steps, a train cell's member names (a cell no longer
  defined: nothing to check); then the final metrics the report tabulates, per member."""
  out = []
  cell = cells_lib.BY_NAME.get(record["cell"])
  if cell is not None:
    got = {**record, "members.name": [m["name"] for m in record.get("members", [])]}
    wanted = {"kind": cell.kind, "stage": cell.stage, "experiment": cell.experiment,
              "model": cell.model, "num_steps": cell.num_steps,
              "members.name": list(cell.member_names)}
    compared = ["stage", "experiment", "model"] + ["kind"] * ("kind" in record) + (
        ["num_steps", "members.name"] if "step" in record  # A progress file.
        else ["members.name"] if cell.kind == "train" else [])
    out += [f"field {k} is {_shown(got[k])}; allowed: {wanted[k]!r} (cell {cell.name}'s "
            "definition)" for k in compared if got[k] != wanted[k]]
  if "step" in record and record["step"] > record["num_steps"]:
    out.append(f"field step is {record['step']}; allowed: 0 to num_steps ({record['num_steps']})")
  if record.get("kind") == "train":
    experiment = registry.get(record["experiment"])
    splits = experiment.paper.splits if experiment.paper else ()
    keys = [f"{s}/{experiment.metric}" for s in splits]
    out += [f"field members[{i}].final lacks {k!r}; allowed: every member's "
            f"{', '.join(keys)}" for i, m in enumerate(record["members"]) for k in keys
            if k not in m["final"]]
  return out
