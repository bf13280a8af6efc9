"""The launch layer runs where JAX is not installed (a laptop submitting to a cluster).

Every module of `launch/` (and the launching machine's config check) is imported in a
subprocess whose `import jax` fails (`sys.modules["jax"] = None`), and the JAX-free file
helpers answer "is this run finished" for a single run and a population there.
"""

import json
import os
import subprocess
import sys

import train_testlib as tl

PROGRAM = """
import importlib, json, pkgutil, sys
sys.modules["jax"] = None  # `import jax` raises ImportError from here on.
import launch
names = ["hypernet_attention.train.check_config", "hypernet_attention.train.run_files"]
names += [m.name for m in pkgutil.walk_packages(launch.__path__, "launch.")]
for name in names:
  importlib.import_module(name)
from hypernet_attention.train import run_files
print(json.dumps({"imported": names,
                  "finished": [run_files.is_finished(d) for d in sys.argv[1:]]}))
"""


def _write(path, data):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(data, f)


def test_every_launch_module_imports_without_jax(tmp_path):
  single, population, unfinished = (str(tmp_path / n) for n in ("single", "pop", "pop2"))
  _write(os.path.join(single, "summary.json"), {"step": 8})
  for root, done in ((population, ("a", "b")), (unfinished, ("a",))):
    _write(os.path.join(root, "population_summary.json"), {"members": ["a", "b"]})
    for name in done:
      _write(os.path.join(root, name, "summary.json"), {"step": 8})
  result = subprocess.run([sys.executable, "-c", PROGRAM, single, population, unfinished],
                          env=tl.subprocess_env(), capture_output=True, text=True,
                          cwd=tl.REPO, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  out = json.loads(result.stdout.strip().splitlines()[-1])
  expected = {f"launch.{n[:-3]}" for n in os.listdir(os.path.join(tl.REPO, "launch"))
              if n.endswith(".py") and n != "__init__.py"}
  assert expected <= set(out["imported"]), expected - set(out["imported"])
  assert "launch.sweeps.fig4_sraven_scaling" in out["imported"]
  assert out["finished"] == [True, True, False]
