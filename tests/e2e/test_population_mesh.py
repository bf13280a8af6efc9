"""A population's member axis as a mesh axis: 4 fake CPU devices against 1 device.

Fake devices must be configured before jax starts, so this runs
`population_helper.py` (beside this file) in a subprocess, waited for while it progresses.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import train_testlib as tl

pytestmark = pytest.mark.e2e  # Drives the whole training loop (tests/pytest.ini).

HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "population_helper.py")


def test_members_over_four_devices_match_one_device(tmp_path):
  log = open(tmp_path / "log.txt", "w")
  proc = subprocess.Popen([sys.executable, HELPER, str(tmp_path)], env=tl.subprocess_env(),
                          stdout=log, stderr=subprocess.STDOUT, cwd=tl.REPO)
  [text] = tl.reap([(proc, log)], "the population on fake devices")
  assert proc.returncode == 0, text[-4000:]
  with open(tmp_path / "result.json") as f:
    result = json.load(f)
  one = np.array(result["one"])
  assert one.shape == (4, 8) and np.all(np.isfinite(one))
  assert np.abs(one[0] - one[2]).max() > 1e-3  # Members differ (seed, learning rate).
  # Members spread over devices: each device holds its own members, nothing is exchanged.
  assert result["member4_param_spec"].startswith("P('member'")
  assert result["member4_collectives"] == []
  # Reordered float32 reductions only (measured: losses 4.8e-7 abs, params 7e-6 rel).
  for mesh in ("member4", "member2_data2"):
    np.testing.assert_allclose(result[mesh], one, rtol=2e-5, err_msg=mesh)
    assert result[f"{mesh}_params_rel"] < 1e-4, mesh
