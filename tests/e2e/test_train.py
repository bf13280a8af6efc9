"""End-to-end smoke training, outputs, resume exactness, optimizer and config checks."""

import json
import math
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hypernet_attention.runs import config_checks
from hypernet_attention.runs import registry
from hypernet_attention.runs import run_files
from hypernet_attention.train import build
from hypernet_attention.train import loop
from hypernet_attention.train import restore
from hypernet_attention.train import runtime
from hypernet_attention.train import state as state_lib

import train_testlib as tl

pytestmark = pytest.mark.e2e  # Drives the whole training loop (tests/pytest.ini).


# Every on-device experiment of the registry: the smoke and resume tests train each, so a
# new task's record puts it here (tests/runs/test_registry.py checks that it does).
SYNTHETIC = registry.names(on_device=True)


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory):
  """`smoke_runs(name) -> (workdir, summary)`: one uninterrupted smoke run per experiment
  (8 steps, checkpoints at 4 and 8), trained on first use and shared by tests."""
  done = {}

  def get(experiment):
    if experiment not in done:
      workdir = str(tmp_path_factory.mktemp(experiment) / "wd")
      done[experiment] = workdir, loop.train_and_evaluate(tl.smoke(experiment), workdir)
    return done[experiment]

  return get


@pytest.fixture
def sraven_run(smoke_runs):
  return smoke_runs("sraven")


@pytest.mark.parametrize("experiment", SYNTHETIC)
def test_smoke_writes_all_outputs(smoke_runs, experiment):
  workdir, summary = smoke_runs(experiment)
  files = os.listdir(workdir)
  assert {"config.json", "summary.json", "checkpoints"} <= set(files), files
  assert any(f.startswith("events.out.tfevents") for f in files), files
  assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == ["4", "8"]
  with open(os.path.join(workdir, "config.json")) as f:
    config = json.load(f)
  assert config["experiment"] == experiment
  with open(os.path.join(workdir, "summary.json")) as f:
    written = json.load(f)
  metric = registry.get(experiment).metric
  for key in ["train/loss"] + [f"{split}/{name}" for split in config["eval"]["splits"]
                               for name in ("loss", metric)]:
    assert np.isfinite(written[key]), key
  assert written["step"] == 8 and summary["state"].step == 8


def test_sraven_smoke_reports_ceilings_features_and_every_parameter(sraven_run):
  workdir, _ = sraven_run
  with open(os.path.join(workdir, "summary.json")) as f:
    written = json.load(f)
  expected = {"step", "wall_time_s", "params", "train/loss", "test/loss", "test/accuracy",
              "ood/loss", "ood/accuracy", "test/accuracy_ceiling", "ood/accuracy_ceiling"}
  expected |= {f"{s}/accuracy_feature{k}" for s in ("test", "ood") for k in range(4)}
  assert expected <= set(written), sorted(expected - set(written))
  for split in ("test", "ood"):
    assert 0.0 <= written[f"{split}/accuracy"] <= 1.0
    assert 0.0 < written[f"{split}/accuracy_ceiling"] <= 1.0
  # An independent count of the smoke model (D=32, 2 layers, 4 heads, qk/v 16, MLP 64,
  # 8 one-hot inputs, 8 outputs, 36x4 relative-position table per layer).
  d, qk, mlp, f_in, out, heads, buckets = 32, 16, 64, 8, 8, 4, 36
  layer = (2 * d) + 3 * (d * qk + qk) + (qk * d + d) + heads * buckets + (2 * d) + (
      d * mlp + mlp + mlp * d + d)
  assert written["params"] == (f_in * d + d) + 2 * layer + 2 * d + (d * out + out)


def test_rerunning_a_finished_run_changes_nothing(sraven_run):
  workdir, summary = sraven_run
  before = tl.snapshot(workdir)
  again = loop.train_and_evaluate(tl.smoke("sraven"), workdir)
  assert tl.snapshot(workdir) == before
  assert again["test/accuracy"] == summary["test/accuracy"] and again["step"] == 8


@pytest.mark.parametrize("experiment", SYNTHETIC)
def test_interrupted_and_resumed_run_ends_with_identical_parameters(smoke_runs, experiment,
                                                                    tmp_path):
  _, uninterrupted = smoke_runs(experiment)
  workdir = str(tmp_path / "wd")
  partial = loop.train_and_evaluate(tl.smoke(experiment, stop_after_steps=4), workdir)
  assert partial["step"] == 4
  assert not os.path.exists(os.path.join(workdir, "summary.json"))
  # The same command again (the stop hook is the only difference): resumes from step 4.
  resumed = loop.train_and_evaluate(tl.smoke(experiment), workdir)
  assert resumed["step"] == 8
  a = tl.flat_params(uninterrupted["state"].params)
  b = tl.flat_params(resumed["state"].params)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_run_killed_mid_way_and_rerun_ends_with_identical_parameters(tmp_path):
  """SIGKILL a real training process after its second checkpoint, rerun the same command."""
  overrides = {"num_train_steps": 40, "eval_every_steps": 40, "log_every_steps": 4,
               "eval.ceiling_problems": 0}
  workdir = tmp_path / "killed"
  command = [sys.executable, os.path.join(tl.REPO, "experiments", "sraven_scaling.py"),
             "--config=" + os.path.join(tl.REPO, "experiments/configs/sraven.py") +
             ":model=hyla,size=smoke", f"--workdir={workdir}"]
  command += [f"--config.{k}={v}" for k, v in overrides.items()]
  proc = subprocess.Popen(command, env=tl.subprocess_env(), stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
  ckpt_dir = workdir / "checkpoints"

  def ended_or_saved():
    return proc.poll() is not None or ckpt_dir.exists() and any(
        d.isdigit() and int(d) >= 8 for d in os.listdir(ckpt_dir))

  try:
    tl.wait_until(ended_or_saved, [proc], "the run to checkpoint step 8", poll_s=0.05)
    assert proc.poll() is None, "training finished (or failed) before it could be killed"
  finally:
    proc.kill()
    proc.wait()
  assert not (workdir / "summary.json").exists()
  tl.run(command, env=tl.subprocess_env(), check=True, stdout=subprocess.DEVNULL,
         stderr=subprocess.DEVNULL)
  with open(workdir / "summary.json") as f:
    assert json.load(f)["step"] == 40

  config = tl.smoke("sraven", **overrides)
  reference = loop.train_and_evaluate(config, str(tmp_path / "reference"))
  restored = restore.restore_params(str(workdir))
  assert restored.step == 40
  a, b = tl.flat_params(reference["state"].params), tl.flat_params(restored.params)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_corrupt_latest_checkpoint_falls_back_to_previous(sraven_run, tmp_path):
  source, uninterrupted = sraven_run
  workdir = str(tmp_path / "wd")
  shutil.copytree(source, workdir)
  os.remove(os.path.join(workdir, "summary.json"))
  # A finalized but corrupt step 8, and a partial (never finalized) step 12.
  for root, _, files in os.walk(os.path.join(workdir, "checkpoints", "8", "state")):
    for name in files:
      with open(os.path.join(root, name), "wb") as f:
        f.write(b"garbage")
  os.makedirs(os.path.join(workdir, "checkpoints", "12.orbax-checkpoint-tmp-1", "state"))
  resumed = loop.train_and_evaluate(tl.smoke("sraven"), workdir)
  assert resumed["step"] == 8
  assert os.listdir(os.path.join(workdir, "corrupt_checkpoints"))[0].startswith("8-")
  a = tl.flat_params(uninterrupted["state"].params)
  b = tl.flat_params(resumed["state"].params)
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_foreign_workdir_is_refused_before_any_work(sraven_run, tmp_path):
  workdir = str(tmp_path / "wd")
  shutil.copytree(sraven_run[0], workdir)
  before = tl.snapshot(workdir)
  with pytest.raises(ValueError, match="different experiment.*experiment"):
    loop.train_and_evaluate(tl.smoke("fuzzy_logic"), workdir)
  with pytest.raises(ValueError, match="optimizer.learning_rate"):
    loop.train_and_evaluate(tl.smoke("sraven", **{"optimizer.learning_rate": 0.5}), workdir)
  assert tl.snapshot(workdir) == before
  os.remove(os.path.join(workdir, "config.json"))
  before = tl.snapshot(workdir)
  with pytest.raises(ValueError, match="checkpoints but no config.json"):
    loop.train_and_evaluate(tl.smoke("sraven"), workdir)
  assert tl.snapshot(workdir) == before


def test_nonfinite_loss_stops_with_the_step_in_one_true_line(tmp_path):
  """A learning rate near float32's largest value makes the first update overflow, so the
  loss of step 2 is not finite (a NaN learning rate is refused before any work). The entry
  point says so in one line (was a 39-line FloatingPointError saying "checkpoints up to step
  None are intact"), naming the checkpoints that are on disk."""
  workdir = tmp_path / "wd"
  result = tl.run([sys.executable, os.path.join("experiments", "sraven_scaling.py"),
                   "--config=experiments/configs/sraven.py:model=hyla,size=smoke",
                   f"--workdir={workdir}", "--config.optimizer.learning_rate=3e38",
                   "--config.optimizer.warmup_steps=0", "--config.eval.ceiling_problems=0"],
                  env=tl.subprocess_env(), cwd=tl.REPO, capture_output=True, text=True)
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  (line,) = [l for l in result.stderr.splitlines() if "error:" in l]
  assert line.startswith("sraven_scaling.py: error: non-finite training loss at step 2 "), line
  saved = sorted(int(s) for s in os.listdir(workdir / "checkpoints") if s.isdigit()) if (
      workdir / "checkpoints").is_dir() else []
  assert (f"the checkpoints, up to step {saved[-1]:,}, were saved before it and are intact"
          if saved else "no checkpoint was saved before it") in line, (saved, line)


def test_debug_nans_names_the_step_and_the_line_of_the_first_nan(tmp_path):
  """`--config.debug_nans=true`, which the line above recommends: JAX re-runs the call that
  made the NaN op by op and raises at the op. The run says which op, training step and line
  of this package, in one line (was a RuntimeError "Array has been deleted" after 40 lines:
  the state had been donated to the call JAX re-ran; in a scan the op was only "scan")."""
  workdir = tmp_path / "wd"
  result = tl.run([sys.executable, os.path.join("experiments", "sraven_scaling.py"),
                   "--config=experiments/configs/sraven.py:model=hyla,size=smoke",
                   f"--workdir={workdir}", "--config.optimizer.learning_rate=3e38",
                   "--config.optimizer.warmup_steps=0", "--config.eval.ceiling_problems=0",
                   "--config.debug_nans=true"],
                  env=tl.subprocess_env(), cwd=tl.REPO, capture_output=True, text=True)
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  (line,) = [l for l in result.stderr.splitlines() if "error:" in l]
  match = re.fullmatch(r"sraven_scaling\.py: error: invalid value \(nan\) encountered in (\w+) "
                       r"in training step 2, at (hypernet_attention/[\w/]+\.py):(\d+) \(\w+\); "
                       r"stopped \(.*\)", line)
  assert match, line
  op, path, lineno = match.groups()
  assert op != "scan", line  # The op itself, not the loop of steps around it.
  with open(os.path.join(tl.REPO, path)) as f:
    assert 0 < int(lineno) <= len(f.readlines()), line


def test_learning_rate_schedule_matches_formula():
  config = tl.smoke("sraven", num_train_steps=100, **{
      "optimizer.learning_rate": 2e-3, "optimizer.warmup_steps": 10})
  schedule = state_lib.learning_rate_schedule(config)
  peak, end = 2e-3, 2e-4
  for t in (0, 3, 10, 40, 77, 100):
    if t < 10:
      expected = peak * t / 10
    else:
      expected = end + (peak - end) * 0.5 * (1 + math.cos(math.pi * (t - 10) / 90))
    assert float(schedule(t)) == pytest.approx(expected, rel=1e-5, abs=1e-9), t


def test_weight_decay_skips_one_dimensional_params():
  config = tl.smoke("sraven", num_train_steps=100, **{
      "optimizer.learning_rate": 0.1, "optimizer.warmup_steps": 2,
      "optimizer.weight_decay": 0.5})
  tx = state_lib.make_optimizer(config)
  params = {"kernel": jnp.full((2, 3), 2.0), "bias": jnp.full((3,), 2.0)}
  opt_state = tx.init(params)
  schedule = state_lib.learning_rate_schedule(config)
  expected_kernel = 2.0
  for t in range(3):  # Zero gradients: only decoupled weight decay moves parameters.
    updates, opt_state = tx.update(jax.tree.map(jnp.zeros_like, params), opt_state, params)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
    expected_kernel -= float(schedule(t)) * 0.5 * expected_kernel
  np.testing.assert_allclose(params["kernel"], expected_kernel, rtol=1e-6)
  np.testing.assert_array_equal(params["bias"], 2.0)


def test_gradient_clipping_bounds_the_update():
  config = tl.smoke("sraven", **{"optimizer.grad_clip_norm": 1e-3})
  tx = state_lib.make_optimizer(config)
  params = {"w": jnp.ones((4, 4))}
  state = tx.init(params)
  # Clipped to norm 1e-3 before Adam: the first moment equals (1 - b1) x clipped grad.
  _, state = tx.update({"w": jnp.full((4, 4), 100.0)}, state, params)
  mu = jax.tree.leaves(state[1])[1]
  np.testing.assert_allclose(np.linalg.norm(mu), 0.1 * 1e-3, rtol=1e-5)


@pytest.mark.parametrize("arg, match", [
    ("model=nope", "unknown attention preset 'nope'"),
    ("size=huge", "size='huge' is not allowed"),
    ("foo=1", "unknown config argument 'foo'"),
    ("width=x", "width='x' is not a int"),
])
def test_config_argument_errors(arg, match):
  with pytest.raises(ValueError, match=match):
    tl.sraven_config.get_config(arg)


def test_configs_are_locked_and_paper_sizes_match_the_paper():
  config = tl.sraven_config.get_config("model=softmax,size=paper,width=2,depth=8")
  with pytest.raises(AttributeError):
    config.not_a_field = 1
  assert (config.model.emb_dim, config.model.num_heads, config.model.qk_dim,
          config.model.mlp_dim, config.model.num_layers) == (256, 32, 128, 512, 8)
  assert (config.batch_size, config.num_train_steps) == (128, 156_250)
  count = lambda c: state_lib.count_params(  # noqa: E731
      build.setup(config_checks.validate(c)).abstract_state.params)
  # Exact parameter counts of the authors' models (the paper's appendix; authors' code).
  assert count(tl.sraven_config.get_config("model=hyla,size=paper")) == 402_824
  fuzzy = tl.fuzzy_config.get_config("model=hyla,size=paper")
  with fuzzy.unlocked():
    fuzzy.task.num_examples = 16
  assert count(fuzzy) == 151_009


def test_fresh_workdir_is_timestamped_under_workdirs():
  path = runtime.fresh_workdir("sraven")
  assert re.fullmatch(r"workdirs/sraven_\d{8}_\d{6}", path), path


def test_unknown_model_field_is_a_value_error():
  with pytest.raises(ValueError, match="unknown model config keys.*'nope'"):
    build.transformer_config({"attention": "hyla", "nope": 1})


def test_workdir_guard_ignores_only_resume_free_keys(tmp_path):
  workdir = str(tmp_path)
  run_files.check(workdir, tl.smoke("sraven"))
  run_files.check(workdir, tl.smoke("sraven", stop_after_steps=3,
                                                **{"mesh.data": 1}))
  with pytest.raises(ValueError, match="batch_size: 16 -> 32"):
    run_files.check(workdir, tl.smoke("sraven", batch_size=32))


def test_set_dotted_validates_keys_and_converts_strings():
  config = tl.smoke("sraven")
  config_checks.set_dotted(config, "optimizer.warmup_steps", "7")
  config_checks.set_dotted(config, "optimizer.learning_rate", "3e-4")
  config_checks.set_dotted(config, "async_checkpoints", "false")
  config_checks.set_dotted(config, "model.activation", "gelu")
  assert (config.optimizer.warmup_steps, config.optimizer.learning_rate) == (7, 3e-4)
  assert config.async_checkpoints is False and config.model.activation == "gelu"
  for key in ("optimizer.nope", "nope.learning_rate", "seed.x"):
    with pytest.raises(ValueError, match=f"unknown config key '{key}'"):
      config_checks.set_dotted(config, key, 1)
