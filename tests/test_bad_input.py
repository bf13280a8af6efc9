"""Bad input, everywhere: one clear line naming the value and what is allowed, before any
work, and nothing already written is lost.

Library cases run in-process (`loop.train_and_evaluate` raises `config_lib.BadInput`
before touching anything); entry-point cases run the real programs, concurrently, and check
that the last line of stderr is `<program>: error: ...` with exit status 2 (no traceback).
"""

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys

import pytest

from train_testlib import compilation_cache  # noqa: F401  pylint: disable=unused-import
import train_testlib as tl

from hypernet_attention.train import config_lib
from hypernet_attention.train import loop

LIBRARY_CASES = {
    # name: (config overrides, expected message regex)
    "zero_batch": ({"batch_size": 0}, r"config.batch_size=0 must be a positive integer"),
    "negative_steps": ({"num_train_steps": -5},
                       r"config.num_train_steps=-5 must be a positive integer"),
    "zero_heads": ({"model.num_heads": 0}, r"config.model.num_heads=0 must be a positive"),
    "eval_not_multiple": ({"eval.num_problems": 40},
                          r"eval.num_problems=40 is not a multiple of config.eval.batch_size=16"),
    "unknown_eval_split": ({"eval.splits": ("test", "nope")}, r"unknown eval splits \['nope'\]"),
    "bad_mesh": ({"mesh.data": 0}, r"mesh sizes .* invalid"),
    "fsdp_more_than_devices": ({"mesh.fsdp": 2}, r"mesh .* does not divide the 1 devices"),
    "bad_preset": ({"model.attention": "flash"}, r"unknown attention preset 'flash'"),
    "bad_task_key": ({"task.num_values": 1}, r"num_values"),
}


@pytest.mark.parametrize("case", sorted(LIBRARY_CASES))
def test_library_refuses_bad_config_before_any_work(case, tmp_path):
  overrides, message = LIBRARY_CASES[case]
  config = tl.smoke("sraven", **overrides)
  workdir = tmp_path / "wd"
  with pytest.raises(config_lib.BadInput, match=message):
    loop.train_and_evaluate(config, str(workdir))
  assert not workdir.exists()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  workdir = str(tmp_path_factory.mktemp("run") / "wd")
  loop.train_and_evaluate(tl.smoke("sraven", **{"eval.ceiling_problems": 0}), workdir)
  return workdir


def _corrupt_config(workdir):
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write('{"experiment": "sraven", "batch_')


def _strip_experiment(workdir):
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump({"batch_size": 16}, f)


WORKDIR_CASES = {
    # name: (how the copied workdir is damaged, config, expected message)
    "other_experiment": (None, ("fuzzy_logic", {}), r"holds a different experiment"),
    "other_settings": (None, ("sraven", {"batch_size": 32}), r"batch_size: 16 -> 32"),
    "corrupt_config_json": (_corrupt_config, ("sraven", {}), r"config.json is not readable JSON"),
    "not_our_config_json": (_strip_experiment, ("sraven", {}), r"not a hypernet-attention config"),
}


@pytest.mark.parametrize("case", sorted(WORKDIR_CASES))
def test_workdir_problems_are_refused_and_nothing_changes(case, finished_run, tmp_path):
  damage, (experiment, overrides), message = WORKDIR_CASES[case]
  workdir = str(tmp_path / "wd")
  shutil.copytree(finished_run, workdir)
  if damage:
    damage(workdir)
  before = tl.snapshot(workdir)
  config = tl.smoke(experiment, **{"eval.ceiling_problems": 0, **overrides})
  with pytest.raises(config_lib.BadInput, match=message):
    loop.train_and_evaluate(config, workdir)
  assert tl.snapshot(workdir) == before


def test_workdir_that_is_a_file_or_under_a_file(tmp_path):
  a_file = tmp_path / "file"
  a_file.write_text("keep me")
  with pytest.raises(config_lib.BadInput, match="is a file, not a directory"):
    loop.train_and_evaluate(tl.smoke("sraven"), str(a_file))
  # Unwritable: a directory cannot be created below a file (chmod does not stop root).
  with pytest.raises(config_lib.BadInput, match="is not writable"):
    loop.train_and_evaluate(tl.smoke("sraven"), str(a_file / "wd"))
  assert a_file.read_text() == "keep me"


SRAVEN = [os.path.join("experiments", "sraven_scaling.py"),
          "--config=experiments/configs/sraven.py:model=hyla,size=smoke"]
CLI_CASES = {
    # name: (argv after python, expected text in the error line, exit status)
    "unknown_flag": (SRAVEN + ["--worksdir=x"], "Unknown command line flag 'worksdir'", 2),
    "wrong_type": (SRAVEN + ["--config.batch_size=abc"], "--config.batch_size=abc", 2),
    "unknown_config_key": (SRAVEN + ["--config.model.nope=1"],
                           "--config.model.nope: 'nope' is not a config key; allowed here:", 2),
    "bad_config_argument": (
        [os.path.join("experiments", "fuzzy_logic.py"),
         "--config=experiments/configs/fuzzy_logic.py:model=hyla,size=huge"],
        "size='huge' is not allowed; choose from ['paper', 'local', 'smoke']", 2),
    "zero_batch": (SRAVEN + ["--config.batch_size=0"],
                   "config.batch_size=0 must be a positive integer", 2),
    "workdir_is_a_file": (SRAVEN + ["--workdir=README.md"],
                          "--workdir='README.md' is a file, not a directory", 2),
    "benchmark_unknown_experiment": (
        [os.path.join("experiments", "benchmark_training.py"), "--experiment=nope"],
        "invalid choice: 'nope'", 2),
    "benchmark_unknown_preset": (
        [os.path.join("experiments", "benchmark_training.py"), "--models=softmax,nope"],
        "benchmark_training.py: error: unknown attention preset 'nope'", 2),
    "profile_bad_size": (
        [os.path.join("experiments", "profile_step.py"), "--size=huge"],
        "profile_step.py: error: config argument size='huge' is not allowed", 2),
}


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory):
  """Runs every CLI case at once (each is a cold Python start), returns name -> result."""
  workdir = tmp_path_factory.mktemp("cli") / "wd"

  def run(argv):
    no_workdir = argv[0].endswith(("benchmark_training.py", "profile_step.py"))
    if not no_workdir and not any(a.startswith("--workdir") for a in argv):
      argv = argv + [f"--workdir={workdir}"]
    return subprocess.run([sys.executable, *argv], env=tl.subprocess_env(), cwd=tl.REPO,
                          capture_output=True, text=True, timeout=300)

  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    futures = {name: pool.submit(run, argv) for name, (argv, _, _) in CLI_CASES.items()}
    results = {name: f.result() for name, f in futures.items()}
  assert not workdir.exists(), "a refused command created its workdir"
  return results


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_entry_points_print_one_line_and_exit_2(case, cli_results):
  _, expected, status = CLI_CASES[case]
  result = cli_results[case]
  last = result.stderr.strip().splitlines()[-1]
  assert result.returncode == status, result.stderr[-2000:]
  assert expected in last, last
  assert "Traceback" not in result.stderr, result.stderr[-2000:]
