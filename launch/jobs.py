"""A sweep point -> the command that runs it, for every executor (pure functions, no I/O).

Every launcher builds its command line here so that a test can check them without XManager, gcloud
or SLURM: the point's flags (`job_args`), its workdir name (`point_name`), the argv of the local
executor (`local_command`) and the XManager jobs of a point, multi-host included (`xm_jobs`)."""

from __future__ import annotations

import dataclasses
import shlex
from typing import Any, Mapping, Optional, Sequence

from hypernet_attention.runs import registry
from launch import grouping


def job_args(point: Mapping[str, Any], experiment: str, workdir: str) -> dict[str, str]:
  """A sweep point's flags for the experiment's entry point: `--config=`, `--workdir=` and
  one `--config.<key>=` override per other key of the point."""
  return {"config": registry.get(experiment).config_flag(point["config"]), "workdir": workdir,
          **{f"config.{k}": str(v) for k, v in point.items() if k != "config"}}


def point_name(point: Mapping[str, Any]) -> str:
  """A readable, unique directory name for a point: its config argument, then the overrides
  in the point's order (`model=hyla,size=local,optimizer.learning_rate=0.001,seed=0`).
  A population point: its shared overrides, then `population=<P>x<hash>`."""
  if grouping.MEMBERS_KEY in point:
    common = {k: v for k, v in point.items() if k not in (grouping.MEMBERS_KEY, grouping.NAMES_KEY)}
    return grouping.population_name(point_name(common), point[grouping.NAMES_KEY])
  parts = [point["config"]] + [f"{k}={v}" for k, v in point.items() if k != "config"]
  return ",".join(parts).replace("/", "_").replace(" ", "")


def populations(points: Sequence[Mapping[str, Any]], experiment: str,
                max_members: Optional[int] = None,
                budget_gib: float = grouping.DEFAULT_BUDGET_GIB) -> list[dict[str, Any]]:
  """The sweep's points as population jobs (`launch.grouping`); members are named by
  `point_name`. `max_members` None: each group's cap from its memory estimate."""
  return grouping.group(points, max_members, point_name, lambda common: (
      grouping.default_max_members(grouping.point_config(common, experiment), budget_gib)))


def flags_list(args: Mapping[str, str]) -> list[str]:
  return [f"--{key}={value}" for key, value in args.items()]


def local_command(python: str, point: Mapping[str, Any], experiment: str,
                  workdir: str) -> list[str]:
  """argv of one point as a local process: `python <script> --config=... --workdir=...`."""
  script = registry.get(experiment).script
  return [python, script, *flags_list(job_args(point, experiment, workdir))]


def shell_line(argv: Sequence[str]) -> str:
  return " ".join(shlex.quote(a) for a in argv)


# Port of the `jax.distributed` coordinator on host 0 when the launcher names it.
COORDINATOR_PORT = 8476
MULTI_HOST_EXECUTORS = ("vertex", "kubernetes")


@dataclasses.dataclass(frozen=True)
class HostJob:
  """One XManager job of a sweep point: a name, its flags, and identical replicas."""
  name: str
  args: dict[str, str]
  replicas: int = 1


def xm_jobs(point: Mapping[str, Any], experiment: str, workdir: str, *, executor: str,
            num_hosts: int = 1, host_address=lambda name: name) -> list[HostJob]:
  """The jobs one point becomes: one job, or for `num_hosts > 1` one job group whose
  processes join one `jax.distributed` run.

  Vertex AI: a coordinator job and a pool of `num_hosts - 1` replicas (Vertex forbids replicas in a
  group's first job); each process finds its rank in CLUSTER_SPEC (`runtime.detect_cluster`).
  Kubernetes: xmanager has no replicas there, so `num_hosts` jobs `host<i>` get explicit coordinator
  flags; `host_address(name)` is job `name`'s DNS name (the launcher knows it from the work unit).
  """
  args = job_args(point, experiment, workdir)
  if not isinstance(num_hosts, int) or num_hosts < 1:
    raise ValueError(f"num_hosts={num_hosts!r}; allowed: an integer >= 1")
  if num_hosts == 1:
    return [HostJob("train", args)]
  if executor == "vertex":
    return [HostJob("coordinator", args), HostJob("workers", args, num_hosts - 1)]
  if executor == "kubernetes":
    coordinator = f"{host_address('host0')}:{COORDINATOR_PORT}"
    return [HostJob(f"host{i}", {**args, "coordinator_address": coordinator,
                                 "num_processes": str(num_hosts), "process_id": str(i)})
            for i in range(num_hosts)]
  raise ValueError(f"num_hosts={num_hosts} needs a multi-host executor; allowed: "
                   f"{', '.join(MULTI_HOST_EXECUTORS)} (TPU VM pods: launch/tpu_pod.sh, "
                   "SLURM: launch/slurm.sh)")
