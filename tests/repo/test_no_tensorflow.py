"""Synthetic training, probing and collect run with TensorFlow absent: only the C4 data needs it.

The entry points run in subprocesses whose `import tensorflow` raises as on an accelerator
image without it (a `tensorflow` package earlier on PYTHONPATH that raises
ModuleNotFoundError). With TensorFlow installed, the same modules must not load it either.
And the README's test install, '.[dev]', has none.
"""

import json
import os
import re
import runpy
import subprocess
import sys
from unittest import mock

import numpy as np
import pytest

import train_testlib as tl

BLOCKER = tl.TENSORFLOW_BLOCKER
TRAIN = f"""
import json, sys
sys.path.insert(0, {tl.TESTS!r})
import train_testlib as tl
from hypernet_attention.runs import curves
from hypernet_attention.train import loop
summary = loop.train_and_evaluate(tl.smoke("sraven", **{{"eval.ceiling_problems": 0}}), sys.argv[1])
scalars = curves.read_scalars(sys.argv[1], ["train/loss", "test/accuracy"])
print(json.dumps(dict(
    loaded=sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow"),
    summary_loss=summary["train/loss"], summary_accuracy=summary["test/accuracy"],
    scalars={{k: [s.tolist(), v.tolist()] for k, (s, v) in scalars.items()}})))
"""
# What probing and collect import, and the training loop's modules: none may load TensorFlow
# or CLU's metric writers and periodic actions (which import TensorFlow), even where
# TensorFlow is installed. CLU's metrics (clu.metrics, TensorFlow-free) the loop does load.
IMPORTS = """
import json, sys
from hypernet_attention.train import restore
from hypernet_attention.probing import report
analysis = sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow"
                  or m.startswith(("clu.metric_writers", "clu.periodic_actions")))
from launch import collect
from hypernet_attention.runs import events
from hypernet_attention.train import loop
print(json.dumps(dict(analysis=analysis, all=sorted(
    m for m in sys.modules if m.split(".")[0] == "tensorflow" or m == "clu.metric_writers"),
    clu_metrics="clu.metrics" in sys.modules)))
"""
# The loop's metrics (`train/metrics.py`, CLU's collections) made, merged and computed.
METRICS = """
import json, sys
import jax.numpy as jnp
from hypernet_attention.train import metrics
a = metrics.collect({"loss": jnp.array([1.0, 2.0]), "accuracy": jnp.array([0.0, 1.0])})
b = metrics.collect({"loss": jnp.array([6.0]), "accuracy": jnp.array([1.0])})
print(json.dumps(dict(means=metrics.means(a.merge(b)), loaded=sorted(
    m for m in sys.modules if m.split(".")[0] == "tensorflow"))))
"""


def _env(blocked_dir=None) -> dict:
  env = tl.subprocess_env()
  if blocked_dir is not None:
    env["PYTHONPATH"] = str(blocked_dir) + os.pathsep + env["PYTHONPATH"]
  return env


def _run(args, env):
  proc = tl.run([sys.executable, *args], env=env, capture_output=True, text=True,
                cwd=tl.REPO)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return proc


@pytest.fixture(scope="module")
def no_tf(tmp_path_factory):
  """A PYTHONPATH entry whose `tensorflow` package raises ModuleNotFoundError."""
  root = tmp_path_factory.mktemp("no_tensorflow")
  (root / "tensorflow").mkdir()
  (root / "tensorflow" / "__init__.py").write_text(BLOCKER)
  return root


def test_the_dev_extra_leaves_tensorflow_to_lm():
  """'.[dev]' installs the Grain path's packages, not TensorFlow: the suite runs as a first
  install does, and the seqio tests (marked `lm`) skip there, saying so."""
  with mock.patch("setuptools.setup"):
    extras = runpy.run_path(os.path.join(tl.REPO, "setup.py"))["EXTRAS"]

  def names(extra):
    return {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0] for r in extras[extra]}

  assert {"tensorflow", "tensorflow-text", "seqio"} <= names("lm")
  assert not names("dev") & {"tensorflow", "tensorflow-text", "seqio"}, names("dev")
  assert names("grain") <= names("dev")


def test_the_blocker_hides_tensorflow(no_tf):
  proc = subprocess.run([sys.executable, "-c", "import tensorflow"], env=_env(no_tf),
                        capture_output=True, text=True, cwd=tl.REPO)
  assert proc.returncode != 0 and "hidden by tests/repo/test_no_tensorflow.py" in proc.stderr


def test_probing_and_training_modules_load_neither_tensorflow_nor_clu_writers():
  """With TensorFlow installed: importing them leaves it unloaded."""
  loaded = json.loads(_run(["-c", IMPORTS], _env()).stdout.strip().splitlines()[-1])
  # The loop's metrics are CLU's collections (clu.metrics imports no TensorFlow).
  assert loaded == {"analysis": [], "all": [], "clu_metrics": True}


def test_clu_metrics_work_without_tensorflow(no_tf):
  out = json.loads(_run(["-c", METRICS], _env(no_tf)).stdout.strip().splitlines()[-1])
  assert out == {"means": {"loss": 3.0, "accuracy": pytest.approx(2 / 3)}, "loaded": []}


@pytest.mark.slow
def test_train_probe_collect_without_tensorflow(no_tf, tmp_path):
  root = tmp_path / "sweep"
  workdir = root / "sraven_hyla"
  out = json.loads(_run(["-c", TRAIN, str(workdir)], _env(no_tf)).stdout.splitlines()[-1])
  assert out["loaded"] == []
  # TensorBoard scalars written without TensorFlow, read back by tensorboard's reader.
  steps, losses = out["scalars"]["train/loss"]
  assert steps == [4, 8] and all(0 < v < 10 for v in losses)
  assert losses[-1] == pytest.approx(out["summary_loss"], rel=1e-6)
  assert out["scalars"]["test/accuracy"] == [[4, 8], [pytest.approx(
      out["scalars"]["test/accuracy"][1][0]), pytest.approx(out["summary_accuracy"])]]

  probe = _run([os.path.join("experiments", "probe_latents.py"), f"--workdir={workdir}",
                "--num_problems=96", "--permutations=5"], _env(no_tf))
  assert len(proc_lines := probe.stdout.strip().splitlines()) == 1, proc_lines
  metrics = json.loads((workdir / "probe" / "metrics.json").read_text())
  assert metrics["step"] == 8

  collect = _run([os.path.join("launch", "collect.py"), f"--root={root}",
                  f"--out={tmp_path / 'table'}"], _env(no_tf))
  assert "1 finished runs under" in collect.stdout
  assert (tmp_path / "table" / "table_a1.csv").exists()


def test_the_c4_step_is_timed_on_random_tokens_without_tensorflow(no_tf):
  """`benchmark_training.py --synthetic_tokens`: the language model's step where TensorFlow,
  seqio and the vocabulary are not (a lent GPU's image; the campaign's g cell)."""
  proc = _run([os.path.join("experiments", "benchmark_training.py"), "--experiment=c4_lm",
               "--size=smoke", "--models=hyla", "--steps=2", "--repeats=1",
               "--synthetic_tokens"], _env(no_tf))
  (row,) = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  assert row["experiment"] == "c4_lm" and row["tokens_per_s"] > 0 and row["synthetic_tokens"]
  # Targets independent of the inputs and uniform over V = 512 pieces: no model's expected
  # cross-entropy is below ln V, and an untrained one is near it.
  assert np.log(512) - 0.3 < row["final_loss"] < np.log(512) + 1.5
  assert "input: synthetic tokens" in proc.stdout


def test_c4_with_its_default_seqio_pipeline_names_the_extra_and_grain(no_tf, tmp_path):
  """c4_lm.py's default pipeline (seqio) in the TF-free install: one line naming the [lm]
  extra and the Grain pipeline, before anything is written (was a 30-line
  ModuleNotFoundError)."""
  (tmp_path / "blocked" / "seqio").mkdir(parents=True)
  (tmp_path / "blocked" / "seqio" / "__init__.py").write_text(
      BLOCKER.replace("tensorflow", "seqio"))
  env = _env(no_tf)
  env["PYTHONPATH"] = str(tmp_path / "blocked") + os.pathsep + env["PYTHONPATH"]
  workdir = tmp_path / "c4"
  proc = tl.run([sys.executable, os.path.join("experiments", "c4_lm.py"),
                 f"--workdir={workdir}"], env=env, capture_output=True, text=True, cwd=tl.REPO)
  last = proc.stderr.strip().splitlines()[-1]
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
  assert ("c4_lm.py: error: config.task.pipeline='seqio' needs 'seqio', which is not "
          "installed; allowed: install the [lm] extra") in last, last
  assert "--config.task.pipeline=grain" in last and not workdir.exists()
