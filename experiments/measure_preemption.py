r"""Seconds from a preemption notice (SIGTERM) at a random moment to the run's exit.

  python experiments/measure_preemption.py --trials=10 --label=after \
      [--repo=/path/to/other/checkout --label=before] [--tasks=fuzzy_logic,sraven]

Each trial starts the task's entry point at `size=paper` in a fresh workdir, waits until its state
is built (the `Model:` line; compilation and training follow), then a uniformly random
0..`--window_s` seconds, sends SIGTERM and times the exit. A trial records the exit code (75
expected), the step of the newest checkpoint, and whether an evaluation line came after the notice.
`--repo` runs another checkout's code (e.g. the commit before a change) with the same
interpreter. Results (every trial, then the median and maximum per task) go to
`experiments/results/preemption_latency_<label>.json`; a timing, not a test: run on the
machine whose grace period you care about. SRAVEN runs with `eval.ceiling_problems=0`
(its accuracy ceilings take minutes before training and do not change the latency)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from hypernet_attention import errors  # noqa: E402
from hypernet_attention.runs import children  # noqa: E402
from hypernet_attention.runs import cli  # noqa: E402
from hypernet_attention.runs import registry  # noqa: E402  (no JAX)
from hypernet_attention.runs import run_files  # noqa: E402

TASKS = registry.names(on_device=True)  # Synthetic tasks: a paper-size run starts at once.
# SRAVEN's accuracy ceilings take minutes before training; no other task estimates any.
OVERRIDES = ("--config.eval.ceiling_problems=0",)


def trial(repo: str, task: str, window_s: float, timeout_s: float, rng: random.Random,
          extra: tuple[str, ...] = ()) -> dict:
  experiment = registry.get(task)
  with tempfile.TemporaryDirectory() as workdir:
    log_path = os.path.join(workdir, "log.txt")
    command = [sys.executable, os.path.join(repo, experiment.script),
               f"--config={os.path.join(repo, experiment.config_file)}:model=hyla,size=paper",
               f"--workdir={workdir}/run", *OVERRIDES, *extra]
    env = dict(os.environ, PYTHONPATH=repo, JAX_PLATFORMS="cpu")
    with open(log_path, "w") as log:
      proc = children.spawn(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=repo)
      try:
        deadline = time.time() + timeout_s
        while "Model: " not in open(log_path).read():
          if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f"{task}: no start:\n{open(log_path).read()[-2000:]}")
          time.sleep(0.2)
        delay = rng.uniform(0, window_s)
        time.sleep(delay)
        before = open(log_path).read()
        sent = time.time()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=timeout_s)
        seconds = time.time() - sent
      finally:
        if proc.poll() is None:
          proc.kill()
          proc.wait()
    text = open(log_path).read()
    after = text[len(before):]
    saved = [int(d) for d in os.listdir(os.path.join(workdir, "run", "checkpoints"))
             if d.isdigit()] if os.path.isdir(os.path.join(workdir, "run", "checkpoints")) else []
    logged = [int(s.replace(",", "")) for s in re.findall(r"step (\d[\d,]*)/", before)]
    return {"task": task, "delay_s": round(delay, 2), "seconds_to_exit": round(seconds, 2),
            "exit_code": proc.returncode, "saved_step": max(saved, default=None),
            "last_logged_step": max(logged, default=0),
            "eval_after_signal": "eval at step" in after}


def summarize(trials: list[dict]) -> dict:
  out = {}
  for task in sorted({t["task"] for t in trials}):
    seconds = [t["seconds_to_exit"] for t in trials if t["task"] == task]
    out[task] = {"trials": len(seconds), "median_s": statistics.median(seconds),
                 "max_s": max(seconds),
                 "evals_after_signal": sum(t["eval_after_signal"] for t in trials
                                           if t["task"] == task),
                 "exit_codes": sorted({t["exit_code"] for t in trials if t["task"] == task})}
  return out


def main() -> None:
  parser = errors.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--trials", type=int, default=10, help="per task")
  parser.add_argument("--tasks", default="fuzzy_logic,sraven")
  parser.add_argument("--repo", default=os.path.dirname(HERE), help="checkout whose code runs")
  parser.add_argument("--label", default="after")
  parser.add_argument("--window_s", type=float, default=90.0,
                      help="the notice comes 0..window_s seconds after the `Model:` line")
  parser.add_argument("--timeout_s", type=float, default=1800.0)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--out", default=None,
                      help="default: results/preemption_latency_<label>.json")
  parser.add_argument("overrides", nargs="*", help="extra --config.key=value flags")
  args = parser.parse_args()
  tasks = [t for t in args.tasks.split(",") if t]
  unknown = sorted(set(tasks) - set(TASKS))
  if unknown or args.trials < 1:
    parser.error(f"--tasks={args.tasks!r} --trials={args.trials}; allowed: tasks from "
                 f"{sorted(TASKS)}, trials >= 1")
  out = run_files.output_path(args.out or os.path.join(  # Below a file: refused now.
      HERE, "results", f"preemption_latency_{args.label}.json"), "--out", overwrite=True)
  rng = random.Random(args.seed)
  trials = []
  for i in range(args.trials):
    for task in tasks:  # Interleaved, so a change in the machine's load hits both.
      trials.append(trial(args.repo, task, args.window_s, args.timeout_s, rng,
                          tuple(args.overrides)))
      print(json.dumps(trials[-1]), flush=True)
      result = {"label": args.label, "repo": os.path.abspath(args.repo),
                "window_s": args.window_s, "summary": summarize(trials), "trials": trials}
      with open(out, "w") as f:  # After every trial: an interrupted measurement keeps its data.
        json.dump(result, f, indent=2)
    print(f"after {i + 1} rounds: {json.dumps(summarize(trials))}", flush=True)


if __name__ == "__main__":
  cli.run_plain(main)
