"""Distributed training on CPU: 4 fake devices, and 2 processes on 127.0.0.1.

Fake devices must be configured before jax starts, so these run `tests/e2e/train_helper.py`
in subprocesses (the pytest process keeps its single device). Every subprocess is
bounded in time and killed by the test that started it.
"""

import json
import os
import signal
import socket
import subprocess
import sys

import chex
import numpy as np
import pytest

from hypernet_attention.train import loop
from hypernet_attention.train import restore

import train_testlib as tl

pytestmark = pytest.mark.e2e  # Drives the whole training loop (tests/pytest.ini).

HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train_helper.py")


def _run(args, out_dir, name):
  log = open(os.path.join(out_dir, f"log_{name}.txt"), "w")
  env = tl.multiprocess_env() if args[0] == "process" else tl.subprocess_env()
  return subprocess.Popen([sys.executable, HELPER, *map(str, args)], env=env, stdout=log,
                          stderr=subprocess.STDOUT, cwd=tl.REPO), log


def _wait_all(procs, out_dir):
  del out_dir
  texts = tl.reap(procs, "the training processes", stacks_signal=signal.SIGUSR1)
  codes = [proc.returncode for proc, _ in procs]
  if any(codes):
    pytest.fail(f"train_helper.py {procs[0][0].args[2]} exited with {codes}:\n"
                f"{tl.tails(texts, 4000)}")


def test_four_fake_devices_data_parallel_and_fsdp_match_one_device(tmp_path):
  _wait_all([_run(["devices", tmp_path], tmp_path, "devices")], tmp_path)
  with open(tmp_path / "result.json") as f:
    result = json.load(f)
  one = np.array(result["one"])
  assert one.shape == (8,) and np.all(np.isfinite(one))
  for mesh in ("data4", "fsdp4", "data2_fsdp2"):
    np.testing.assert_allclose(result[mesh], one, rtol=2e-5, err_msg=mesh)
  # Saved on a 2x2 (data x fsdp) mesh at step 4, resumed and finished on 1 device.
  assert result["resume_4to1_step"] == 8
  assert result["resume_4to1_max_abs_diff"] < 1e-5
  assert "batch_size=6 is not divisible by the 4 devices" in result["bad_batch_error"]
  assert not result["bad_batch_workdir_exists"]


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  workdir = tmp_path / "wd"
  with tl.multiprocess_slot():
    procs = [_run(["process", port, i, workdir, tmp_path], tmp_path, f"process{i}")
             for i in (0, 1)]
    # The one-process reference meanwhile (process 1 first idles for the peer skew).
    try:
      config = tl.smoke("sraven", **{"eval.ceiling_problems": 0})
      single = loop.train_and_evaluate(config, str(tmp_path / "single"))
    except BaseException:
      for proc, log in procs:
        proc.kill()
        proc.wait()
        log.close()
      raise
    _wait_all(procs, tmp_path)
  with open(tmp_path / "summary.json") as f:
    summary = json.load(f)
  assert (summary["num_processes"], summary["num_devices"], summary["step"]) == (2, 4, 8)
  assert sorted(os.listdir(workdir / "checkpoints")) == ["4", "8"]
  assert len([f for f in os.listdir(workdir) if f.startswith("events")]) == 1  # process 0
  two = dict(np.load(tmp_path / "params.npz"))
  one = tl.flat_params(single["state"].params)
  chex.assert_trees_all_close(two, one, rtol=1e-7, atol=2e-5)  # np.testing's default rtol.

  # The checkpoint the two processes wrote restores, read-only, in this one-device process.
  before = tl.snapshot(str(workdir))
  restored = restore.restore_params(str(workdir))
  assert restored.step == 8 and tl.snapshot(str(workdir)) == before
  chex.assert_trees_all_equal(tl.flat_params(restored.params), two)


def test_entry_point_rejects_unknown_config_key_before_any_work(tmp_path):
  workdir = tmp_path / "wd"
  proc = tl.run(
      [sys.executable, os.path.join(tl.REPO, "experiments", "sraven_scaling.py"),
       "--config=" + os.path.join(tl.REPO, "experiments/configs/sraven.py") + ":size=smoke",
       "--config.not_a_key=1", f"--workdir={workdir}"],
      env=tl.subprocess_env(), capture_output=True, text=True, cwd=tmp_path)
  assert proc.returncode != 0
  assert "not_a_key" in proc.stderr
  assert not workdir.exists()
