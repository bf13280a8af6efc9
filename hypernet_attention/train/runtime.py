"""Process start-up shared by the entry points: `jax.distributed` and topology logging.

Every host of a multi-host job must join one `jax.distributed` run, or each would train its
own copy into the same workdir. `start()` (the entry points' one call) joins whenever the
environment names a cluster (`detect_cluster`), the flax-examples way: on auto-detected
clusters `jax.distributed.initialize()` without arguments finds its peers itself.
  flags          --coordinator_address / --num_processes>1 / --process_id (any machines)
  JAX env        JAX_COORDINATOR_ADDRESS (+ JAX_NUM_PROCESSES, JAX_PROCESS_ID)
  Vertex AI      CLUSTER_SPEC with more than one replica (workerpool0[0] coordinates)
  Cloud TPU      TPU_WORKER_HOSTNAMES / TPU_PROCESS_ADDRESSES with several hosts, or
                 MEGASCALE_COORDINATOR_ADDRESS (multislice); on TPU VM pods started over
                 ssh pass --multi_process (there the metadata server names the peers)
  SLURM          srun with SLURM_NTASKS > 1 (JAX reads SLURM's variables)
  Open MPI       mpirun with OMPI_COMM_WORLD_SIZE > 1
  --multi_process  any other environment `jax.distributed.initialize()` detects."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any, Callable, Mapping, Optional

from absl import flags
from absl import logging
import jax
import ml_collections

from hypernet_attention import errors
from hypernet_attention.runs import cli
from hypernet_attention.runs import config_checks
from hypernet_attention.runs import registry

flags.DEFINE_bool("multi_process", False,
                  "Call jax.distributed.initialize() with auto-detection even where "
                  "`detect_cluster` sees no cluster (TPU VM pods started over ssh).")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-process).")
flags.DEFINE_integer("num_processes", None, "Number of processes (multi-process).")
flags.DEFINE_integer("process_id", None, "This process's index (multi-process).")
flags.DEFINE_string("cpu_collectives", None,
                    "CPU cross-process collectives, e.g. 'gloo' for several CPU processes.")


@dataclasses.dataclass(frozen=True)
class Cluster:
  """How this process joins a multi-process run: what `jax.distributed.initialize` gets
  (None: JAX detects it from the environment)."""
  source: str  # What named the cluster: "flags", "JAX_COORDINATOR_ADDRESS", "vertex", ...
  coordinator_address: Optional[str] = None
  num_processes: Optional[int] = None
  process_id: Optional[int] = None


def _int(env: Mapping[str, str], key: str) -> Optional[int]:
  return int(env[key]) if env.get(key) else None


def _vertex(cluster_spec: str) -> Optional[Cluster]:
  """Vertex AI's CLUSTER_SPEC: replicas listed per worker pool; this task's pool and index."""
  spec = json.loads(cluster_spec)
  pools = spec.get("cluster", {})
  total, rank = 0, None
  for pool, hosts in pools.items():
    if pool == spec["task"]["type"]:
      rank = total + int(spec["task"]["index"])
    total += len(hosts)
  if total <= 1:
    return None
  return Cluster("vertex", pools["workerpool0"][0], total, rank)


def detect_cluster(env: Mapping[str, str], *, multi_process: bool = False,
                   coordinator_address: Optional[str] = None, num_processes: Optional[int] = None,
                   process_id: Optional[int] = None) -> Optional[Cluster]:
  """The cluster this process belongs to, or None for a single-process run (pure: reads
  only `env` and the flags' values, so tests can fake any environment)."""
  if coordinator_address is not None or (num_processes or 1) > 1:
    return Cluster("flags", coordinator_address, num_processes, process_id)
  if env.get("JAX_COORDINATOR_ADDRESS"):
    return Cluster("JAX_COORDINATOR_ADDRESS", env["JAX_COORDINATOR_ADDRESS"],
                   _int(env, "JAX_NUM_PROCESSES"), _int(env, "JAX_PROCESS_ID"))
  if env.get("CLUSTER_SPEC"):
    return _vertex(env["CLUSTER_SPEC"])
  hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES") or ""
  if len([h for h in hosts.split(",") if h]) > 1 or env.get("MEGASCALE_COORDINATOR_ADDRESS"):
    return Cluster("tpu")
  if env.get("SLURM_JOB_ID") and (_int(env, "SLURM_NTASKS") or 1) > 1:
    return Cluster("slurm")
  if env.get("OMPI_MCA_orte_hnp_uri") and (_int(env, "OMPI_COMM_WORLD_SIZE") or 1) > 1:
    return Cluster("mpi")
  if multi_process:
    return Cluster("--multi_process")
  return None


def initialize(multi_process: bool = False, coordinator_address: Optional[str] = None,
               num_processes: Optional[int] = None, process_id: Optional[int] = None,
               cpu_collectives: Optional[str] = None) -> Optional[Cluster]:
  """Joins `jax.distributed` when the flags or the environment name a cluster; a no-op for
  one process. Returns the cluster joined (None: single process)."""
  if cpu_collectives:
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
  cluster = detect_cluster(os.environ, multi_process=multi_process,
                           coordinator_address=coordinator_address,
                           num_processes=num_processes, process_id=process_id)
  if cluster is not None:
    logging.info("Joining a multi-process run: %s", cluster)
    jax.distributed.initialize(coordinator_address=cluster.coordinator_address,
                               num_processes=cluster.num_processes, process_id=cluster.process_id)
  return cluster


def start() -> str:
  """The entry points' start-up: join the cluster if any, then log the topology."""
  f = flags.FLAGS
  initialize(f.multi_process, f.coordinator_address, f.num_processes, f.process_id,
             f.cpu_collectives)
  return log_topology()


def log_topology() -> str:
  line = (f"process {jax.process_index()}/{jax.process_count()}, {jax.local_device_count()} local "
          f"/ {jax.device_count()} global devices, backend {jax.default_backend()}, kind "
          f"{jax.devices()[0].device_kind}, host {os.uname().nodename}")
  logging.info("Topology: %s", line)
  return line


def fresh_workdir(name: str, root: str = "workdirs") -> str:
  """`<root>/<name>_<UTC time>`; multi-process runs must pass --workdir (clocks differ)."""
  if jax.process_count() > 1:
    raise errors.BadInput("multi-process runs need an explicit --workdir shared by all processes")
  return os.path.join(root, f"{name}_{time.strftime('%Y%m%d_%H%M%S', time.gmtime())}")


def define_run_flags(config_flag: Optional[str]):
  """The `--config` (locked, as `config_flag` by default) and `--workdir` flags every
  training entry point has; returns their holders."""
  config = cli.define_config(config_flag, "Experiment config file and its argument.")
  workdir = flags.DEFINE_string("workdir", None, "Output directory (default: a fresh one "
                                "under ./workdirs/).")
  return config, workdir


def train_experiment(config: ml_collections.ConfigDict | config_checks.Checked,
                     workdir: Optional[str] = None) -> Any:
  """Trains the config with the record's `train` (the loop, or the language model's) into
  `workdir`, or a fresh one named after it; a plain config (a library caller) is validated
  first, a `config_checks.Checked` taken as it is."""
  checked = config_checks.validate(config)
  experiment = checked.experiment
  train = registry.load(experiment.train)
  return train(checked, fresh_workdir(experiment.name) if workdir is None else workdir)


def experiment_main(name: Optional[str] = None) -> Callable[[Any], None]:
  """The `main(argv)` of the training entry point: the run flags, `config_checks.validate`,
  start-up (`start`), then `train_experiment`. `name`: `--config` defaults to that experiment's
  `default_config` (the per-task scripts); None: `--config` is required (experiments/train.py)."""
  default = registry.get(name).config_flag(absolute=True) if name else None
  config, workdir = define_run_flags(default)

  def main(argv):
    del argv
    if config.value is None:
      raise errors.BadInput(f"--config is required; {cli.CONFIGS_ALLOWED}")
    checked = config_checks.validate(config.value)  # Refused before start-up.
    start()
    train_experiment(checked, workdir.value)
  return main
