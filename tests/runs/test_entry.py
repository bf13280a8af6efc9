"""The training entry point's own behaviour: what it refuses before any work, how it stops.

- A second trainer on a locked workdir is refused in one line before compiling anything.
- Ctrl-C right after "New run in" exits at once, and the closing line names the exact
  command that resumes (with the run's --workdir, which the README's first command lacks).
- Config files and flags: a get_config returning a dict, overrides without --config,
  --help, and refusals without an exception class name.
- One path for the config: `preflight` refuses every typo the host refuses, with the host's
  line, and the layers below the entry take only a checked config.
"""

import os
import shlex
import signal
import subprocess
import sys

import pytest

from hypernet_attention import presets
from hypernet_attention.ops import reference
from hypernet_attention.runs import config_checks
from hypernet_attention.runs import lock
from hypernet_attention.runs import preflight
from hypernet_attention.runs import registry
from hypernet_attention.tasks import fuzzy_logic
from hypernet_attention.tasks import lm_text
from hypernet_attention.train import build
from hypernet_attention.train import objectives
from hypernet_attention.train import preemption

import train_testlib as tl

SCRIPT = os.path.join("experiments", "sraven_scaling.py")
SMOKE = ["--config=experiments/configs/sraven.py:model=hyla,size=smoke",
         "--config.eval.ceiling_problems=8"]


def _train(*args, script=SCRIPT):
  return tl.run([sys.executable, script, *args], cwd=tl.REPO, env=tl.subprocess_env(),
                capture_output=True, text=True)


def test_a_locked_workdir_is_refused_in_one_line_before_any_compilation(tmp_path):
  workdir = tmp_path / "wd"
  with lock.WorkdirLock(str(workdir)):  # This process holds it, as a running trainer would.
    out = _train(*SMOKE, f"--workdir={workdir}")
  assert out.returncode == 2, out.stderr[-2000:]
  lines = out.stderr.strip().splitlines()
  assert lines[-1].startswith("sraven_scaling.py: error: workdir ") and (
      f"is in use by another training process (host {os.uname().nodename}, pid {os.getpid()}"
      in lines[-1]), lines[-1]
  assert "Traceback" not in out.stderr
  assert not [l for l in lines if "compiled" in l or "New run" in l], lines  # Before work.
  assert sorted(os.listdir(workdir)) == [], os.listdir(workdir)  # The lock was ours: gone.


@pytest.mark.e2e
def test_ctrl_c_at_new_run_exits_at_once_naming_the_command_that_resumes(tmp_path):
  """Ctrl-C right after "New run in" (then: accuracy ceilings, a step-0 save) exits with
  75 at once; the closing line's command, run as printed, trains the same workdir."""
  workdir = tmp_path / "wd"
  args = [*SMOKE, "--config.num_train_steps=100000", f"--workdir={workdir}"]

  def start(command, log_path, line):
    log = open(log_path, "w")
    proc = subprocess.Popen(command, cwd=tl.REPO, env=tl.subprocess_env(), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
      tl.wait_until(lambda: line in log_path.read_text(), [proc], f"the {line!r} line",
                    [log_path])
      proc.send_signal(signal.SIGINT)
      try:
        proc.wait(timeout=120)
      except subprocess.TimeoutExpired:
        pytest.fail(f"no exit within 120 s of Ctrl-C at {line!r} (before: ceilings and a "
                    "step-0 save, 75 s on the demo size)")
    finally:
      if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
      log.close()
    return proc.returncode, log_path.read_text()

  code, text = start([sys.executable, SCRIPT, *args], tmp_path / "first.log", "New run in")
  assert code == preemption.EXIT_CODE, text[-3000:]
  last = text.strip().splitlines()[-1]
  assert "interrupted: nothing trained yet" in last and "resume with: " in last, last
  command = shlex.split(last.split("resume with: ", 1)[1])
  assert command == ["python", SCRIPT, *args[:-1], f"--workdir={workdir}"], command
  assert not (workdir / "lock.json").exists()
  assert not [d for d in os.listdir(workdir / "checkpoints") if d.isdigit()]
  code, text = start([sys.executable, *command[1:]], tmp_path / "second.log",
                     f"New run in {workdir}")  # The same workdir, its config accepted.
  assert code == preemption.EXIT_CODE, text[-3000:]


def test_a_config_whose_get_config_returns_a_dict_is_one_line(tmp_path):
  config_file = tmp_path / "mine.py"
  config_file.write_text("def get_config(arg=None):\n  return {'seed': 1}\n")
  out = _train(f"--config={config_file}", script="experiments/train.py")
  assert out.returncode == 2 and out.stderr.strip().splitlines() == [
      f"train.py: error: --config={config_file}: get_config() returned a dict; allowed: a "
      "config file whose get_config(arg) returns an ml_collections.ConfigDict (as "
      "experiments/configs/*.py)"], out.stderr


def test_overrides_without_config_say_that_config_is_needed():
  out = _train("--config.seed=3", script="experiments/train.py")
  assert out.returncode == 2, out.stderr
  line, = out.stderr.strip().splitlines()
  assert line.startswith("train.py: error: --config.seed=3 needs --config=<config file>")
  for experiment in registry.EXPERIMENTS.values():
    assert experiment.config_file in line, line


@pytest.mark.parametrize("script", ["experiments/train.py", SCRIPT, "experiments/c4_lm.py"])
def test_help_exits_0_and_lists_the_entry_point_s_own_flags(script):
  out = _train("--help", script=script)
  assert out.returncode == 0, out.stderr[-2000:]
  own = out.stdout.split(f"{script}:", 1)[1]  # absl's section of the program's key flags.
  assert "--config:" in own and "--workdir:" in own, out.stdout


@pytest.mark.parametrize("arg", ["size=foo", "model=zzz"])
def test_refusals_print_no_exception_class(arg):
  out = _train(f"--config=experiments/configs/sraven.py:{arg}", script="experiments/train.py")
  line, = out.stderr.strip().splitlines()
  assert out.returncode == 2 and line.startswith("train.py: error: ") and (
      "Error:" not in line and "BadInput" not in line), line
  assert repr(arg.split("=")[1]) in line, line


TYPOS = {  # What preflight let through (exit 0) and the host refused.
    "activation": ("sraven", "--config.model.activation=gleu"),
    "split_draw": ("fuzzy_logic", "--config.task.split_draw=covring"),
    "pipeline": ("c4_lm", "--config.task.pipeline=graim"),
    "task_name": ("c4_lm", "--config.task.name=c4x"),
}


@pytest.mark.parametrize("case", sorted(TYPOS))
def test_preflight_refuses_every_typo_the_host_refuses_with_its_line(case, tmp_path):
  experiment, override = TYPOS[case]
  record = registry.get(experiment)
  host = _train(f"--config={record.config_flag('model=hyla,size=smoke')}", override,
                f"--workdir={tmp_path / 'wd'}", script="experiments/train.py")
  launcher = tl.run([sys.executable, "-m", "hypernet_attention.runs.preflight", experiment,
                     "model=hyla,size=smoke", str(tmp_path / "wd"), override], cwd=tl.REPO,
                    env=tl.subprocess_env(), capture_output=True, text=True)
  assert host.returncode == launcher.returncode == 2, (host.stderr, launcher.stderr)
  host_line, = host.stderr.strip().splitlines()
  launcher_line, = launcher.stderr.strip().splitlines()
  assert host_line.split(": error: ", 1)[1] == launcher_line.split(": error: ", 1)[1]
  assert override.split("=")[1] in host_line
  assert not (tmp_path / "wd").exists()


def test_the_records_names_are_the_tasks_own():
  """`config_checks.validate` reads the names from plain data (no JAX on a launcher):
  they must be the ones the task modules and ops accept."""
  assert registry.get("fuzzy_logic").names["task.split_draw"] == fuzzy_logic.SPLIT_DRAWS
  c4 = registry.get("c4_lm").names
  assert c4["task.name"] == (*lm_text.TASKS, objectives.SYNTHETIC_LM)
  assert c4["task.pipeline"] == tuple(lm_text.PIPELINES)
  assert presets.ACTIVATIONS == (None, *reference.ACTIVATIONS)


def test_layers_below_the_entry_take_only_a_checked_config():
  config = tl.smoke("sraven")
  with pytest.raises(TypeError, match="takes config_checks.validate"):
    build.setup(config)
  checked = config_checks.validate(config)
  assert config_checks.validate(checked) is checked  # The entry's check is not repeated.
  assert build.setup(checked).model is not None
  assert preflight.load("sraven", "model=hyla,size=smoke", ["--config.seed=3"]).seed == 3
