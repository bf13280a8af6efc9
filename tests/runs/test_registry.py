"""One record per experiment (`runs/registry.py`): a task added as one record trains.

A toy on-device task is defined here (the task protocol: `splits`, `sample`, `encode`,
`metrics`, `output_dim`), with its config (`get_config` below, so this file is its config
file); registering its `Experiment` record, which names the class, is the only other step:
the objective is built from the task (`objectives.on_device`). It then trains through the
entry point's dispatch (`runtime.train_experiment`), and every question the code asks
about an experiment (population support, host memory, probe setting) is answered from the
record. A scan of the library and entry points checks that
no module keeps a table keyed by experiment names beside the registry.
"""

import ast
import dataclasses
import importlib.util
import json
import os
import re

import jax
import jax.numpy as jnp
import ml_collections
import pytest

from hypernet_attention import errors
from hypernet_attention.probing import extract
from hypernet_attention.runs import config_checks
from hypernet_attention.runs import config_common
from hypernet_attention.runs import registry
from hypernet_attention.train import objectives
from hypernet_attention.train import runtime

import train_testlib as tl

TOY = "toy_mean"


class ToyMean:
  """Predict the mean of the first coordinate of `length` Gaussian tokens (on device)."""
  splits = ("train", "test")
  output_dim = 1

  def __init__(self, length: int = 4, seed: int = 0):
    self.length, self.seed = length, seed

  def sample(self, key, batch_size, split, tables=None):
    del tables
    key = jax.random.fold_in(key, self.splits.index(split))
    x_BTD = jax.random.normal(key, (batch_size, self.length, 2))
    return {"x": x_BTD, "y": x_BTD[:, :, 0].mean(-1)}

  def encode(self, batch):
    return batch["x"], batch["y"]

  def metrics(self, outputs_BT1, batch):
    return {"loss": jnp.square(outputs_BT1[:, -1, 0] - batch["y"])}


def get_config(arg=None) -> ml_collections.ConfigDict:
  """The toy's config file (`size=smoke` only): one small layer, the smoke schedule."""
  config_common.parse_arg(arg, {"size": ("smoke",)}, model="hyla", size="smoke")
  c = config_common.base_config(experiment=TOY)
  c.task = ml_collections.ConfigDict(dict(length=4))
  c.model = config_common.model_config("hyla", num_layers=1, emb_dim=16, num_heads=2, qk_dim=8,
                                    v_dim=8, mlp_dim=32)
  config_common.use_smoke_schedule(c)
  c.num_train_steps = c.steps_per_loop  # One chunk, one evaluation.
  c.eval.splits = ("test",)
  return c


RECORD = registry.Experiment(TOY, os.path.relpath(__file__, tl.REPO), metric="loss",
                             task=ToyMean)


@pytest.fixture
def toy():
  registry.register(RECORD)
  yield RECORD
  del registry.EXPERIMENTS[TOY]


def test_a_task_added_as_one_record_trains_through_the_entry_point(toy, tmp_path):
  config = toy.get_config("size=smoke")
  summary = runtime.train_experiment(config_checks.validate(config), str(tmp_path / "run"))
  assert summary["step"] == config.num_train_steps
  written = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert written["test/loss"] >= 0.0 and "accuracy" not in str(written)
  assert TOY in registry.names(on_device=True) and TOY not in registry.names(population=True)


def test_a_plain_config_from_a_library_caller_is_validated_before_any_work(toy, tmp_path):
  config = toy.get_config("size=smoke")
  config.num_train_steps = 0
  with pytest.raises(errors.BadInput, match=r"num_train_steps"):
    runtime.train_experiment(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def test_every_question_about_the_toy_is_answered_by_its_record(toy):
  config = toy.get_config("size=smoke")
  config.population.members = ({"seed": 0}, {"seed": 1})
  with pytest.raises(errors.BadInput, match=f"'{TOY}', which trains no population; allowed: "
                     f"populations of {', '.join(registry.names(population=True))}"):
    config_checks.validate(config)
  with pytest.raises(ValueError, match=f"'{TOY}' has no probe setting; allowed: "
                     + re.escape(str(extract.probed_experiments()))):
    extract.make_setting(TOY, None)
  objectives.build(config, budget=0)  # No estimate in the record: nothing to refuse.
  heavy = dataclasses.replace(toy, memory=lambda c: 2**40)
  registry.EXPERIMENTS[TOY] = heavy
  with pytest.raises(errors.BadInput, match="GiB for the task's tables"):
    objectives.build(config, budget=2**30)


def test_a_record_declares_what_its_objective_builds(toy):
  registry.EXPERIMENTS[TOY] = dataclasses.replace(toy, on_device=False)
  with pytest.raises(ValueError, match="data source is on device, its record says "
                     "on_device=False"):
    objectives.build(toy.get_config())
  with pytest.raises(ValueError, match="population=True needs on_device=True"):
    registry.Experiment("x", "x.py", "loss", task=ToyMean, on_device=False, population=True)
  with pytest.raises(ValueError, match=f"experiment '{TOY}' is already registered"):
    registry.register(toy)
  with pytest.raises(ValueError, match="allowed: 'package.module:attribute'"):
    registry.load("no_attribute")


# A task in a tree of its own: the map's three files (experiments/reference.md, "A new task"),
# written out as a contributor would, and nothing else.
TASK_MODULE = """
import jax, jax.numpy as jnp

class ToyCount:
  splits, output_dim = ("train", "test"), 1

  def __init__(self, length=4, seed=0):
    self.length = length

  def sample(self, key, batch_size, split, tables=None):
    x = jax.random.bernoulli(jax.random.fold_in(key, self.splits.index(split)), 0.5,
                             (batch_size, self.length, 1)).astype(jnp.float32)
    return {"x": x, "y": x.sum((1, 2))}

  def encode(self, batch):
    return batch["x"], batch["y"]

  def metrics(self, outputs_BT1, batch):
    return {"loss": jnp.square(outputs_BT1[:, -1, 0] - batch["y"])}
"""
CONFIG_FILE = """
import ml_collections
from hypernet_attention.runs import config_common

def get_config(arg=None):
  config_common.parse_arg(arg, {"size": ("smoke",)}, model="hyla", size="smoke")
  c = config_common.base_config(experiment="toy_count")
  c.task = ml_collections.ConfigDict(dict(length=4))
  c.model = config_common.model_config("hyla", num_layers=1, emb_dim=16, num_heads=2,
                                       qk_dim=8, v_dim=8, mlp_dim=32)
  config_common.use_smoke_schedule(c)
  c.num_train_steps, c.eval.splits = c.steps_per_loop, ("test",)
  return c
"""


def test_a_task_in_three_new_files_trains_through_the_loop(tmp_path, monkeypatch):
  """Its module and config written into a fresh tree, its record registered: the normal
  entry (`train_and_evaluate`, the record's `train`) trains and evaluates it."""
  (tmp_path / "toy_count.py").write_text(TASK_MODULE)
  (tmp_path / "toy_count_config.py").write_text(CONFIG_FILE)
  monkeypatch.syspath_prepend(str(tmp_path))
  record = registry.Experiment("toy_count", str(tmp_path / "toy_count_config.py"), "loss",
                               task="toy_count:ToyCount")
  monkeypatch.setitem(registry.EXPERIMENTS, record.name, record)
  config = registry.get("toy_count").get_config("size=smoke")
  summary = registry.load(record.train)(config, str(tmp_path / "run"))
  assert summary["step"] == config.num_train_steps > 0
  written = json.loads((tmp_path / "run" / "summary.json").read_text())
  assert written["test/loss"] >= 0.0 and written["step"] == config.num_train_steps


# The tests that train every on-device experiment (smoke, resume, compile once) and probe
# every probed one, by file under tests/ and test name: the contributor's map
# (experiments/reference.md) says a new task's record puts it in each.
TRAINED_BY = (
    ("e2e/test_train.py", "test_smoke_writes_all_outputs"),
    ("e2e/test_train.py", "test_interrupted_and_resumed_run_ends_with_identical_parameters"),
    ("e2e/test_compile_once.py", "test_run_and_resume_trace_each_step_function_once"))
PROBED_BY = (("probing/test_probing.py", "test_materialized_path_equals_fast_path"),
             ("probing/test_probing.py", "test_extracted_codes_are_the_hypernetwork_latent_codes"))


def _parametrized_experiments(path: str, test: str) -> list[str]:
  """The `experiment` values `test` of test file `path` is parametrized over, the file
  imported anew, so its parameters are computed from the registry as it is now."""
  spec = importlib.util.spec_from_file_location(
      "_fresh_" + path.replace("/", "_")[:-3], os.path.join(tl.REPO, "tests", path))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  values = []
  for mark in getattr(module, test).pytestmark:
    argnames = mark.args[0] if mark.name == "parametrize" else ""
    names = [n.strip() for n in argnames.split(",")] if isinstance(argnames, str) else argnames
    if "experiment" in names:
      for value in mark.args[1]:
        value = getattr(value, "values", value if len(names) > 1 else (value,))
        values.append(value[names.index("experiment")])
  return values


def test_a_registered_task_is_trained_and_probed_by_the_end_to_end_tests(toy):
  for path, test in TRAINED_BY:
    assert set(_parametrized_experiments(path, test)) == set(registry.names(on_device=True)), (
        f"{path}::{test} does not train every on-device record")
  for path, test in PROBED_BY:
    assert set(_parametrized_experiments(path, test)) == set(extract.probed_experiments()), (
        f"{path}::{test} does not probe every record with a probe setting")
  assert TOY in registry.names(on_device=True) and TOY not in extract.probed_experiments()


def _aliases(paths: list[str], names: set[str]) -> set[str]:
  """Module-level names bound to one experiment's name (`FUZZY = "fuzzy_logic"`)."""
  out = set()
  for path in paths:
    for node in ast.parse(open(path).read(), path).body:
      if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
          and node.value.value in names):
        out |= {t.id for t in node.targets if isinstance(t, ast.Name)}
  return out


def _names_in(node, names: set[str], aliases: set[str]) -> set[str]:
  """The experiments `node` names: a literal, an alias (`cells_lib.FUZZY`), or a tuple key
  holding one (`("cpu", FUZZY)`)."""
  if isinstance(node, ast.Constant) and node.value in names:
    return {node.value}
  if isinstance(node, ast.Name) and node.id in aliases:
    return {node.id}
  if isinstance(node, ast.Attribute) and node.attr in aliases:
    return {node.attr}
  if isinstance(node, ast.Tuple):
    return set().union(*(_names_in(e, names, aliases) for e in node.elts))
  return set()


def _tables(path: str, names: set[str], aliases: set[str]) -> list[str]:
  """`file:line` of every dict literal with an experiment name as (part of) a key, and every
  tuple, list or set literal holding two or more experiment names."""
  found = []
  for node in ast.walk(ast.parse(open(path).read(), path)):
    if isinstance(node, ast.Dict):
      hits = set().union(*(_names_in(k, names, aliases) for k in node.keys if k is not None))
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
      hits = set().union(*(_names_in(e, names, aliases) for e in node.elts
                           if not isinstance(e, ast.Tuple)))
      hits = hits if len(hits) > 1 else set()
    else:
      continue
    if hits:
      found.append(f"{os.path.relpath(path, tl.REPO)}:{node.lineno} {sorted(hits)}")
  return found


def test_no_module_keys_a_table_by_experiment_name():
  """What the record holds is nowhere else: a new task is tasks/<x>.py, configs/<x>.py and
  its record, and `launch/` (sweeps, campaign, plan, report) reads the paper's settings and
  numbers from the record (`registry.Paper`). The campaign's cell list names the experiment
  of each cell, which is its definition, not a table about the experiment."""
  names = set(registry.EXPERIMENTS)
  registry_file = os.path.join(tl.REPO, "hypernet_attention", "runs", "registry.py")
  assert os.path.exists(registry_file)
  exempt = {registry_file, os.path.join(tl.REPO, "launch", "campaign", "cells.py")}
  paths = [os.path.join(root, f) for top in ("hypernet_attention", "experiments", "launch")
           for root, _, files in os.walk(os.path.join(tl.REPO, top))
           for f in sorted(files) if f.endswith(".py")]
  aliases = _aliases(paths, names)
  found = [t for p in paths if p not in exempt for t in _tables(p, names, aliases)]
  assert not found, found
