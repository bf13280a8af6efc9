"""The experiment registry, the sweeps, and the commands every executor would run.

No XManager, gcloud or SLURM needed: command construction is pure (`launch.jobs`), and the
shell launchers run against fake `gcloud` / `srun` programs that record their arguments.
"""

import collections
import json
import os
import subprocess
import sys
import tarfile

import jax
import pytest

from hypernet_attention.runs import config_checks
from hypernet_attention.runs import registry
from hypernet_attention.runs import run_files
from hypernet_attention.train import build
from hypernet_attention.train import objectives
from hypernet_attention.train import runtime
from launch import jobs
from launch import sweeps
from launch import xm_launch

import train_testlib as tl

FUZZY_GRID, SRAVEN_GRID = 2 * 2, 2 * 2 * 2  # The paper's appendix: lr x wd (x warmup).
SEEDS = 3
# Sizes of the paper's grids (the paper's appendix and Table A1, the authors' sweeps/*.yaml).
EXPECTED_JOBS = {
    "table_a1_sraven": 13 * SRAVEN_GRID * SEEDS,  # 10 rows + 3 MoE rows.
    "table_a1_fuzzy": 13 * FUZZY_GRID * SEEDS,
    "table_a1_fuzzy_local": 3 * SEEDS,  # One setting: what a 2-core CPU affords.
    "table_a1_sraven_local": 3 * SEEDS,
    "fig2c_fuzzy": 3 * 4 * 3 * FUZZY_GRID * SEEDS,  # models x N x held-out fraction.
    "fig4_sraven_scaling": 3 * 3 * 3 * 3 * SRAVEN_GRID * SEEDS,  # models x width x depth x data.
    "fig5c_heads_sraven": 3 * 5 * SRAVEN_GRID * SEEDS,  # models x H in {1, 2, 4, 8, 16}.
    "figa5_holdout_sraven": 3 * 4 * SRAVEN_GRID * SEEDS,  # models x held-out fraction.
    "activations_sraven": 5 * SRAVEN_GRID * SEEDS,
    "smoke_fuzzy": 2,
    "smoke_population_fuzzy": 4,
    "c4_lm": 3 * 2 * 2,  # models x lr x wd (Fig. 6), one seed.
}


def _resolve(experiment, point):
  """The config a job would run: the config argument, then each override (an unknown key
  raises, as `--config.<key>=` would)."""
  point = dict(point)
  config = registry.get(experiment).get_config(point.pop("config"))
  for key, value in point.items():
    config_checks.set_dotted(config, key, value)
  return config


def test_registry_records_resolve_and_agree_with_their_objectives():
  for name, experiment in registry.EXPERIMENTS.items():
    assert os.path.exists(os.path.join(tl.REPO, experiment.script))
    config = experiment.get_config("size=smoke")
    assert config.experiment == name
    assert experiment.get_config(experiment.default_config).experiment == name
    if experiment.campaign_config:
      arg = experiment.campaign_config.format(model="hyla", width=1, depth=4)
      assert experiment.get_config(arg).experiment == name
    for ref in (experiment.objective, experiment.memory, experiment.probe):
      assert ref is None or callable(registry.load(ref)), (name, ref)
    if not experiment.on_device:  # Its objective needs a corpus and vocabulary, and its
      continue  # trainer TensorFlow: tests/tasks/test_c4.py, tests/e2e/test_c4_train.py.
    assert callable(registry.load(experiment.train))
    objective = objectives.build(config)
    assert objective.main_metric == experiment.metric
    assert objective.source.on_device
    assert experiment.population == hasattr(objective.task, "split_tables")
  with pytest.raises(ValueError,
                     match=f"unknown experiment 'c4'; allowed: {', '.join(registry.EXPERIMENTS)}"):
    registry.get("c4")


def test_registry_command_line_for_shell_launchers():
  def run(*args):
    return subprocess.run([sys.executable, "-m", "hypernet_attention.runs.registry", *args],
                          capture_output=True, text=True, cwd=tl.REPO, env=tl.subprocess_env())
  assert run("sraven").stdout.split() == ["experiments/sraven_scaling.py",
                                          "experiments/configs/sraven.py"]
  bad = run("nope")
  assert bad.returncode == 2 and f"allowed: {', '.join(registry.EXPERIMENTS)}" in bad.stderr


@pytest.mark.parametrize("name", sweeps.SWEEPS)
def test_every_sweep_point_is_a_valid_distinct_config(name):
  sweep = sweeps.load(name)
  points = sweep.get_sweep()
  assert len(points) == EXPECTED_JOBS[name]
  assert f"{len(points):,} jobs" in sweep.__doc__  # The docstring states the job count.
  seen = collections.Counter()
  # Each distinct model, and task with its split seed and model (what `objectives.build`
  # reads), is built once: fig. 4 has 1,944 points but 27 models and 81 such triples.
  objectives_built, models_built = set(), set()
  for point in points:
    config = _resolve(sweep.EXPERIMENT, point)
    seen[config.to_json(sort_keys=True)] += 1
    model = {k: v for k, v in config.model.items() if v is not None}
    model_key = json.dumps(model, sort_keys=True)
    objective_key = (config.task.to_json(sort_keys=True), config.seed, model_key)
    # C4's objective opens its vocabulary (gs://t5-data, out of reach here): its config is
    # checked by _resolve and the model below.
    if objective_key not in objectives_built and sweep.EXPERIMENT != "c4_lm":
      objectives_built.add(objective_key)
      objectives.build(config)  # Task arguments are valid.
    if model_key not in models_built:
      models_built.add(model_key)
      build.transformer_config(model, input_kind="dense")  # Presets, widths, MoE.
  assert max(seen.values()) == 1, "two jobs of the sweep would run the same config"
  assert len({jobs.point_name(p) for p in points}) == len(points)


@pytest.mark.parametrize("name", ["table_a1_fuzzy", "table_a1_sraven"])
def test_table_a1_grid_is_the_papers(name):
  grid = registry.get(sweeps.load(name).EXPERIMENT).paper.grid
  points = sweeps.load(name).get_sweep()
  settings = collections.Counter(tuple(p[k] for k in grid) for p in points)
  expected = {"table_a1_fuzzy": {(lr, wd) for lr in (1e-3, 3e-3) for wd in (0.03, 0.1)},
              "table_a1_sraven": {(lr, wd, w) for lr in (3e-4, 1e-3) for wd in (0.1, 0.3)
                                  for w in (1000, 3000)}}[name]
  assert set(settings) == expected
  assert set(settings.values()) == {13 * 3}  # Every row and seed at every setting.
  assert sum(p.get("model.feed_forward") == "moe" for p in points) == 3 * len(expected) * 3


def test_heads_sweep_keeps_parameters_equal():
  counts = collections.defaultdict(set)
  for point in sweeps.load("fig5c_heads_sraven").get_sweep():
    # One setting of HYLA (its value network is where H could change parameters).
    setting = (point["optimizer.learning_rate"], point["optimizer.weight_decay"],
               point["optimizer.warmup_steps"], point["seed"])
    if setting != (1e-3, 0.1, 1000, 0) or "model=hyla," not in point["config"]:
      continue
    config = _resolve("sraven", point)
    assert config.model.qk_dim == config.model.v_dim == 64  # Total width, 64/H per head.
    params = sum(x.size for x in jax.tree.leaves(
        build.setup(config_checks.validate(config)).abstract_state.params))
    bias = config.model.num_layers * config.model.num_heads * 36  # T5 table: H x buckets.
    counts[config.model.attention].add(params - bias)
  assert len(counts["hyla"]) == 1, counts


def test_job_args_become_config_flags():
  point = {"config": "model=hyla,size=paper", "model.activation": "silu", "seed": 2}
  args = jobs.job_args(point, "sraven", "/tmp/wd")
  assert args == {"config": "experiments/configs/sraven.py:model=hyla,size=paper",
                  "workdir": "/tmp/wd", "config.model.activation": "silu", "config.seed": "2"}
  assert jobs.local_command("py", point, "sraven", "/tmp/wd") == [
      "py", "experiments/sraven_scaling.py", *[f"--{k}={v}" for k, v in args.items()]]


def test_xm_jobs_single_and_multi_host():
  point = {"config": "model=hyla,size=paper", "seed": 0}
  base = jobs.job_args(point, "sraven", "gs://b/wd")
  assert jobs.xm_jobs(point, "sraven", "gs://b/wd", executor="local") == [
      jobs.HostJob("train", base)]
  vertex = jobs.xm_jobs(point, "sraven", "gs://b/wd", executor="vertex", num_hosts=4)
  assert [(j.name, j.replicas, j.args) for j in vertex] == [
      ("coordinator", 1, base), ("workers", 3, base)]
  k8s = jobs.xm_jobs(point, "sraven", "gs://b/wd", executor="kubernetes", num_hosts=3,
                     host_address=lambda name: f"7-1-{name}.experiments")
  assert [j.name for j in k8s] == ["host0", "host1", "host2"]
  for i, job in enumerate(k8s):
    assert job.args == {**base, "coordinator_address": "7-1-host0.experiments:8476",
                        "num_processes": "3", "process_id": str(i)}
  with pytest.raises(ValueError, match="num_hosts=2 needs a multi-host executor"):
    jobs.xm_jobs(point, "sraven", "wd", executor="local", num_hosts=2)


def test_dry_run_prints_one_command_per_job():
  out = tl.run(
      [sys.executable, "-m", "launch.xm_launch", "--sweep=table_a1_sraven", "--dry_run",
       "--single_runs"],
      env=tl.subprocess_env(), capture_output=True, text=True, cwd=tl.REPO,
      check=True).stdout.splitlines()
  commands = [line for line in out if line.startswith("python experiments/sraven_scaling.py")]
  assert len(commands) == EXPECTED_JOBS["table_a1_sraven"]
  assert sum("--config.model.feed_forward=moe" in c for c in commands) == 3 * SRAVEN_GRID * 3
  assert out[-1] == f"# {len(commands)} jobs in sweep table_a1_sraven"
  vertex = xm_launch.dry_run_lines("smoke_fuzzy", "vertex", 3, "gs://b")
  assert len(vertex) == 2 * 2 + 1 and vertex[1].endswith("# x2 replicas")


def test_unknown_sweep_is_rejected():
  with pytest.raises(ValueError, match="allowed: table_a1_sraven"):
    sweeps.load("table_a2")


def _fake_tools(tmp_path, *names):
  """Programs on PATH that append their argv (one per line, then '---') to a log."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for name in names:
    tool = bin_dir / name
    tool.write_text('#!/usr/bin/env bash\n'
                    'printf "%s\\n" "$@" >> "$FAKE_LOG"\necho --- >> "$FAKE_LOG"\n')
    tool.chmod(0o755)
  env = dict(tl.subprocess_env(), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
             FAKE_LOG=str(tmp_path / "log"))
  return env, tmp_path / "log"


def test_tpu_pod_script_starts_every_host_with_multi_process(tmp_path):
  env, log = _fake_tools(tmp_path, "gcloud")
  env["TMPDIR"] = str(tmp_path)
  tl.run(["bash", "launch/tpu_pod.sh", "pod", "zone", "fuzzy_logic",
          "model=hyla,size=paper", "gs://b/wd", "--config.seed=1"],
         cwd=tl.REPO, env=env, check=True, capture_output=True)
  scp, ssh = log.read_text().split("---\n")[:2]
  assert "--worker=all" in scp.split() and "--worker=all" in ssh.split()
  # The copy holds the package but none of the checkout's virtual environments or workdirs
  # (CI runs this with .venv and .venv312 inside the checkout: a gigabyte if they went along).
  name = os.path.basename(tl.REPO)
  with tarfile.open(tmp_path / f"{name}.tgz") as archive:
    members = archive.getnames()
  assert f"{name}/setup.py" in members and f"{name}/launch/tpu_pod.sh" in members
  tops = {m.split("/")[1] for m in members if "/" in m}
  assert not [t for t in tops if t.startswith((".venv", "workdirs")) or t == ".git"], tops
  remote = ssh.split("--command=")[1]
  assert ("python3 experiments/fuzzy_logic.py --multi_process" in remote
          and "--config=experiments/configs/fuzzy_logic.py:model=hyla\\,size=paper" in remote
          and "--workdir=gs://b/wd --config.seed=1" in remote)
  bad = tl.run(["bash", "launch/tpu_pod.sh", "pod", "zone", "nope", "a", "b"],
               cwd=tl.REPO, env=env, capture_output=True, text=True)
  assert bad.returncode == 2 and "unknown experiment 'nope'" in bad.stderr


def test_slurm_script_runs_one_process_per_node(tmp_path):
  env, log = _fake_tools(tmp_path, "srun")
  env["SLURM_JOB_ID"] = "17"  # Inside the job (on the login node it submits itself).
  tl.run(["bash", "launch/slurm.sh", "sraven", "model=hyla,size=paper", "/shared/wd",
          "--config.seed=2"], cwd=tl.REPO, env=env, check=True)
  assert log.read_text().split("\n---")[0].split("\n") == [
      "--ntasks-per-node=1", "python3", "experiments/sraven_scaling.py",
      "--config=experiments/configs/sraven.py:model=hyla,size=paper", "--workdir=/shared/wd",
      "--config.seed=2"]


SLURM_ENV = {"SLURM_JOB_ID": "17", "SLURM_NTASKS": "4", "SLURM_PROCID": "1",
             "SLURM_LOCALID": "0", "SLURM_STEP_NODELIST": "node[1-4]"}


@pytest.mark.parametrize("env,expected", [
    ({}, None),
    ({"SLURM_JOB_ID": "17", "SLURM_NTASKS": "1"}, None),  # One task: nothing to join.
    (SLURM_ENV, runtime.Cluster("slurm")),
    ({"TPU_WORKER_HOSTNAMES": "t-0,t-1,t-2,t-3", "TPU_WORKER_ID": "2"}, runtime.Cluster("tpu")),
    ({"TPU_WORKER_HOSTNAMES": "t-0", "TPU_WORKER_ID": "0"}, None),  # A single-host slice.
    ({"CLUSTER_SPEC": json.dumps({"cluster": {"workerpool0": ["c:2222"],
                                              "workerpool1": ["w0:2222", "w1:2222"]},
                                  "task": {"type": "workerpool1", "index": 1}})},
     runtime.Cluster("vertex", "c:2222", 3, 2)),
    ({"JAX_COORDINATOR_ADDRESS": "h:1", "JAX_NUM_PROCESSES": "2", "JAX_PROCESS_ID": "1"},
     runtime.Cluster("JAX_COORDINATOR_ADDRESS", "h:1", 2, 1)),
    ({"OMPI_MCA_orte_hnp_uri": "x", "OMPI_COMM_WORLD_SIZE": "2"}, runtime.Cluster("mpi")),
])
def test_detect_cluster_from_environment(env, expected):
  assert runtime.detect_cluster(env) == expected


def test_detect_cluster_flags_win():
  assert runtime.detect_cluster(SLURM_ENV, coordinator_address="a:1", num_processes=2,
                                process_id=0) == runtime.Cluster("flags", "a:1", 2, 0)
  assert runtime.detect_cluster({}, multi_process=True) == runtime.Cluster("--multi_process")


@pytest.mark.parametrize("env,joins", [({}, False), (SLURM_ENV, True)])
def test_initialize_joins_only_named_clusters(monkeypatch, env, joins):
  for key in list(os.environ):
    if key.startswith(("SLURM_", "TPU_", "OMPI_", "JAX_COORDINATOR", "CLUSTER_SPEC",
                       "MEGASCALE_")):
      monkeypatch.delenv(key)
  for key, value in env.items():
    monkeypatch.setenv(key, value)
  calls = []
  monkeypatch.setattr(runtime.jax.distributed, "initialize", lambda **kw: calls.append(kw))
  cluster = runtime.initialize()
  assert (cluster is not None) == joins
  assert calls == ([dict(coordinator_address=None, num_processes=None, process_id=None)]
                   if joins else [])


def test_workdir_guard_with_split_seed(tmp_path):
  """config.json records split_seed None; the same config resumes, a fixed split does not."""
  config = tl.smoke("fuzzy_logic")
  run_files.check(str(tmp_path), config)
  with open(tmp_path / "config.json") as f:
    assert json.load(f)["task"]["split_seed"] is None
  run_files.check(str(tmp_path), tl.smoke("fuzzy_logic"))
  with pytest.raises(ValueError, match="task.split_seed: None -> 0"):
    run_files.check(str(tmp_path), tl.smoke("fuzzy_logic", **{"task.split_seed": 0}))


def test_paper_sweeps_group_into_populations():
  """Table A1: each row's grid x seeds is one population (default cap from the memory
  estimate); a cap splits them; single runs stay available."""
  from launch import grouping  # pylint: disable=g-import-not-at-top
  from launch import run_local  # pylint: disable=g-import-not-at-top
  for name, members in (("table_a1_sraven", SRAVEN_GRID * SEEDS),
                        ("table_a1_fuzzy", FUZZY_GRID * SEEDS)):
    sweep = sweeps.load(name)
    points = sweep.get_sweep()
    grouped = run_local.sweep_jobs(sweep)
    assert len(grouped) == 13 and len(points) == 13 * members
    names = [n for p in grouped for n in p[grouping.NAMES_KEY]]
    assert sorted(names) == sorted(jobs.point_name(p) for p in points)
    for job in grouped:
      assert len(job["population.members"]) == members
      config = grouping.point_config(job, sweep.EXPERIMENT)  # Flags the script accepts.
      assert len(config.population.members) == members
    capped = run_local.sweep_jobs(sweep, how=run_local.Grouping(members_per_job=5))
    assert len(capped) == 13 * -(-members // 5)
    assert run_local.sweep_jobs(sweep, how=run_local.Grouping(single_runs=True)) == points
  lines = xm_launch.dry_run_lines("table_a1_fuzzy", "local", 1, "r")
  assert lines[-1] == "# 13 jobs in sweep table_a1_fuzzy (156 points as populations)"
  assert "--config.population.members=" in lines[0]
