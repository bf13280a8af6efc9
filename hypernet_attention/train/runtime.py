"""Process start-up shared by the entry points: `jax.distributed` and topology logging.

Multi-process runs are recognised by explicit flags (`--num_processes>1`, a coordinator
address) or by `--multi_process` for clusters where `jax.distributed.initialize()` detects
everything itself (Cloud TPU pods, SLURM, Open MPI).
"""

from __future__ import annotations

import os
import time
from typing import Optional

from absl import flags
from absl import logging
import jax

from hypernet_attention.train import config_lib

flags.DEFINE_bool("multi_process", False,
                  "Call jax.distributed.initialize() with auto-detection (TPU pods, SLURM).")
flags.DEFINE_string("coordinator_address", None, "host:port of process 0 (multi-process).")
flags.DEFINE_integer("num_processes", None, "Number of processes (multi-process).")
flags.DEFINE_integer("process_id", None, "This process's index (multi-process).")
flags.DEFINE_string("cpu_collectives", None,
                    "CPU cross-process collectives, e.g. 'gloo' for several CPU processes.")


def initialize(multi_process: bool = False, coordinator_address: Optional[str] = None,
               num_processes: Optional[int] = None, process_id: Optional[int] = None,
               cpu_collectives: Optional[str] = None) -> None:
  """Starts `jax.distributed` when asked to; a no-op for one process."""
  if cpu_collectives:
    jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
  explicit = coordinator_address is not None or (num_processes or 1) > 1
  if multi_process or explicit:
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)


def initialize_from_flags() -> None:
  f = flags.FLAGS
  initialize(f.multi_process, f.coordinator_address, f.num_processes, f.process_id,
             f.cpu_collectives)


def log_topology() -> str:
  line = (f"process {jax.process_index()}/{jax.process_count()}, "
          f"{jax.local_device_count()} local / {jax.device_count()} global devices, "
          f"backend {jax.default_backend()}, kind {jax.devices()[0].device_kind}, "
          f"host {os.uname().nodename}")
  logging.info("Topology: %s", line)
  return line


def fresh_workdir(name: str, root: str = "workdirs") -> str:
  """`<root>/<name>_<UTC time>`; multi-process runs must pass --workdir (clocks differ)."""
  if jax.process_count() > 1:
    raise config_lib.BadInput("multi-process runs need an explicit --workdir shared by all "
                              "processes")
  return os.path.join(root, f"{name}_{time.strftime('%Y%m%d_%H%M%S', time.gmtime())}")
