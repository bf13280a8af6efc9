"""The run layer and the launch layer run where JAX is not installed (a laptop submitting to a
cluster), and the packages import each other in one direction.

Every module of `hypernet_attention.runs` and of `launch/` is imported in a subprocess whose
`import jax` (flax, optax, orbax) fails (`sys.modules[name] = None`); none of them may be
loaded, `launch/` may reach no package of `hypernet_attention` but `runs` (and the
dependency-free `errors` and `presets`), and no file may be loaded under two module names.
The JAX-free file helpers answer "is this run finished" for a single run and a population
there, the launching machine's config check (`runs/preflight.py`, attention preset included)
runs there, and grouping a sweep into populations works with a cap and refuses in one line
without one (its memory estimate builds the model: `launch/grouping.py`). A static walk of
the module-level imports finds no cycle among the project's modules.
"""

import ast
import json
import os
import sys

import train_testlib as tl

BLOCKED = ("jax", "jaxlib", "flax", "optax", "orbax")
PROGRAM = """
import importlib, json, os, pkgutil, sys
for name in %r:
  sys.modules[name] = None  # `import <name>` raises ImportError from here on.
import hypernet_attention.runs
import launch
names = [m.name for m in pkgutil.walk_packages(hypernet_attention.runs.__path__,
                                               "hypernet_attention.runs.")]
names += [m.name for m in pkgutil.walk_packages(launch.__path__, "launch.")]
for name in names:
  importlib.import_module(name)
from hypernet_attention.runs import run_files
files = [os.path.realpath(m.__file__) for m in list(sys.modules.values())
         if getattr(m, "__file__", None)
         and os.path.realpath(m.__file__).startswith(os.getcwd() + os.sep)]
print(json.dumps({
    "imported": names,
    "loaded": sorted(n for n, m in sys.modules.items() if m is not None),
    "twice": sorted({f for f in files if files.count(f) > 1}),
    "finished": [run_files.is_finished(d) for d in sys.argv[1:]]}))
""" % (BLOCKED,)
# The modules of `hypernet_attention` outside `runs` that the run layer may load.
JAX_FREE = ("hypernet_attention", "hypernet_attention.errors", "hypernet_attention.presets")

# Typos in the model's other names, refused as the training host's model refuses them.
TYPOS = {"implementation=blockwize": "implementation 'blockwize'; allowed: auto, reference",
         "feed_forward=swiglo": "feed_forward 'swiglo'; allowed: gelu_mlp, swiglu, moe.",
         "position=alibi": "position 'alibi'; allowed: none, t5, rope."}
CHECKS = """
import contextlib, io, json, sys
for name in %r:
  sys.modules[name] = None
from hypernet_attention import errors
from hypernet_attention.runs import preflight
from launch import jobs
out = {}
for args in (("sraven", "size=smoke"), ("fuzzy_logic", "model=softmax,size=smoke"),
             ("c4_lm", "model=linear,size=smoke"), ("sraven", "model=nope"),
             ("sraven", "size=smoke", "--config.model.attention=nope"),
             *(("sraven", "size=smoke", f"--config.model.{typo}") for typo in %r)):
  stdout, stderr = io.StringIO(), io.StringIO()
  with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
    code = preflight.main([*args[:2], sys.argv[1], *args[2:]])
  out[" ".join(args)] = [code, stdout.getvalue() + stderr.getvalue()]
points = [{"config": "model=hyla,size=smoke", "seed": seed} for seed in range(3)]
out["capped"] = [len(p.get("population.members", ())) for p in jobs.populations(
    points, "sraven", max_members=2)]
try:
  jobs.populations(points, "sraven")
except errors.BadInput as e:
  out["uncapped"] = str(e)
out["loaded"] = sorted(n for n, m in sys.modules.items() if m is not None)
print(json.dumps(out))
""" % (BLOCKED, TYPOS)


def _write(path, data):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(data, f)


def test_runs_and_launch_import_without_jax(tmp_path):
  single, population, unfinished = (str(tmp_path / n) for n in ("single", "pop", "pop2"))
  _write(os.path.join(single, "summary.json"), {"step": 8})
  for root, done in ((population, ("a", "b")), (unfinished, ("a",))):
    _write(os.path.join(root, "population_summary.json"), {"members": ["a", "b"]})
    for name in done:
      _write(os.path.join(root, name, "summary.json"), {"step": 8})
  result = tl.run([sys.executable, "-c", PROGRAM, single, population, unfinished],
                  env=tl.subprocess_env(), capture_output=True, text=True,
                  cwd=tl.REPO)
  assert result.returncode == 0, result.stderr[-3000:]
  out = json.loads(result.stdout.strip().splitlines()[-1])
  expected = {f"launch.{n[:-3]}" for n in os.listdir(os.path.join(tl.REPO, "launch"))
              if n.endswith(".py") and n != "__init__.py"}
  expected |= {f"hypernet_attention.runs.{n[:-3]}"
               for n in os.listdir(os.path.join(tl.REPO, "hypernet_attention", "runs"))
               if n.endswith(".py") and n != "__init__.py"}
  assert expected <= set(out["imported"]), expected - set(out["imported"])
  assert "launch.sweeps.fig4_sraven_scaling" in out["imported"]
  assert not [n for n in out["loaded"] if n.split(".")[0] in BLOCKED]
  ours = [n for n in out["loaded"] if n.split(".")[0] == "hypernet_attention"]
  assert not [n for n in ours if n not in JAX_FREE
              and not n.startswith("hypernet_attention.runs")], ours
  assert out["twice"] == []
  assert out["finished"] == [True, True, False]


def test_preflight_and_grouping_run_without_jax(tmp_path):
  result = tl.run([sys.executable, "-c", CHECKS, str(tmp_path / "run")],
                  env=tl.subprocess_env(), capture_output=True, text=True,
                  cwd=tl.REPO)
  assert result.returncode == 0, result.stderr[-3000:]
  out = json.loads(result.stdout.strip().splitlines()[-1])
  assert out["sraven size=smoke"] == [0, "experiments/sraven_scaling.py "
                                         "experiments/configs/sraven.py\n"]
  assert out["fuzzy_logic model=softmax,size=smoke"][0] == 0
  assert out["c4_lm model=linear,size=smoke"][0] == 0
  for bad in ("sraven model=nope", "sraven size=smoke --config.model.attention=nope"):
    code, printed = out[bad]
    assert code == 2 and "preflight: error:" in printed, (bad, printed)
    assert "unknown attention preset 'nope'; allowed: [" in printed and "'hyla'" in printed
  for typo, message in TYPOS.items():
    code, printed = out[f"sraven size=smoke --config.model.{typo}"]
    assert code == 2 and printed.count("\n") == 1, (typo, printed)
    assert f"preflight: error: Unknown config.model.{message}" in printed, (typo, printed)
  assert out["capped"] == [0, 2]  # Three seeds under a cap of 2: one alone, a population of 2.
  assert "--members_per_job=N" in out["uncapped"] and "JAX" in out["uncapped"]
  assert not [n for n in out["loaded"] if n.split(".")[0] in BLOCKED]
  ours = [n for n in out["loaded"] if n.split(".")[0] == "hypernet_attention"]
  assert not [n for n in ours if n not in JAX_FREE
              and not n.startswith("hypernet_attention.runs")], ours


def _module_imports(path: str, module: str, known: set[str]) -> set[str]:
  """The project modules `module` imports at module level (not inside functions)."""
  tree = ast.parse(open(path).read())
  found = set()
  for node in tree.body:
    if isinstance(node, ast.Import):
      found |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module:
      base = node.module
      if node.level:
        base = ".".join(module.split(".")[:-node.level] + [node.module])
      found |= {base} | {f"{base}.{a.name}" for a in node.names}
  return {n for n in found if n in known and n != module}


def test_no_import_cycle():
  modules = {}
  for top in ("hypernet_attention", "launch"):
    for root, _, names in os.walk(os.path.join(tl.REPO, top)):
      for name in names:
        if name.endswith(".py"):
          rel = os.path.relpath(os.path.join(root, name), tl.REPO)[:-3].replace(os.sep, ".")
          modules[rel.removesuffix(".__init__")] = os.path.join(root, name)
  graph = {m: _module_imports(p, m, set(modules)) for m, p in modules.items()}
  # A package's __init__ importing its own modules is no cycle with their `from pkg import`.
  graph = {m: {d for d in deps if not m.startswith(d + ".")} for m, deps in graph.items()}
  state, path = {}, []

  def visit(m):
    state[m] = "open"
    path.append(m)
    for d in sorted(graph[m]):
      assert state.get(d) != "open", " -> ".join(path[path.index(d):] + [d])
      if d not in state:
        visit(d)
    path.pop()
    state[m] = "done"

  for m in sorted(graph):
    if m not in state:
      visit(m)
  assert graph["hypernet_attention.runs.run_files"]  # The walk sees the package's imports.
