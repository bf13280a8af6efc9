"""An install without -e (a wheel) finds the experiment configs through `registry`."""

import json
import os
import shutil
import sys

import train_testlib as tl

PROGRAM = """
import json
from hypernet_attention.runs import registry
config = registry.get("sraven").get_config("model=hyla,size=smoke")
print(json.dumps({"module": registry.__file__, "path": registry.get("sraven").config_path(),
                  "steps": config.num_train_steps}))
"""


_NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv*", ".ci-logs", ".*_cache", "workdirs", "build", "*.egg-info", "__pycache__",
    "results")


def _not_source(directory, names):
  """Names under `directory` the copy leaves out: build output, caches and any virtualenv.

  A checkout can hold several virtualenvs (CI makes three, several GiB each) under names
  of its own choosing, so a directory holding `pyvenv.cfg` is left out whatever its name.
  """
  venvs = {n for n in names if os.path.isfile(os.path.join(directory, n, "pyvenv.cfg"))}
  return set(_NOT_SOURCE(directory, names)) | venvs


def test_wheel_install_finds_configs(tmp_path):
  wheels, target, source = tmp_path / "wheels", tmp_path / "site", tmp_path / "source"
  # A copy, so that the build's build/ and *.egg-info stay out of the checkout.
  shutil.copytree(tl.REPO, source, ignore=_not_source)
  copied = sum(f.stat().st_size for f in source.rglob("*") if f.is_file())
  assert copied < 64 * 2**20, f"source copy: {copied / 2**20:.0f} MiB; a venv or output got in"
  tl.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
          "-q", "-w", str(wheels), str(source)], check=True, capture_output=True)
  (wheel,) = os.listdir(wheels)
  tl.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
          str(target), str(wheels / wheel)], check=True, capture_output=True)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env["PYTHONPATH"] = str(target)
  result = tl.run([sys.executable, "-c", PROGRAM], env=env, cwd=tmp_path,
                  capture_output=True, text=True)
  assert result.returncode == 0, result.stderr[-3000:]
  out = json.loads(result.stdout.strip().splitlines()[-1])
  assert out["module"].startswith(str(target)), out  # Not the checkout's copy.
  assert out["path"] == str(target / "hypernet_attention" / "configs" / "sraven.py"), out
  assert out["steps"] == 8  # `size=smoke`.
