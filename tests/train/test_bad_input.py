"""Bad input, everywhere: one clear line naming the value and what is allowed, before any
work, and nothing already written is lost.

Library cases run in-process (`loop.train_and_evaluate` raises `errors.BadInput`
before touching anything); entry-point cases run the real programs, one process per case, and
check that the last line of stderr is `<program>: error: ...` with exit status 2 (no traceback).
"""

import json
import logging
import os
import re
import shutil
import sys

import ml_collections
import pytest

from hypernet_attention import errors
from hypernet_attention.runs import config_checks
from hypernet_attention.runs import config_common
from hypernet_attention.runs import preflight
from hypernet_attention.runs import registry
from hypernet_attention.runs import run_files
from hypernet_attention.tasks import sraven
from hypernet_attention.train import loop
from hypernet_attention.train import objectives

import train_testlib as tl

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
    # Values that trained silently wrong (exit 0) before they were refused.
    "negative_lr": ({"optimizer.learning_rate": -1e-3},
                    r"config.optimizer.learning_rate=-0.001; allowed: a finite number > 0"),
    "nan_lr": ({"optimizer.learning_rate": float("nan")},
               r"learning_rate=nan; allowed: a finite number > 0"),
    "inf_lr": ({"optimizer.learning_rate": float("inf")}, r"learning_rate=inf; allowed"),
    "negative_weight_decay": ({"optimizer.weight_decay": -0.1},
                              r"weight_decay=-0.1; allowed: a finite number >= 0"),
    "warmup_longer_than_run": ({"optimizer.warmup_steps": 8},
                               r"warmup_steps=8; allowed: an integer in \[0, "
                               r"config.num_train_steps=8\)"),
    "negative_warmup": ({"optimizer.warmup_steps": -1}, r"warmup_steps=-1; allowed"),
    "negative_end_lr_fraction": ({"optimizer.end_lr_fraction": -0.5},
                                 r"end_lr_fraction=-0.5; allowed: a number in \[0, 1\]"),
    "b1_one": ({"optimizer.b1": 1.0}, r"b1=1.0; allowed: a number in \[0, 1\)"),
    "b2_above_one": ({"optimizer.b2": 1.5}, r"b2=1.5; allowed"),
    "negative_eps": ({"optimizer.eps": -1e-8}, r"eps=-1e-08; allowed: a finite number > 0"),
    "negative_clip": ({"optimizer.grad_clip_norm": -1.0},
                      r"grad_clip_norm=-1.0; allowed: a finite number >= 0"),
    "negative_dropout": ({"model.attention_dropout": -0.1},
                         r"attention_dropout=-0.1; allowed: a number in \[0, 1\)"),
    "nan_dropout": ({"model.attention_dropout": float("nan")}, r"attention_dropout=nan"),
    "dropout_one": ({"model.attention_dropout": 1.0}, r"attention_dropout=1.0; allowed"),
    "zero_stop": ({"stop_after_steps": 0}, r"stop_after_steps=0; allowed: None"),
    "negative_stop": ({"stop_after_steps": -3}, r"stop_after_steps=-3; allowed"),
    "no_eval_splits": ({"eval.splits": ()}, r"eval.splits=\(\); allowed: a non-empty list"),
    "negative_seed": ({"seed": -1}, r"config.seed=-1; allowed: an integer in \[0, 2\*\*32\)"),
    "unknown_dtype": ({"model.dtype": "banana"},
                      r"config.model.dtype='banana'; allowed: float32, bfloat16, float16"),
    "negative_ceiling_problems": ({"eval.ceiling_problems": -1},
                                  r"ceiling_problems=-1; allowed: an integer >= 0"),
    "task_too_big_for_memory": ({"task.num_features": 7, "eval.ceiling_problems": 32},
                                r"task.num_features=7.* GiB for the task's tables; allowed: "
                                r"at most .* GiB"),
    "empty_workdir": ({}, r"--workdir=''; allowed: a directory path"),
}


@pytest.mark.parametrize("case", sorted(LIBRARY_CASES))
def test_library_refuses_bad_config_before_any_work(case, tmp_path):
  overrides, message = LIBRARY_CASES[case]
  config = tl.smoke("sraven", **overrides)
  workdir = tmp_path / "wd"
  with pytest.raises(errors.BadInput, match=message):
    loop.train_and_evaluate(config, "" if case == "empty_workdir" else str(workdir))
  assert not workdir.exists() and os.listdir(tmp_path) == []


def test_task_memory_bound_follows_the_estimate():
  """SRAVEN K=7 without ceilings is small (3,432 rule multisets); with them the K!**2
  readings are not; the bound is the estimate against the budget."""
  config = tl.smoke("sraven", **{"task.num_features": 7, "eval.ceiling_problems": 0})
  objectives.build(config, budget=2**30)
  with config.unlocked():
    config.eval.ceiling_problems = 32
  # A single run's refusal names what it can change (it has no members to drop).
  with pytest.raises(errors.BadInput, match="eval.ceiling_problems=32 needs ~.*: fewer "
                     "features, or --config.eval.ceiling_problems=0"):
    objectives.build(config, budget=2**30)
  # A population holds every member's tables (weighed once): one fits where two do not.
  budget = sraven.config_memory(config) * 3 // 2
  objectives.build(config, budget=budget)
  with pytest.raises(errors.BadInput, match="ceiling_problems=32 for 2 members needs ~.*: "
                     "fewer features or members, or"):
    objectives.build(config, budget=budget, members=2)
  # The estimate: (7!)**2 readings x 7 slots x 1024 problems x (8 values + 4) bytes at least.
  assert sraven.memory_estimate(7, 8, 3, 1024) > 5040**2 * 7 * 1024 * 12


def test_tilde_in_workdir_is_expanded(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path))
  assert run_files.workdir_path("~/runs/a") == str(tmp_path / "runs" / "a")
  assert run_files.workdir_path("gs://bucket/a") == "gs://bucket/a"


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


def _truncate_summary(workdir):
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    f.write('{"step": 8, "ood/acc')


WORKDIR_CASES = {
    # name: (how the copied workdir is damaged, config, expected message)
    "other_experiment": (None, ("fuzzy_logic", {}), r"holds a different experiment"),
    "other_settings": (None, ("sraven", {"batch_size": 32}), r"batch_size: 16 -> 32"),
    "corrupt_config_json": (_corrupt_config, ("sraven", {}), r"config.json is not readable JSON"),
    "not_our_config_json": (_strip_experiment, ("sraven", {}), r"not a hypernet-attention config"),
    "truncated_summary_json": (_truncate_summary, ("sraven", {}),
                               r"wd/summary.json is not readable JSON \(Unterminated string"),
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
  with pytest.raises(errors.BadInput, match=message):
    loop.train_and_evaluate(config, workdir)
  assert tl.snapshot(workdir) == before


def test_workdir_that_is_a_file_or_under_a_file(tmp_path):
  a_file = tmp_path / "file"
  a_file.write_text("keep me")
  with pytest.raises(errors.BadInput, match="is a file, not a directory"):
    loop.train_and_evaluate(tl.smoke("sraven"), str(a_file))
  # Unwritable: a directory cannot be created below a file (chmod does not stop root).
  with pytest.raises(errors.BadInput, match="is not writable"):
    loop.train_and_evaluate(tl.smoke("sraven"), str(a_file / "wd"))
  assert a_file.read_text() == "keep me"


SRAVEN = [os.path.join("experiments", "sraven_scaling.py"),
          "--config=experiments/configs/sraven.py:model=hyla,size=smoke"]
CLI_CASES = {
    # name: (argv after python, expected text in the error line, exit status)
    "unknown_flag": (SRAVEN + ["--worksdir=x"], "Unknown command line flag 'worksdir'", 2),
    "wrong_type": (SRAVEN + ["--config.batch_size=abc"], "--config.batch_size=abc", 2),
    "unknown_config_key": (SRAVEN + ["--config.model.nope=1"],
                           "--config.model.nope=1: unknown config key 'model.nope'; allowed in "
                           "'model': ['activation', 'attention',", 2),
    "bad_config_argument": (
        [os.path.join("experiments", "fuzzy_logic.py"),
         "--config=experiments/configs/fuzzy_logic.py:model=hyla,size=huge"],
        "size='huge' is not allowed; choose from ['paper', 'local', 'smoke']", 2),
    "zero_batch": (SRAVEN + ["--config.batch_size=0"],
                   "config.batch_size=0 must be a positive integer", 2),
    "retired_implementation": (  # The Triton kernel, retired in issue 54.
        SRAVEN + ["--config.model.implementation=pallas"],
        "Unknown config.model.implementation 'pallas'; allowed: auto, reference, factored, "
        "blockwise, mosaic.", 2),
    "retired_blockwise_broadcast": (  # Blockwise's multiply-reduce form, retired in issue 54.
        SRAVEN + ["--config.model.implementation=blockwise_broadcast"],
        "Unknown config.model.implementation 'blockwise_broadcast'; allowed: auto, reference, "
        "factored, blockwise, mosaic.", 2),
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
    # Config files that do not load; one config value (the others are library cases above,
    # which go through the same `cli` path).
    "config_missing_file": (
        [SRAVEN[0], "--config={tmp}/nope.py"],
        "--config={tmp}/nope.py: [Errno 2] No such file or directory", 2),
    "config_syntax_error": ([SRAVEN[0], "--config={tmp}/bad_syntax.py"],
                            "'(' was never closed", 2),
    "train_without_config": ([os.path.join("experiments", "train.py")],
                             "train.py: error: --config is required; allowed: an experiment's "
                             "config file and argument: experiments/configs/sraven.py:", 2),
    "train_unknown_experiment": (
        [os.path.join("experiments", "train.py"), "--config={tmp}/unregistered.py"],
        "config.experiment: unknown experiment 'unregistered'; allowed: sraven, fuzzy_logic", 2),
    "config_without_get_config": ([SRAVEN[0], "--config={tmp}/no_get.py"],
                                  "--config={tmp}/no_get.py: '{tmp}/no_get.py' defines no "
                                  "get_config(); allowed: a config file whose get_config(arg)",
                                  2),
    "nan_learning_rate": (SRAVEN + ["--config.optimizer.learning_rate=nan"],
                          "config.optimizer.learning_rate=nan; allowed: a finite number > 0", 2),
    "empty_workdir": (SRAVEN + ["--workdir="], "--workdir=''; allowed: a directory path", 2),
    # issue 46: an empty split draw trained the default `covering` split silently.
    "fuzzy_split_draw_empty": (
        [os.path.join("experiments", "fuzzy_logic.py"),
         "--config=experiments/configs/fuzzy_logic.py:model=hyla,size=smoke",
         "--config.task.split_draw="],
        "Unknown config.task.split_draw ''; allowed: covering, authors.", 2),
    # The tools: one line, exit 2, no flag list, nothing written.
    "plot_curves_no_workdir": (
        [os.path.join("experiments", "plot_curves.py"), "--workdir={tmp}/nope",
         "--out={tmp}/curves.png"], "--workdir='{tmp}/nope' is not a directory", 2),
    "plot_curves_missing_flag": ([os.path.join("experiments", "plot_curves.py")],
                                 "must have a value other than None", 2),
    "train_vocabulary_existing_output": (
        [os.path.join("experiments", "train_vocabulary.py"), "--output={tmp}/existing.model"],
        "--output='{tmp}/existing.model' exists; allowed: a new path, or --overwrite", 2),
    "c4_generate_on_sraven_run": (
        [os.path.join("experiments", "c4_lm.py"), "--generate", "--workdir={tmp}/sraven_run"],
        "--workdir='{tmp}/sraven_run' holds a 'sraven' run; allowed: the workdir of a "
        "language-modeling (c4_lm) run", 2),
    "c4_into_other_experiment": (
        [os.path.join("experiments", "c4_lm.py"), "--workdir={tmp}/sraven_run"],
        "holds a different experiment ('sraven', not 'c4_lm'); nothing was written", 2),
    "c4_sequence_length_one": (
        [os.path.join("experiments", "c4_lm.py"), "--config.task.sequence_length=1",
         "--workdir={tmp}/c4_wd"], "config.task.sequence_length=1; allowed: an integer >= 2", 2),
    "c4_train_on_random_tokens": (
        [os.path.join("experiments", "c4_lm.py"), "--config.task.name=synthetic_lm",
         "--workdir={tmp}/c4_wd"], "config.task.name='synthetic_lm' is random tokens for "
        "experiments/benchmark_training.py only", 2),
    "benchmark_training_synthetic_tokens_not_lm": (
        [os.path.join("experiments", "benchmark_training.py"), "--experiment=sraven",
         "--synthetic_tokens"], "--synthetic_tokens with --experiment=sraven; allowed: c4_lm "
        "only", 2),
    "collect_sweep_of_other_experiment": (
        ["-m", "launch.collect", "--root={tmp}/fuzzy_root", "--sweep=table_a1_sraven_local"],
        "--sweep=table_a1_sraven_local is a 'sraven' sweep but the runs under the root are "
        "['fuzzy_logic']", 2),
    "collect_truncated_summary": (["-m", "launch.collect", "--root={tmp}/truncated_root"],
                                  "no finished run (summary.json) under", 2),
    "run_local_no_sweep": (["-m", "launch.run_local"], "--sweep is required; allowed:", 2),
    "xm_launch_zero_hosts": (["-m", "launch.xm_launch", "--sweep=table_a1_sraven",
                              "--num_hosts=0"], "--num_hosts=0; allowed: an integer >= 1", 2),
    "benchmark_attention_zero_length": (
        [os.path.join("experiments", "benchmark_attention.py"), "--seq_lens=0"],
        "--seq_lens='0'; allowed: comma-separated positive integers", 2),
    "tune_kernels_malformed_config": (
        [os.path.join("experiments", "tune_kernels.py"), "--configs=mosaic:64x16"],
        "--configs entry 'mosaic:64x16'; allowed: mosaic:BQxBKxBV:DQ", 2),
    "tune_kernels_zero_tile": (  # refused before softmax is timed
        [os.path.join("experiments", "tune_kernels.py"), "--configs=mosaic:0x16x16:kernel"],
        "--configs entry 'mosaic:0x16x16:kernel'; allowed:", 2),
    "tune_kernels_superscript_tile": (  # '²'.isdigit() holds, int('²') raises: still refused
        [os.path.join("experiments", "tune_kernels.py"), "--configs=blockwise:\u00b2x8"],
        "--configs entry 'blockwise:\u00b2x8'; allowed:", 2),
    "tune_kernels_off_a_gpu": (
        [os.path.join("experiments", "tune_kernels.py")],
        "the kernels need a GPU; allowed off a GPU: --interpret", 2),
    "task_stats_zero_problems": ([os.path.join("experiments", "task_stats.py"),
                                  "--num_problems=0"], "--num_problems=0; allowed", 2),
    # Populations, grouping, collect and gs:// (issue 25).
    "population_dict_instead_of_tuple": (
        SRAVEN + ["--config.population.members=({'seed': 1})"],
        "config.population.members[0]='seed'; allowed: a dict of", 2),
    "population_member_named_checkpoints": (
        SRAVEN + ["--config.population.members=({'seed': 0}, {'seed': 1})",
                  "--config.population.member_names=('checkpoints', 'b')"],
        "('checkpoints' is not allowed)", 2),
    "population_second_member_nan_lr": (
        SRAVEN + ["--config.population.members=({'seed': 0}, "
                  "{'optimizer.learning_rate': 'nan'})"],
        "members[1]: config.optimizer.learning_rate=nan; allowed: a finite number > 0", 2),
    "workdir_malformed_bucket": (SRAVEN + ["--workdir=gs:/b/run"],
                                 "--workdir='gs:/b/run' is not a valid bucket path", 2),
    "run_local_zero_jobs": (["-m", "launch.run_local", "--sweep=smoke_fuzzy", "--jobs=0",
                             "--root={tmp}/runs"], "--jobs=0; allowed: an integer >= 1", 2),
    "run_local_zero_members_per_job": (
        ["-m", "launch.run_local", "--sweep=smoke_fuzzy", "--members_per_job=0", "--dry_run"],
        "--members_per_job=0; allowed: an integer >= 1", 2),
    "run_local_nan_member_memory": (
        ["-m", "launch.run_local", "--sweep=smoke_fuzzy", "--member_memory_gib=nan",
         "--dry_run"], "--member_memory_gib=nan; allowed: a finite number of GiB > 0", 2),
    "collect_out_is_a_file": (
        ["-m", "launch.collect", "--root={tmp}/fuzzy_root", "--out={tmp}/existing.model"],
        "--out='{tmp}/existing.model' is a file; allowed: a folder", 2),
    "collect_malformed_bucket_root": (["-m", "launch.collect", "--root=GS://b/sweep"],
                                      "--root='GS://b/sweep' is not a valid bucket path", 2),
    # Issue 25, point 7: outputs that are files, generation arguments, benchmark steps,
    # corpora that are not text.
    "collect_out_below_a_file": (
        ["-m", "launch.collect", "--root={tmp}/fuzzy_root", "--out={tmp}/existing.model/t"],
        "--out='{tmp}/existing.model/t' is below the file '{tmp}/existing.model'", 2),
    "probe_output_dir_is_a_file": (
        [os.path.join("experiments", "probe_latents.py"), "--workdir={tmp}/fuzzy_root/run",
         "--output_dir={tmp}/existing.model"],
        "--output_dir='{tmp}/existing.model' is a file; allowed: a folder", 2),
    "plot_curves_out_below_a_file": (
        [os.path.join("experiments", "plot_curves.py"), "--workdir={tmp}/fuzzy_root/run",
         "--out={tmp}/existing.model/curves.png"],
        "--out='{tmp}/existing.model/curves.png' is below the file '{tmp}/existing.model'", 2),
    "benchmark_attention_out_dir_is_a_file": (
        [os.path.join("experiments", "benchmark_attention.py"), "--out_dir={tmp}/existing.model"],
        "--out_dir='{tmp}/existing.model' is a file; allowed: a folder", 2),
    "benchmark_training_zero_steps": (
        [os.path.join("experiments", "benchmark_training.py"), "--steps=0"],
        "benchmark_training.py: error: --steps=0; allowed: a positive integer", 2),
    # A step that cannot fit: one line before it runs, not the allocator's traceback.
    "benchmark_training_does_not_fit": (
        [os.path.join("experiments", "benchmark_training.py"), "--experiment=fuzzy_logic",
         "--size=smoke", "--models=softmax", "--steps=1", "--repeats=1",
         "--config_overrides=batch_size=20000000"],
        "batch_size=20000000 does not fit in memory: one training chunk needs", 2),
    # Issue 67: refused before any work, not after hours or the first rows.
    "benchmark_training_absurd_steps": (
        [os.path.join("experiments", "benchmark_training.py"), "--steps=100000000"],
        "--steps=100000000 with --repeats=3 runs 400,000,000 steps; allowed: --steps <= "
        "100,000", 2),
    "tune_kernels_unknown_dq": (
        [os.path.join("experiments", "tune_kernels.py"), "--interpret",
         "--configs=mosaic:8x8x8:kernel,mosaic:8x8x8:fast"],
        "--configs entry 'mosaic:8x8x8:fast': DQ 'fast'; allowed: kernel, xla", 2),
    "probe_same_workdir_twice": (
        [os.path.join("experiments", "probe_latents.py"), "--workdir={tmp}/fuzzy_root/run",
         "--workdir={tmp}/fuzzy_root/run/", "--output_dir={tmp}/probes"],
        "--workdir={tmp}/fuzzy_root/run is given 2 times; allowed: each run once", 2),
    "c4_generate_negative_tokens": (
        [os.path.join("experiments", "c4_lm.py"), "--generate", "--workdir={tmp}/c4_run",
         "--num_tokens=-1"], "--num_tokens=-1; allowed: an integer >= 1", 2),
    "c4_generate_negative_temperature": (
        [os.path.join("experiments", "c4_lm.py"), "--generate", "--workdir={tmp}/c4_run",
         "--temperature=-0.5"], "--temperature=-0.5; allowed: a finite number >= 0", 2),
    "c4_train_nan_temperature": (
        [os.path.join("experiments", "c4_lm.py"), "--workdir={tmp}/c4_wd", "--temperature=nan"],
        "--temperature=nan; allowed: a finite number >= 0", 2),
    "c4_latin1_corpus": (  # Through Grain: the check is the seqio path's too (tasks/lm_text.py).
        [os.path.join("experiments", "c4_lm.py"), "--workdir={tmp}/c4_wd",
         "--config.task.docstring_corpus_mb=0", "--config.task.name=text_lm",
         "--config.task.pipeline=grain",
         "--config.task.train_files={tmp}/latin1.txt",
         "--config.task.validation_files={tmp}/latin1.txt"],
        "corpus file '{tmp}/latin1.txt' is not UTF-8 (byte 0xe9 at offset 3", 2),
}
TRAINERS = (SRAVEN[0], os.path.join("experiments", "fuzzy_logic.py"))


def _tool_inputs(tmp) -> None:
  """The files the CLI cases point at (`{tmp}` in their argv)."""
  (tmp / "bad_syntax.py").write_text("x = (\n")
  (tmp / "no_get.py").write_text("X = 1\n")
  (tmp / "unregistered.py").write_text(
      "from hypernet_attention.runs import config_common\n"
      "def get_config(arg=None):\n  return config_common.base_config(experiment='unregistered')\n")
  (tmp / "existing.model").write_text("keep me")
  (tmp / "latin1.txt").write_bytes("caf\u00e9\n".encode("latin-1"))
  (tmp / "c4_run").mkdir()
  (tmp / "c4_run" / "config.json").write_text(json.dumps({"experiment": "c4_lm"}))
  (tmp / "sraven_run").mkdir()
  (tmp / "sraven_run" / "config.json").write_text(json.dumps({"experiment": "sraven"}))
  for root, summary in (("fuzzy_root", '{"ood/r2": 0.5, "test/r2": 0.6, "wall_time_s": 1}'),
                        ("truncated_root", '{"ood/accur')):
    (tmp / root / "run").mkdir(parents=True)
    (tmp / root / "run" / "config.json").write_text(json.dumps(
        {"experiment": "fuzzy_logic" if root == "fuzzy_root" else "sraven", "seed": 0,
         "model": {"attention": "hyla"}}))
    (tmp / root / "run" / "summary.json").write_text(summary)


def _run_cli_case(case, tmp_path):
  """Runs one CLI case (a cold Python start) against fresh inputs; checks that it created
  no workdir and wrote or changed no file; returns the result and the inputs' folder.

  One case per test, so pytest-xdist spreads them over its workers (a module fixture that
  ran them all would run all of them once in every worker)."""
  workdir = tmp_path / "wd"
  tmp = tmp_path / "inputs"
  tmp.mkdir()
  _tool_inputs(tmp)
  before = tl.snapshot(str(tmp))
  argv = [a.replace("{tmp}", str(tmp)) for a in CLI_CASES[case][0]]
  if argv[0] in TRAINERS and not any(a.startswith("--workdir") for a in argv):
    argv = argv + [f"--workdir={workdir}"]
  result = tl.run([sys.executable, *argv], env=tl.subprocess_env(), cwd=tl.REPO,
                  capture_output=True, text=True)
  assert not workdir.exists(), "a refused command created its workdir"
  assert tl.snapshot(str(tmp)) == before, "a refused command wrote or changed a file"
  return result, str(tmp)


@pytest.mark.parametrize("case", sorted(CLI_CASES))
def test_entry_points_print_one_line_and_exit_2(case, tmp_path):
  _, expected, status = CLI_CASES[case]
  result, tmp = _run_cli_case(case, tmp_path)
  expected = expected.replace("{tmp}", tmp)
  last = result.stderr.strip().splitlines()[-1]
  assert result.returncode == status, result.stderr[-2000:]
  assert expected in last, last
  assert "Traceback" not in result.stderr, result.stderr[-2000:]


def test_collect_names_the_unreadable_file_it_skipped(tmp_path):
  result, tmp = _run_cli_case("collect_truncated_summary", tmp_path)
  assert (f"warning: skipping {tmp}/truncated_root/run: {tmp}/truncated_root/run/summary.json "
          "is not readable JSON") in result.stderr, result.stderr


# Issue 56: a mistyped key is refused in one line naming the nearest key whether the config
# is the entry point's default or given by --config=. With the default, ml_collections
# applies the overrides when the flag is defined, at import (an AttributeError traceback,
# exit 1, before `cli.define_config`).
TYPOS = {
    # name: (argv after python, the override)
    "sraven_default": (["experiments/sraven_scaling.py", "--workdir={tmp}/wd"],
                       "--config.seeed=1"),
    "sraven_given": ([SRAVEN[0], "--workdir={tmp}/wd", "--config=experiments/configs/sraven.py"],
                     "--config.seeed=1"),
    "fuzzy_logic_default": (["experiments/fuzzy_logic.py", "--workdir={tmp}/wd"],
                            "--config.model.attentio=hyla"),
    "c4_lm_default": (["experiments/c4_lm.py", "--workdir={tmp}/wd"], "--config.seeed=1"),
    "train_vocabulary_default": (["experiments/train_vocabulary.py", "--output={tmp}/v.model"],
                                 "--config.task.vocab_sise=8"),
}
SUGGESTIONS = {"--config.seeed=1": "unknown config key 'seeed'; did you mean 'seed'?",
               "--config.model.attentio=hyla": "unknown config key 'model.attentio'; did you "
                                               "mean 'model.attention'?",
               "--config.task.vocab_sise=8": "unknown config key 'task.vocab_sise'; did you "
                                             "mean 'task.vocab_size'?"}


@pytest.mark.parametrize("case", sorted(TYPOS))
def test_unknown_config_key_is_one_line_naming_the_nearest(case, tmp_path):
  argv, override = TYPOS[case]
  argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
  result = tl.run([sys.executable, *argv, override], env=tl.subprocess_env(),
                  cwd=tl.REPO, capture_output=True, text=True)
  program = os.path.basename(argv[0])
  assert result.returncode == 2, result.stderr[-2000:]
  assert result.stderr.splitlines() == [
      f"{program}: error: {override}: {SUGGESTIONS[override]}"], result.stderr[-2000:]
  assert os.listdir(tmp_path) == [], "a refused command wrote a file"


# Populations (issue 25, point 1): every member is checked as the single run it is, before
# any work; before, only member 0's values were (a NaN learning rate froze member 1 at step
# 2 and the run exited 0).
M2 = ({"seed": 0}, {"seed": 1})
POPULATION_CASES = {
    # name: (members, member_names, expected message regex)
    "member_negative_lr": (({"seed": 0}, {"optimizer.learning_rate": -1e-3}), (),
                           r"members\[1\]: config.optimizer.learning_rate=-0.001; allowed: a "
                           r"finite number > 0"),
    "member_nan_lr": (({"seed": 0}, {"optimizer.learning_rate": float("nan")}), (),
                      r"members\[1\]: config.optimizer.learning_rate=nan"),
    "member_zero_lr": (({"seed": 0}, {"optimizer.learning_rate": 0.0}), (),
                       r"members\[1\]: config.optimizer.learning_rate=0.0"),
    "member_bool_lr": (({"seed": 0}, {"optimizer.learning_rate": True}), (),
                       r"members\[1\]: optimizer.learning_rate=True; allowed: a number"),
    "member_none_lr": (({"seed": 0}, {"optimizer.learning_rate": None}), (),
                       r"members\[1\]: optimizer.learning_rate=None; allowed: a number"),
    "member_negative_weight_decay": (({"seed": 0}, {"optimizer.weight_decay": -0.1}), (),
                                     r"members\[1\]: config.optimizer.weight_decay=-0.1"),
    "member_inf_weight_decay": (({"seed": 0}, {"optimizer.weight_decay": float("inf")}), (),
                                r"members\[1\]: config.optimizer.weight_decay=inf"),
    "member_warmup_longer_than_run": (({"seed": 0}, {"optimizer.warmup_steps": 100}), (),
                                      r"members\[1\]: config.optimizer.warmup_steps=100; "
                                      r"allowed: an integer in \[0, config.num_train_steps=8\)"),
    "member_negative_warmup": (({"seed": 0}, {"optimizer.warmup_steps": -1}), (),
                               r"members\[1\]: config.optimizer.warmup_steps=-1"),
    "member_negative_seed": (({"seed": 0}, {"seed": -1}), (),
                             r"members\[1\]: config.seed=-1; allowed: an integer in "
                             r"\[0, 2\*\*32\)"),
    "member_seed_too_big": (({"seed": 0}, {"seed": 2**32}), (),
                            r"members\[1\]: config.seed=4294967296"),
    "member_float_seed": (({"seed": 0}, {"seed": 1.5}), (), r"members\[1\]: seed=1.5"),
    "member_negative_split_seed": (({"seed": 0}, {"task.split_seed": -2}), (),
                                   r"members\[1\]: config.task.split_seed=-2; allowed: None"),
    "member_string_split_seed": (({"seed": 0}, {"task.split_seed": "x"}), (),
                                 r"members\[1\]: config.task.split_seed='x'"),
    "duplicate_members": (({"seed": 1}, {"seed": 1}), (),
                          r"members\[0\] and \[1\] are the same run \({'seed': 1}\)"),
    "member_equal_to_base": (({}, {"seed": 0}), (), r"members\[0\] and \[1\] are the same run"),
    "duplicate_after_float_spelling": (({"optimizer.learning_rate": 1e-3},
                                        {"optimizer.learning_rate": 0.001}), (),
                                       r"members\[0\] and \[1\] are the same run"),
    "dict_instead_of_tuple": ({"seed": 1}, (), r"config.population.members={'seed': 1}; "
                              r"allowed: a tuple of dicts, one per member \(one member needs a "
                              r"trailing comma"),
    "members_a_string": ("seed=1", (), r"config.population.members='seed=1'; allowed: a tuple"),
    "member_not_a_dict": (({"seed": 0}, 3), (), r"members\[1\]=3; allowed: a dict of"),
    "member_unbatchable_key": (({"seed": 0}, {"optimizer.learning_rte": 1.0}), (),
                               r"members\[1\] sets 'optimizer.learning_rte'"),
    "names_without_members": ((), ("a", "b"), r"member_names=\['a', 'b'\] but "
                              r"config.population.members is empty"),
    "name_checkpoints": (M2, ("checkpoints", "b"), r"\('checkpoints' is not allowed\)"),
    "name_config_json": (M2, ("config.json", "b"), r"\('config.json' is not allowed\)"),
    "name_lock": (M2, ("lock.json", "b"), r"\('lock.json' is not allowed\)"),
    "name_population_summary": (M2, ("a", "population_summary.json"),
                                r"\('population_summary.json' is not allowed\)"),
    "name_event_file": (M2, ("events.out.tfevents.1.h", "b"), r"'events.out.tfevents.1.h' is not"),
    "name_dotdot": (M2, ("..", "b"), r"\('..' is not allowed\)"),
    "name_slash": (M2, ("a/b", "b"), r"\('a/b' is not allowed\)"),
    "name_blank": (M2, (" ", "b"), r"\(' ' is not allowed\)"),
    "name_newline": (M2, ("a\nb", "b"), r"is not allowed"),
    "name_not_a_string": (M2, ("a", None), r"\(None is not allowed\)"),
    "names_a_string": (M2, "ab", r"member_names='ab'; allowed: a tuple of directory names"),
    "names_duplicate": (M2, ("a", "a"), r"member_names=\['a', 'a'\]; allowed: one unique"),
    "names_too_many": (M2, ("a", "b", "c"), r"one unique directory name per member \(2 members\)"),
}


def _population(members, names=(), **overrides):
  """A smoke config with `config.population` as `--config.population.*=` sets it (any
  Python literal, not only what the field's type allows)."""
  config = tl.smoke("sraven", **{"eval.ceiling_problems": 0, **overrides})
  with config.unlocked():
    config.population = ml_collections.ConfigDict(dict(members=members, member_names=names))
  return config


@pytest.mark.parametrize("case", sorted(POPULATION_CASES))
def test_population_refused_before_any_work(case, tmp_path):
  members, names, message = POPULATION_CASES[case]
  with pytest.raises(errors.BadInput, match=message):
    loop.train_and_evaluate(_population(members, names), str(tmp_path / "wd"))
  assert os.listdir(tmp_path) == []


def test_population_with_debug_nans_refused_before_any_work(tmp_path):
  """JAX's op-by-op re-run would stop every member at the first one's NaN, where a
  population freezes that member and trains on."""
  with pytest.raises(errors.BadInput, match=r"^config.debug_nans=True with config.population"
                     r".members; allowed: false"):
    loop.train_and_evaluate(_population(M2, debug_nans=True), str(tmp_path / "wd"))
  assert os.listdir(tmp_path) == []


def test_launch_check_runs_the_population_checks():
  """`preflight` (tpu_pod.sh, slurm.sh) refuses a bad member on the laptop (point 6)."""
  with pytest.raises(errors.BadInput, match=r"members\[1\]: config.optimizer.learning_rate"):
    preflight.check("sraven", "model=hyla,size=smoke", "gs://b/wd", [
        "--config.population.members=({'seed': 0}, {'optimizer.learning_rate': -1.0})"])
  with pytest.raises(errors.BadInput, match=r"\('checkpoints' is not allowed\)"):
    preflight.check("sraven", "model=hyla,size=smoke", "gs://b/wd", [
        "--config.population.members=({'seed': 0}, {'seed': 1})",
        "--config.population.member_names=('checkpoints', 'b')"])


# gs:// paths (point 5): refused in one line before any work; before, these named odd
# buckets (`gs://` -> bucket '', `gs:///x` -> bucket 'x') or made a local `./gs:/` folder.
BAD_BUCKET_PATHS = ("gs://", "gs:///x", "gs:/b/run", "GS://b/x", "Gs://b/x", "gs:b/x",
                    "gs://b//x", "gs://B_ad!/x", "gs://-b/x", "gs://b/x/../y", "gs://b/./x",
                    "gcs://b/x", "s3://b/x", "http://b/x", " gs://b/x")


@pytest.mark.parametrize("bad", BAD_BUCKET_PATHS)
def test_malformed_bucket_paths_refused(bad, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(errors.BadInput, match=r"is not a valid bucket path; allowed: "
                     r"gs://<bucket>/<path>"):
    loop.train_and_evaluate(tl.smoke("sraven"), bad)
  with pytest.raises(errors.BadInput, match=r"--root=.* is not a valid bucket path"):
    run_files.path(bad, "--root")
  assert os.listdir(tmp_path) == []


def test_good_paths_pass_unchanged():
  for good in ("gs://b/run", "gs://my-bucket.example.com/a/b/", "runs/a:b", "/tmp/x"):
    assert run_files.check_bucket_path(good) == good


def test_bucket_path_without_gcsfs_names_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, "gcsfs", None)  # `import gcsfs` raises ImportError.
  with pytest.raises(errors.BadInput, match=r"needs gcsfs \(not installed\); allowed: pip "
                     r"install 'hypernet-attention\[gcs\]'"):
    run_files.path("gs://bucket/run")


def test_gcsfs_bucket_type_warning_shown_once_per_bucket(caplog):
  """gcsfs's two warnings (extended_gcsfs: bucket not found, bucket type unknown), each logged
  from one line for every bucket: keyed by the bucket's name, not by the line alone."""
  gcsfs_logger = logging.getLogger("gcsfs")
  with caplog.at_level(logging.WARNING, logger="gcsfs"):
    for i in range(50):
      for bucket in ("bkt1", "bkt2"):
        gcsfs_logger.warning(f"Could not determine bucket type for bucket name {bucket}: "
                             f"error {i}, falling back to GCSFileSystem")
        gcsfs_logger.warning(f"Error: Bucket {bucket} not found or you lack permissions for "
                             "storage layout api used to detect bucket type.")
    gcsfs_logger.warning("something else")
    gcsfs_logger.warning("something else")
  assert [r.getMessage()[:55] for r in caplog.records] == [
      "Could not determine bucket type for bucket name bkt1: e",
      "Error: Bucket bkt1 not found or you lack permissions fo",
      "Could not determine bucket type for bucket name bkt2: e",
      "Error: Bucket bkt2 not found or you lack permissions fo",
      "something else", "something else"]


# One writer per workdir covers the members' directories (point 2).
def _fake_population(root) -> ml_collections.ConfigDict:
  """A population's workdir as its run records it before training (config.json files)."""
  config = _population(M2)
  run_files.check(str(root), config)
  for i, member in enumerate(config_checks.validate(config).members):
    run_files.check(str(root / f"member{i}"), member, population=str(root))
  return config


def test_single_run_into_a_member_directory_refused(tmp_path):
  config = _fake_population(tmp_path / "pop")
  before = tl.snapshot(str(tmp_path))
  member1 = config_checks.member_config(config, 1)
  with pytest.raises(errors.BadInput, match=r"is member 'member1' of the population in "
                     r".*pop, whose run is its only writer; allowed: rerun the population"):
    loop.train_and_evaluate(member1, str(tmp_path / "pop" / "member1"))
  for inside in ("checkpoints", "member1/x", "checkpoints/x"):
    with pytest.raises(errors.BadInput, match=r"is inside the run in .*; allowed: a "
                       r"directory outside any run's workdir"):
      loop.train_and_evaluate(member1, str(tmp_path / "pop" / inside))
  assert tl.snapshot(str(tmp_path)) == before


def test_population_over_a_single_runs_directory_refused(tmp_path):
  (tmp_path / "pop" / "member1" / "checkpoints" / "4").mkdir(parents=True)
  before = tl.snapshot(str(tmp_path))
  with pytest.raises(errors.BadInput, match=r"member directory .*member1' of the "
                     r"population in .* holds a single run's checkpoints or lock"):
    loop.train_and_evaluate(_population(M2), str(tmp_path / "pop"))
  assert tl.snapshot(str(tmp_path)) == before


def test_language_model_population_refused_from_the_config_alone():
  """Before the vocabulary is trained or data are read (issue 25, point 7)."""
  config = config_common.base_config(experiment="c4_lm")
  config.population.members = ({"seed": 0}, {"seed": 1})
  with pytest.raises(errors.BadInput, match=r"population.members set for experiment "
                     r"'c4_lm', which reads host-side data; allowed: populations of sraven, "
                     r"fuzzy_logic"):
    config_checks.check_population(config, registry.get("c4_lm"))


# Missing Google Cloud credentials (issue 25, point 7): one line in well under a second;
# before, gcsfs fell back to anonymous access and retried for ~85 s, then a DNS traceback.
def _never_called(*args, **kwargs):
  raise AssertionError(f"gcsfs was asked {args[1:]} {kwargs}")


def test_missing_gcs_credentials_refused_at_once(monkeypatch):
  import fsspec  # pylint: disable=g-import-not-at-top
  import gcsfs  # pylint: disable=g-import-not-at-top
  import google.auth  # pylint: disable=g-import-not-at-top
  from google.auth import exceptions  # pylint: disable=g-import-not-at-top
  asked = []

  def no_credentials(*args, **kwargs):
    asked.append(args)
    raise exceptions.DefaultCredentialsError("Your default credentials were not found.")

  monkeypatch.setattr(google.auth, "default", no_credentials)
  monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
  monkeypatch.setitem(fsspec.config.conf, "gcs", {})
  # Refused before gcsfs is asked anything (it would retry the metadata server for a minute).
  monkeypatch.setattr(gcsfs.GCSFileSystem, "_call", _never_called, raising=False)
  monkeypatch.setattr(gcsfs.GCSFileSystem, "_info", _never_called, raising=False)
  with pytest.raises(errors.BadInput, match=re.escape(
      "--workdir='gs://no-credentials-bucket/run' is in a bucket, but no Google Cloud "
      "credentials were found; allowed: `gcloud auth application-default login`")):
    run_files.path("gs://no-credentials-bucket/run")
  assert asked
  with pytest.raises(errors.BadInput, match="--root='gs://no-credentials-bucket/x'"):
    run_files.path("gs://no-credentials-bucket/x", "--root")
  # An emulator, or a token named in fsspec's config (anon for a public bucket): no check.
  monkeypatch.setitem(fsspec.config.conf, "gcs", {"token": "anon"})
  assert str(run_files.path("gs://no-credentials-bucket/run")) == "gs://no-credentials-bucket/run"
  monkeypatch.setitem(fsspec.config.conf, "gcs", {})
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:1")
  assert str(run_files.path("gs://no-credentials-bucket/run")) == "gs://no-credentials-bucket/run"
