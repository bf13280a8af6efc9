"""An install without -e (a wheel) finds the experiment configs through `registry`."""

import json
import os
import shutil
import subprocess
import sys

import train_testlib as tl

PROGRAM = """
import json
from hypernet_attention.train import registry
config = registry.get("sraven").get_config("model=hyla,size=smoke")
print(json.dumps({"module": registry.__file__, "path": registry.get("sraven").config_path(),
                  "steps": config.num_train_steps}))
"""


def test_wheel_install_finds_configs(tmp_path):
  wheels, target, source = tmp_path / "wheels", tmp_path / "site", tmp_path / "source"
  # A copy, so that the build's build/ and *.egg-info stay out of the checkout.
  shutil.copytree(tl.REPO, source, ignore=shutil.ignore_patterns(
      ".git", ".venv", "workdirs", "build", "*.egg-info", "__pycache__", "results"))
  subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                  "-q", "-w", str(wheels), str(source)], check=True, timeout=600,
                 capture_output=True)
  (wheel,) = os.listdir(wheels)
  subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                  str(target), str(wheels / wheel)], check=True, timeout=600,
                 capture_output=True)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env["PYTHONPATH"] = str(target)
  result = subprocess.run([sys.executable, "-c", PROGRAM], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  out = json.loads(result.stdout.strip().splitlines()[-1])
  assert out["module"].startswith(str(target)), out  # Not the checkout's copy.
  assert out["path"] == str(target / "hypernet_attention" / "configs" / "sraven.py"), out
  assert out["steps"] == 8  # `size=smoke`.
