"""The launch sweeps: every point names real config keys and valid models; dry run works."""

import collections
import subprocess
import sys

import pytest

import train_testlib as tl

from hypernet_attention.train import config_lib
from hypernet_attention.train import objectives
from launch import sweeps
from launch import xm_launch

CONFIG_MODULES = {"sraven_scaling": tl.sraven_config, "fuzzy_logic": tl.fuzzy_config}
# Sizes of the paper's grids (PAPER.md Sec. 3-5): rows x seeds, and the figure grids.
EXPECTED_JOBS = {"table_a1_sraven": 13 * 3, "table_a1_fuzzy": 13 * 3,
                 "fig2c_fuzzy": 3 * 4 * 3 * 3, "fig4_sraven_scaling": 3 * 3 * 3 * 3 * 3,
                 "activations_sraven": 5 * 3}


def _resolve(experiment, point):
  """The config a job would run: the config argument, then each override (an unknown key
  raises, as `--config.<key>=` would)."""
  point = dict(point)
  config = CONFIG_MODULES[experiment].get_config(point.pop("config"))
  for key, value in point.items():
    config_lib.set_dotted(config, key, value)
  return config


@pytest.mark.parametrize("name", sweeps.SWEEPS)
def test_every_sweep_point_is_a_valid_distinct_config(name):
  sweep = sweeps.load(name)
  points = sweep.get_sweep()
  assert len(points) == EXPECTED_JOBS[name]
  seen = collections.Counter()
  for point in points:
    config = _resolve(sweep.EXPERIMENT, point)
    objectives.build(config)  # Task arguments are valid.
    model = {k: v for k, v in config.model.items() if v is not None}
    config_lib.transformer_config(model, input_kind="dense")  # Presets, widths, MoE.
    seen[config.to_json(sort_keys=True)] += 1
  assert max(seen.values()) == 1, "two jobs of the sweep would run the same config"


def test_job_args_become_config_flags():
  point = {"config": "model=hyla,size=paper", "model.activation": "silu", "seed": 2}
  args = xm_launch.job_args(point, "sraven_scaling", "/tmp/wd")
  assert args == {"config": "experiments/configs/sraven.py:model=hyla,size=paper",
                  "workdir": "/tmp/wd", "config.model.activation": "silu", "config.seed": "2"}


def test_dry_run_prints_one_command_per_job():
  out = subprocess.run(
      [sys.executable, "-m", "launch.xm_launch", "--sweep=table_a1_sraven", "--dry_run"],
      env=tl.subprocess_env(), capture_output=True, text=True, timeout=120, cwd=tl.REPO,
      check=True).stdout.splitlines()
  commands = [line for line in out if line.startswith("python experiments/sraven_scaling.py")]
  assert len(commands) == EXPECTED_JOBS["table_a1_sraven"]
  assert sum("--config.model.feed_forward=moe" in c for c in commands) == 9
  assert out[-1] == f"# {len(commands)} jobs in sweep table_a1_sraven"


def test_unknown_sweep_is_rejected():
  with pytest.raises(ValueError, match="allowed: table_a1_sraven"):
    sweeps.load("table_a2")
