"""Subprocess side of tests/e2e/test_distributed.py (fake CPU devices must be set before jax).

  python tests/e2e/train_helper.py devices OUT_DIR
      4 fake devices: loss curves on 1 device, data-parallel 4 and fsdp 4; a run saved on 4
      devices resumed on 1; a batch that does not divide 4 devices. Writes OUT_DIR/result.json.
  python tests/e2e/train_helper.py process PORT PROCESS_ID WORKDIR OUT_DIR
      One of 2 processes (2 fake devices each, gloo collectives): trains the smoke SRAVEN
      config into the shared WORKDIR; process 0 writes OUT_DIR/params.npz. SIGUSR1 prints
      every thread's stack to the log (`train_testlib.reap` sends it to a process still
      running when its peer has failed).
"""

import faulthandler
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

# pylint: disable=g-import-not-at-top,wrong-import-position
import jax

# jax's own options, before anything initializes a backend.
jax.config.update("jax_platforms", "cpu")
jax.config.update("jax_num_cpu_devices", 4 if sys.argv[1] == "devices" else 2)
import numpy as np

from experiments.configs import sraven
from hypernet_attention.runs import config_checks
from hypernet_attention.train import build
from hypernet_attention.train import loop
from hypernet_attention.train import runtime
from hypernet_attention.train import trainer as trainer_lib

# pylint: enable=g-import-not-at-top,wrong-import-position

NUM_STEPS = 8
PEER_SKEW_S = 35


def smoke_config(**mesh):
  config = sraven.get_config("model=hyla,size=smoke")
  with config.unlocked():
    config.eval.ceiling_problems = 0
    config.mesh.update(mesh)
  return config


def loss_curve(config, devices):
  """Per-step training losses of `NUM_STEPS` steps from a fresh init on `devices`, in the
  loop's own chunks (`steps_per_loop`): on 1 device and on the 2x2 mesh these are the
  programs the runs below compile, so each is compiled once (the compilation cache)."""
  s = build.setup(config_checks.validate(config), devices)
  state = build.init_state(config, s.init_fn, s.shardings)
  trainer = trainer_lib.Trainer(config, s)
  losses = []
  assert NUM_STEPS % config.steps_per_loop == 0, "the curve would drop the last steps"
  for _ in range(NUM_STEPS // config.steps_per_loop):
    state, metrics = trainer.train_chunk(state, config.steps_per_loop)
    losses += [float(x) for x in jax.device_get(metrics.per_step["loss"])]
  return losses


def flat_params(params):
  return {jax.tree_util.keystr(p): np.asarray(jax.device_get(x))
          for p, x in jax.tree_util.tree_leaves_with_path(params)}


def devices_mode(out_dir):
  devices = jax.devices()
  assert len(devices) == 4, devices
  result = {
      "one": loss_curve(smoke_config(), devices[:1]),
      "data4": loss_curve(smoke_config(data=4, fsdp=1), devices),
      "fsdp4": loss_curve(smoke_config(data=1, fsdp=4), devices),
      "data2_fsdp2": loss_curve(smoke_config(data=2, fsdp=2), devices),
  }
  # Saved on 4 devices (fsdp, so params are really split), resumed on 1.
  workdir = os.path.join(out_dir, "wd_4to1")
  config = smoke_config(data=2, fsdp=2)
  with config.unlocked():
    config.stop_after_steps = 4
  loop.train_and_evaluate(config, workdir, devices=devices)
  with config.unlocked():
    config.stop_after_steps = None
    config.mesh.update(data=1, fsdp=1)
  resumed = loop.train_and_evaluate(config, workdir, devices=devices[:1])
  reference = loop.train_and_evaluate(smoke_config(data=1, fsdp=1),
                                      os.path.join(out_dir, "wd_1"), devices=devices[:1])
  a, b = flat_params(resumed["state"].params), flat_params(reference["state"].params)
  result["resume_4to1_max_abs_diff"] = max(float(np.abs(a[k] - b[k]).max()) for k in a)
  result["resume_4to1_step"] = int(resumed["step"])
  # A batch that does not divide 4 devices: error before the workdir exists.
  config = smoke_config()
  with config.unlocked():
    config.batch_size = 6
  bad_dir = os.path.join(out_dir, "wd_bad")
  try:
    loop.train_and_evaluate(config, bad_dir)
    result["bad_batch_error"] = None
  except ValueError as e:
    result["bad_batch_error"] = str(e)
  result["bad_batch_workdir_exists"] = os.path.exists(bad_dir)
  with open(os.path.join(out_dir, "result.json"), "w") as f:
    json.dump(result, f)


def process_mode(port, process_id, workdir, out_dir):
  faulthandler.register(signal.SIGUSR1, all_threads=True)
  runtime.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                     process_id=process_id, cpu_collectives="gloo")
  assert jax.process_count() == 2 and jax.device_count() == 4, runtime.log_topology()
  if process_id == 1:
    # Peers a while apart, as on a loaded machine: beyond Gloo's fixed 30 s wait for a
    # peer's key at its set-up (multihost.sync's key-value barrier lets the run go on).
    time.sleep(PEER_SKEW_S)
  summary = loop.train_and_evaluate(smoke_config(), workdir)
  if process_id == 0:
    np.savez(os.path.join(out_dir, "params.npz"), **flat_params(summary["state"].params))
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
      json.dump({k: v for k, v in summary.items() if k != "state"}, f)
  jax.distributed.shutdown()


if __name__ == "__main__":
  if sys.argv[1] == "devices":
    devices_mode(sys.argv[2])
  else:
    process_mode(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
