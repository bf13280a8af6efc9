r"""XManager launcher: one job per sweep point, on a local, Vertex AI or Kubernetes executor.

Examples:

  # What would run, without XManager credentials or Docker (prints one command per job):
  python -m launch.xm_launch --sweep=table_a1_sraven --dry_run

  # Vertex AI, one H100 per job:
  xmanager launch launch/xm_launch.py -- --sweep=fig4_sraven_scaling \
      --executor=vertex --accelerator=h100 --accelerator_count=1 \
      --workdir_root=gs://BUCKET/hypernet-attention

  # GKE with a TPU v5e slice per job (multi-host: every host runs the same program and
  # `jax.distributed.initialize()` finds its peers):
  xmanager launch launch/xm_launch.py -- --sweep=table_a1_sraven \
      --executor=kubernetes --accelerator=tpu_v5e --topology=2x4 \
      --workdir_root=gs://BUCKET/hypernet-attention

The experiment scripts are the same programs a researcher runs by hand; the launcher only
packages the repository once and adds one job per point of a sweep (`launch/sweeps/`).
Without XManager, `launch/tpu_pod.sh` runs one point on a TPU pod with plain gcloud.
"""

from __future__ import annotations

import os
import shlex
from typing import Any

from absl import app
from absl import flags

from launch import sweeps

_SWEEP = flags.DEFINE_enum("sweep", None, sweeps.SWEEPS, "Which sweep to launch.")
_EXECUTOR = flags.DEFINE_enum(
    "executor", "local", ["local", "vertex", "kubernetes"], "Where jobs run."
)
_ACCELERATOR = flags.DEFINE_string(
    "accelerator", None, "xm resource name, e.g. h100, a100, tpu_v5e; none = CPU."
)
_ACCELERATOR_COUNT = flags.DEFINE_integer("accelerator_count", 1, "Accelerators per job.")
_TOPOLOGY = flags.DEFINE_string("topology", None, "TPU topology such as 2x4 (overrides count).")
_WORKDIR_ROOT = flags.DEFINE_string(
    "workdir_root", "./workdirs/xm", "Each job writes to <root>/<experiment id>/<job index>."
)
_BASE_IMAGE = flags.DEFINE_string(
    "base_image", "python:3.11-slim", "Container base image for PythonContainer."
)
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the jobs' commands and exit.")
_MAX_JOBS = flags.DEFINE_integer("max_jobs", None, "Launch only the first N points.")


def job_args(point: dict[str, Any], experiment: str, workdir: str) -> dict[str, str]:
  """Turns a sweep point into the experiment script's flags."""
  point = dict(point)
  config = point.pop("config")
  args = {"config": f"experiments/configs/{_config_file(experiment)}:{config}",
          "workdir": workdir}
  for key, value in point.items():
    args[f"config.{key}"] = str(value)
  return args


def _config_file(experiment: str) -> str:
  return {"sraven_scaling": "sraven.py", "fuzzy_logic": "fuzzy_logic.py"}[experiment]


def _requirements(xm):
  if not _ACCELERATOR.value:
    return xm.JobRequirements()
  amount = _TOPOLOGY.value or _ACCELERATOR_COUNT.value
  return xm.JobRequirements({_ACCELERATOR.value: amount})


def _executor(xm, xm_local):
  requirements = _requirements(xm)
  if _EXECUTOR.value == "vertex":
    return xm_local.Vertex(requirements=requirements), xm_local.Vertex.Spec()
  if _EXECUTOR.value == "kubernetes":
    return xm_local.Kubernetes(requirements=requirements), xm_local.Kubernetes.Spec()
  return xm_local.Local(requirements=requirements), xm_local.Local.Spec()


def main(argv: list[str]) -> None:
  del argv
  if _SWEEP.value is None:
    raise app.UsageError(f"--sweep is required; allowed: {', '.join(sweeps.SWEEPS)}.")
  sweep = sweeps.load(_SWEEP.value)
  points = sweep.get_sweep()[: _MAX_JOBS.value]
  experiment_name = sweep.EXPERIMENT

  if _DRY_RUN.value:
    for index, point in enumerate(points):
      args = job_args(point, experiment_name, f"{_WORKDIR_ROOT.value}/dry_run/{index}")
      flags_str = " ".join(f"--{k}={shlex.quote(v)}" for k, v in args.items())
      print(f"python experiments/{experiment_name}.py {flags_str}")
    print(f"# {len(points)} jobs in sweep {_SWEEP.value}")
    return

  # Imported here so that --dry_run and the sweep definitions need no XManager install.
  from xmanager import xm  # pylint: disable=g-import-not-at-top
  from xmanager import xm_local  # pylint: disable=g-import-not-at-top

  executor, executor_spec = _executor(xm, xm_local)
  directory = os.path.basename(os.getcwd())
  accelerator = _ACCELERATOR.value or ""
  extras = "[tpu]" if accelerator.startswith("tpu") else "[cuda]" if accelerator else ""
  with xm_local.create_experiment(experiment_title=f"hypernet-{_SWEEP.value}") as experiment:
    spec = xm.PythonContainer(
        path=".",
        base_image=_BASE_IMAGE.value,
        entrypoint=xm.CommandList([f"python experiments/{experiment_name}.py"]),
        # The build context is the parent of `path`; the repository is the folder `directory`.
        docker_instructions=[
            "ENV LANG=C.UTF-8",
            f"COPY {directory}/ /workdir/{directory}",
            f"WORKDIR /workdir/{directory}",
            f"RUN python -m pip install --no-cache-dir -e .{extras}",
        ],
    )
    [executable] = experiment.package(
        [xm.Packageable(executable_spec=spec, executor_spec=executor_spec)]
    )
    for index, point in enumerate(points):
      workdir = f"{_WORKDIR_ROOT.value}/{experiment.experiment_id}/{index}"
      experiment.add(
          xm.Job(
              executable=executable,
              executor=executor,
              args=job_args(point, experiment_name, workdir),
          )
      )


if __name__ == "__main__":
  app.run(main)
