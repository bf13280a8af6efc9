"""Every tool that writes files, given an output path it cannot use: one line, exit 2, before
any work, and nothing of the user's changed.

(a) an output below an existing file (a folder cannot be made there) is refused by every
tool; (b) export_params, the one tool that replaces its output folder, refuses its input run,
a folder inside it or one holding it, and a folder of the user's; (c) no existing folder or
file is changed or removed by a refusal. A new writing tool belongs in TOOLS.
"""

import concurrent.futures
import json
import os
import re
import sys

import pytest

from hypernet_attention.runs import run_files

import train_testlib as tl

SMOKE = "experiments/configs/{}.py:model=hyla,size=smoke"
# name -> (arguments, with {out} the output path (a folder or file's) and {run} a run's
# workdir as input; the flag the refusal names).
TOOLS = {
    "fuzzy_logic": (["experiments/fuzzy_logic.py", f"--config={SMOKE.format('fuzzy_logic')}",
                     "--workdir={out}"], "--workdir"),
    "sraven_scaling": (["experiments/sraven_scaling.py", f"--config={SMOKE.format('sraven')}",
                        "--workdir={out}"], "--workdir"),
    "export_params": (["experiments/export_params.py", "--workdir={run}", "--output_dir={out}"],
                      "--output_dir"),
    "probe_latents": (["experiments/probe_latents.py", "--workdir={run}", "--output_dir={out}"],
                      "--output_dir"),
    "plot_curves": (["experiments/plot_curves.py", "--workdir={run}", "--out={out}/c.png"],
                    "--out"),
    "train_vocabulary": (["experiments/train_vocabulary.py", "--output={out}/v.model"],
                         "--output"),
    "benchmark_attention": (["experiments/benchmark_attention.py", "--out_dir={out}"],
                            "--out_dir"),
    "benchmark_attention_jsonl": (["experiments/benchmark_attention.py", "--out_dir={run}",
                                   "--jsonl={out}/rows.jsonl"], "--jsonl"),
    "tune_kernels": (["experiments/tune_kernels.py", "--out={out}/rows.jsonl"], "--out"),
    "measure_preemption": (["experiments/measure_preemption.py", "--out={out}/r.json"], "--out"),
    "profile_step": (["experiments/profile_step.py", "--size=smoke", "--trace_dir={out}"],
                     "--trace_dir"),
    "collect": (["-m", "launch.collect", "--root={run}", "--out={out}"], "--out"),
    "campaign_root": (["-m", "launch.campaign", "--dry_run", "--root={out}"], "--root"),
    "campaign_report": (["-m", "launch.campaign", "--report", "--report_path={out}/r.md"],
                        "--report_path"),
    "run_local": (["-m", "launch.run_local", "--sweep=smoke_fuzzy", "--root={out}"], "--root"),
    "xm_launch": (["-m", "launch.xm_launch", "--sweep=smoke_fuzzy", "--dry_run",
                   "--workdir_root={out}"], "--workdir_root"),
    "gpu_window": (["launch/gpu_window.py", "--dry_run", "--out={out}"], "--out"),
}
# export_params' output folder against its input run (b), and a folder of the user's.
EXPORT_CASES = {"the run": ("{run}", "is the run's workdir"),
                "inside the run": ("{run}/kept", "lies inside the run's workdir"),
                "holding the run": ("{root}", "holds the run's workdir"),
                "a user's folder": ("{user}", "is a folder with files of its own")}


def _run(args: list[str]) -> tuple[int, list[str]]:
  """Exit status and the output lines that are not progress lines (`HH:MM:SS ...`). No
  usage block: the argparse tools' parser (errors.ArgumentParser) prints the error alone."""
  result = tl.run([sys.executable, *args], cwd=tl.REPO, env=tl.subprocess_env(),
                  capture_output=True, text=True)
  lines = [line for line in (result.stdout + result.stderr).splitlines()
           if line.strip() and not re.match(r"\d\d:\d\d:\d\d ", line)]
  return result.returncode, lines


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
  """Every case run at once (a few at a time): case -> (status, lines), and the tree before
  and after."""
  root = tmp_path_factory.mktemp("outputs")
  run, user, blocker = root / "run", root / "user", root / "a_file"
  run.mkdir()
  user.mkdir()
  (user / "notes.txt").write_text("mine\n")
  blocker.write_text("not a folder\n")
  # A run's workdir as probing and plotting read it (its config.json alone).
  run_files.write_json(run / run_files.CONFIG,
                       run_files.config_to_json(tl.smoke("fuzzy_logic", model="hyla")))
  (run / "notes.txt").write_text("the user's, beside the run\n")
  fill = dict(run=run, root=root, user=user)
  cases = {name: [a.format(out=blocker / "out", **fill) for a in args]
           for name, (args, _) in TOOLS.items()}
  cases |= {f"export_params onto {what}": [
      "experiments/export_params.py", f"--workdir={run}", f"--output_dir={out.format(**fill)}"]
      for what, (out, _) in EXPORT_CASES.items()}
  tree = lambda: (tl.snapshot(str(root)), sorted(d for d, _, _ in os.walk(root)))
  before = tree()
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    results = dict(zip(cases, pool.map(_run, cases.values())))
  return results, before, tree(), blocker


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_an_output_below_a_file_is_one_line(refused, tool):
  results, _, _, blocker = refused
  status, lines = results[tool]
  flag = TOOLS[tool][1]
  assert status == 2 and len(lines) == 1, json.dumps(lines[-30:], indent=1)
  assert re.match(rf"[\w.]+\.py: error: {flag}=", lines[0]), lines[0]
  assert (f"below the file '{blocker}'" in lines[0]
          or "cannot be made (Not a directory" in lines[0]), lines[0]


@pytest.mark.parametrize("what", sorted(EXPORT_CASES))
def test_export_params_refuses_its_input_and_a_users_folder(refused, what):
  status, lines = refused[0][f"export_params onto {what}"]
  assert status == 2 and len(lines) == 1, lines
  assert EXPORT_CASES[what][1] in lines[0], lines[0]


def test_nothing_is_changed_or_removed(refused):
  _, before, after, blocker = refused
  assert after == before
  assert blocker.read_text() == "not a folder\n"
