"""Processes of one multi-process run meeting at a named point (train/ and tasks/ both do).

Why not `multihost_utils.sync_global_devices` alone: it is a collective, and on CPUs the
first collective sets up Gloo, which waits a fixed 30 s for each peer's key ("Gloo context
initialization failed: ... GetKeyValue() timed out") though peers of one run can be minutes
apart: process 0 training a vocabulary while the others wait, or a loaded machine (the
two-process test failed so under load 8 on 2 cores). A barrier of jax.distributed's
key-value store, which has a timeout of our choosing, brings them together first."""

from __future__ import annotations

import jax
from jax.experimental import multihost_utils

# How long a process waits for the slowest of its peers.
PEER_WAIT_S = 600


def sync(name: str, timeout_s: float = PEER_WAIT_S) -> None:
  """Every process reaches `name` before any goes on; a no-op for one process."""
  if jax.process_count() == 1:
    return
  from jax._src import distributed  # pylint: disable=g-import-not-at-top
  client = distributed.global_state.client
  if client is not None:
    client.wait_at_barrier(name, timeout_in_ms=int(timeout_s * 1000))
  multihost_utils.sync_global_devices(name)
