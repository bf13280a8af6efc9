r"""XManager launcher: one job (or one multi-host job group) per sweep point.

Examples:

  # What would run, without XManager credentials or Docker (prints one command per job):
  # the 312 points of Table A1 SRAVEN as 13 population jobs of 24 members each
  # (`launch/grouping.py`; --single_runs: one job per point, --members_per_job caps):
  python -m launch.xm_launch --sweep=table_a1_sraven --dry_run

  # Vertex AI, one H100 per job:
  xmanager launch launch/xm_launch.py -- --sweep=fig4_sraven_scaling \
      --executor=vertex --accelerator=h100 --accelerator_count=1 \
      --workdir_root=gs://BUCKET/hypernet-attention

  # Vertex AI, 2 hosts x 8 H100 per point: a coordinator plus 1 replica; every process
  # reads its rank from Vertex's CLUSTER_SPEC and joins one jax.distributed run:
  xmanager launch launch/xm_launch.py -- --sweep=table_a1_sraven \
      --executor=vertex --accelerator=h100 --accelerator_count=8 --num_hosts=2 \
      --workdir_root=gs://BUCKET/hypernet-attention

  # Kubernetes (GPU nodes), 2 pods per point with explicit coordinator flags:
  xmanager launch launch/xm_launch.py -- --sweep=table_a1_sraven \
      --executor=kubernetes --accelerator=a100 --accelerator_count=8 --num_hosts=2 \
      --workdir_root=gs://BUCKET/hypernet-attention

The experiment scripts are the same programs a researcher runs by hand; the launcher only
packages the repository once and adds the jobs of each point (`launch.jobs.xm_jobs`). Each
point writes to `<root>/<experiment id>/<point name>`; `launch.collect` tabulates a root.
Without XManager: `launch/run_local.py` (this machine), `launch/tpu_pod.sh` (TPU VM pods),
`launch/slurm.sh` (GPU clusters).
"""

from __future__ import annotations

import os

from absl import flags

from hypernet_attention import errors
from hypernet_attention.runs import cli
from hypernet_attention.runs import registry
from hypernet_attention.runs import run_files
from launch import jobs
from launch import run_local
from launch import sweeps

_SWEEP = flags.DEFINE_enum("sweep", None, sweeps.SWEEPS, "Which sweep to launch.")
_EXECUTOR = flags.DEFINE_enum("executor", "local", ["local", "vertex", "kubernetes"],
                              "Where jobs run.")
_ACCELERATOR = flags.DEFINE_string("accelerator", None,
                                   "xm resource name, e.g. h100, a100, tpu_v5e; none = CPU.")
_ACCELERATOR_COUNT = flags.DEFINE_integer("accelerator_count", 1, "Accelerators per host.")
_TOPOLOGY = flags.DEFINE_string("topology", None, "TPU topology such as 2x4 (overrides count).")
_NUM_HOSTS = flags.DEFINE_integer(
    "num_hosts", 1, "Hosts per point (vertex, kubernetes); they join one jax.distributed run.")
_WORKDIR_ROOT = flags.DEFINE_string(
    "workdir_root", "./workdirs/xm", "Each point writes to <root>/<experiment id>/<point name>.")
_BASE_IMAGE = flags.DEFINE_string("base_image", "python:3.11-slim",
                                  "Container base image for PythonContainer.")
_MAX_JOBS = flags.DEFINE_integer("max_jobs", None, "Launch only the first N points (before "
                                 "grouping into populations).")
run_local.define_population_flags()  # --single_runs, --members_per_job, --dry_run, ...


def dry_run_lines(sweep_name: str, executor: str, num_hosts: int, root: str,
                  max_jobs=None, how: run_local.Grouping = run_local.Grouping()) -> list[str]:
  """One shell line per job (a replicated job once, with its replica count), then a count."""
  sweep = sweeps.load(sweep_name)
  points = run_local.sweep_jobs(sweep, max_jobs, how)
  script = registry.get(sweep.EXPERIMENT).script
  lines = []
  for point in points:
    workdir = f"{root}/dry_run/{jobs.point_name(point)}"
    for job in jobs.xm_jobs(point, sweep.EXPERIMENT, workdir, executor=executor,
                            num_hosts=num_hosts):
      replicas = f"  # x{job.replicas} replicas" if job.replicas > 1 else ""
      lines.append(jobs.shell_line(["python", script, *jobs.flags_list(job.args)]) + replicas)
  lines.append(f"# {len(points)} jobs in sweep {sweep_name}" + (
      f" ({len(sweep.get_sweep()[:max_jobs])} points as populations)"
      if not how.single_runs else ""))
  return lines


def main(argv: list[str]) -> None:
  del argv
  if _SWEEP.value is None:
    raise errors.BadInput(f"--sweep is required; allowed: {', '.join(sweeps.SWEEPS)}")
  for name in ("num_hosts", "accelerator_count", "max_jobs"):
    value = flags.FLAGS[name].value
    if value is not None and value < 1:
      raise errors.BadInput(f"--{name}={value}; allowed: an integer >= 1")
  if _NUM_HOSTS.value > 1 and _EXECUTOR.value not in jobs.MULTI_HOST_EXECUTORS:
    raise errors.BadInput(f"--num_hosts={_NUM_HOSTS.value} needs --executor in "
                              f"{list(jobs.MULTI_HOST_EXECUTORS)}")
  if not _WORKDIR_ROOT.value.strip():
    raise errors.BadInput("--workdir_root=''; allowed: a directory or gs:// path")
  if not run_files.is_remote(_WORKDIR_ROOT.value):  # A file in the way: named now.
    run_files.check_output_dir(_WORKDIR_ROOT.value, "--workdir_root")
  if flags.FLAGS.dry_run:
    print("\n".join(dry_run_lines(_SWEEP.value, _EXECUTOR.value, _NUM_HOSTS.value,
                                  _WORKDIR_ROOT.value, _MAX_JOBS.value,
                                  run_local.Grouping.from_flags())))
    return

  # Imported here so that --dry_run and the sweep definitions need no XManager install.
  try:
    from xmanager import xm  # pylint: disable=g-import-not-at-top
    from xmanager import xm_local  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise errors.BadInput(f"launching needs XManager ({e}); allowed: pip install -e "
                              "'.[launch]', or --dry_run to print the commands") from None

  sweep = sweeps.load(_SWEEP.value)
  points = run_local.sweep_jobs(sweep, _MAX_JOBS.value, run_local.Grouping.from_flags())
  experiment_name = sweep.EXPERIMENT
  executor = getattr(xm_local, _EXECUTOR.value.capitalize())  # Local, Vertex or Kubernetes.
  script = registry.get(experiment_name).script
  directory = os.path.basename(os.getcwd())
  accelerator = _ACCELERATOR.value or ""
  extras = "[tpu]" if accelerator.startswith("tpu") else "[cuda]" if accelerator else ""
  resources = {accelerator: _TOPOLOGY.value or _ACCELERATOR_COUNT.value} if accelerator else {}
  with xm_local.create_experiment(experiment_title=f"hypernet-{_SWEEP.value}") as experiment:
    spec = xm.PythonContainer(
        path=".", base_image=_BASE_IMAGE.value, entrypoint=xm.CommandList([f"python {script}"]),
        # The build context is the parent of `path`; the repository is the folder `directory`.
        docker_instructions=[
            "ENV LANG=C.UTF-8",
            f"COPY {directory}/ /workdir/{directory}",
            f"WORKDIR /workdir/{directory}",
            f"RUN python -m pip install --no-cache-dir -e .{extras}"])
    [executable] = experiment.package(
        [xm.Packageable(executable_spec=spec, executor_spec=executor.Spec())])

    def make_unit(point):
      async def add_jobs(work_unit):
        workdir = f"{_WORKDIR_ROOT.value}/{experiment.experiment_id}/{jobs.point_name(point)}"
        def address(name):  # Kubernetes pods answer at <job label>.experiments.
          from xmanager.cloud import kubernetes  # pylint: disable=g-import-not-at-top
          label = kubernetes.convert_to_valid_label(work_unit.get_full_job_name(name))
          return f"{label}.experiments"
        host_jobs = jobs.xm_jobs(point, experiment_name, workdir, executor=_EXECUTOR.value,
                                 num_hosts=_NUM_HOSTS.value, host_address=address)
        work_unit.add(xm.JobGroup(**{
            job.name: xm.Job(executable=executable, args=job.args, executor=executor(
                requirements=xm.JobRequirements(resources, replicas=job.replicas)))
            for job in host_jobs}))
      return add_jobs

    for point in points:
      experiment.add(make_unit(point))


if __name__ == "__main__":
  cli.run(main)
