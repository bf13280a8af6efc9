"""`launch/tpu_pod.sh` and `launch/slurm.sh` check their arguments on the launching machine
(`python -m hypernet_attention.runs.preflight`) before anything is copied, installed or
submitted: fake `gcloud`, `sbatch` and `srun` on PATH record whether they were called."""


import pytest
from test_launch import _fake_tools  # pylint: disable=g-bad-import-order

from hypernet_attention.runs import preflight

import train_testlib as tl

BAD = {
    # name: (experiment, config argument, workdir, overrides, expected error line)
    "nan_learning_rate": ("sraven", "model=hyla,size=paper", "gs://b/wd",
                          ["--config.optimizer.learning_rate=nan"],
                          "config.optimizer.learning_rate=nan; allowed: a finite number > 0"),
    "bad_size": ("fuzzy_logic", "model=hyla,size=huge", "gs://b/wd", [],
                 "size='huge' is not allowed; choose from ['paper', 'local', 'smoke']"),
    "unknown_key": ("sraven", "model=hyla", "gs://b/wd", ["--config.nope=1"],
                    "--config.nope=1: unknown config key 'nope'"),
    "empty_workdir": ("sraven", "model=hyla", "", [], "--workdir=''; allowed"),
    "warmup_too_long": ("sraven", "size=smoke", "gs://b/wd", ["--config.optimizer.warmup_steps=8"],
                        "warmup_steps=8; allowed: an integer in [0, config.num_train_steps=8)"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_check_config_refuses_in_one_line(case):
  experiment, arg, workdir, overrides, expected = BAD[case]
  with pytest.raises(ValueError) as error:
    preflight.check(experiment, arg, workdir, overrides)
  assert expected in str(error.value)


def test_check_config_applies_typed_overrides():
  config = preflight.load("sraven", "model=hyla,size=smoke",
                             ["--config.stop_after_steps=4", "--config.seed=3",
                              "--config.eval.splits=('test',)"])
  assert (config.stop_after_steps, config.seed, tuple(config.eval.splits)) == (4, 3, ("test",))


def test_tpu_pod_script_checks_before_copying(tmp_path):
  env, log = _fake_tools(tmp_path, "gcloud")
  env["TMPDIR"] = str(tmp_path)
  result = tl.run(["bash", "launch/tpu_pod.sh", "pod", "zone", "sraven",
                   "model=hyla,size=paper", "gs://b/wd",
                   "--config.optimizer.learning_rate=nan"],
                  cwd=tl.REPO, env=env, capture_output=True, text=True)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines() == [
      "preflight: error: config.optimizer.learning_rate=nan; allowed: a finite number > 0"]
  assert not log.exists(), "gcloud ran"
  assert not list(tmp_path.glob("*.tgz")), "the repository was packed"


def test_slurm_script_checks_then_submits_itself(tmp_path):
  env, log = _fake_tools(tmp_path, "sbatch", "srun")
  env.pop("SLURM_JOB_ID", None)
  bad = tl.run(["bash", "launch/slurm.sh", "--nodes=2", "sraven", "model=hyla",
                "/shared/wd", "--config.model.attention_dropout=1.5"],
               cwd=tl.REPO, env=env, capture_output=True, text=True)
  assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
      "preflight: error: config.model.attention_dropout=1.5; allowed: a number in [0, 1)"]
  assert not log.exists(), "sbatch or srun ran"
  tl.run(["bash", "launch/slurm.sh", "--nodes=2", "--gpus-per-node=8", "sraven",
          "model=hyla,size=paper", "/shared/wd", "--config.seed=2"],
         cwd=tl.REPO, env=env, check=True)
  assert log.read_text().split("\n---")[0].split("\n") == [
      "--nodes=2", "--gpus-per-node=8", "launch/slurm.sh", "sraven", "model=hyla,size=paper",
      "/shared/wd", "--config.seed=2"]


# A missing, empty or misplaced argument (issue 25, point 7): one line naming it, exit 2,
# nothing run; before, the scripts printed their 13- and 18-line usage comments.
SCRIPT_CASES = {
    # name: (argv, expected error line)
    "tpu_no_arguments": (["launch/tpu_pod.sh"],
                         "tpu_pod.sh: error: missing TPU_NAME ZONE EXPERIMENT CONFIG_ARG WORKDIR;"),
    "tpu_no_workdir": (["launch/tpu_pod.sh", "pod", "zone", "sraven", "model=hyla"],
                       "tpu_pod.sh: error: missing WORKDIR; usage: launch/tpu_pod.sh"),
    "tpu_empty_zone": (["launch/tpu_pod.sh", "pod", "", "sraven", "model=hyla", "gs://b/wd"],
                       "tpu_pod.sh: error: ZONE=''; allowed: a non-empty value"),
    "tpu_override_too_early": (
        ["launch/tpu_pod.sh", "pod", "zone", "sraven", "--config.seed=1", "gs://b/wd"],
        "tpu_pod.sh: error: CONFIG_ARG='--config.seed=1'; allowed: a non-empty value that is "
        "not a flag (overrides go after WORKDIR"),
    "slurm_no_arguments": (["launch/slurm.sh"],
                           "slurm.sh: error: missing EXPERIMENT CONFIG_ARG WORKDIR;"),
    "slurm_no_workdir": (["launch/slurm.sh", "--nodes=2", "sraven", "model=hyla"],
                         "slurm.sh: error: missing WORKDIR; usage: launch/slurm.sh"),
    "slurm_override_first": (["launch/slurm.sh", "--config.seed=1", "sraven", "model=hyla",
                              "/shared/wd"],
                             "slurm.sh: error: --config.seed=1 comes before EXPERIMENT"),
    "slurm_empty_experiment": (["launch/slurm.sh", "", "model=hyla", "/shared/wd"],
                               "slurm.sh: error: EXPERIMENT=''; allowed: a non-empty value"),
}


@pytest.mark.parametrize("case", sorted(SCRIPT_CASES))
def test_launch_scripts_name_the_missing_argument(case, tmp_path):
  argv, expected = SCRIPT_CASES[case]
  env, log = _fake_tools(tmp_path, "gcloud", "sbatch", "srun")
  env.pop("SLURM_JOB_ID", None)
  result = tl.run(["bash", *argv], cwd=tl.REPO, env=env, capture_output=True,
                  text=True)
  lines = result.stderr.strip().splitlines()
  assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith(expected), lines
  assert not log.exists(), "a cluster tool ran"
