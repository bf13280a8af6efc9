"""Shared fixtures, and the suite's persistent compilation cache.

Compilation dominates the suite on a 2-core CPU, and its tests and the processes they start
(trainers, campaign runners, multi-process runs) compile the same programs again and again.
One JAX persistent compilation cache per pytest session, shared by every xdist worker and
every subprocess (through the environment, which they inherit), compiles each program once.
A cached executable is the compiled one, so results stay bit-identical; traces are not
cached, so tests/e2e/test_compile_once.py still counts every re-trace. The cache lives in a
fresh temporary folder (deleted when the session ends), so it is never warm from another
session, another checkout or another jax; `JAX_COMPILATION_CACHE_DIR` set beforehand is used
instead (and kept).
"""

import os
import shutil
import tempfile

import jax
import pytest

# The environment form of each option: read by every process the suite starts, whose jax
# is imported after it is set. Entries of any size and any compile time are kept (-1: no
# minimum size, as jax 0.10.2 to 0.12 read it; 0 would mean "jax's default").
CACHE_ENV = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
}
_created_cache_dir = None  # The folder this process made (the session's first), to delete.

# Mosaic GPU's interpreter runs each warpgroup of a block as its own XLA computation, started
# from a Python thread by a callback of the kernel's computation that then waits for them all.
# Each computation's callbacks (a barrier wait among them) need a thread of XLA's CPU pool, one
# per core by default: on 2 cores the parent's callback holds one and the two-warpgroup dS kernel
# (`Blocks.ds_two_warpgroups`) gets one thread for two warpgroups; when its second warpgroup takes
# it first and waits for the Q tile the first loads, neither moves again (a hang in 2 of 3 runs).
# Three threads (parent + two warpgroups) suffice. NPROC sizes the pool (XLA's CPU client); jax
# reads it when it first starts its CPU backend, after this import, here and in every process
# the suite starts.
if int(os.environ.get("NPROC") or os.cpu_count() or 1) < 3:
  os.environ["NPROC"] = "3"


@pytest.fixture
def x64():
  """Runs the test with 64-bit floats enabled (sharper equivalence checks), then resets."""
  previous = jax.config.jax_enable_x64
  jax.config.update("jax_enable_x64", True)
  try:
    yield
  finally:
    jax.config.update("jax_enable_x64", previous)


def pytest_configure(config):
  """Points this process, its xdist workers and its subprocesses at one compilation cache.

  The controller (or a run without xdist) runs first and exports the folder; the workers it
  then starts inherit the environment and find it set."""
  global _created_cache_dir
  if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    _created_cache_dir = tempfile.mkdtemp(prefix="hypernet_attention_xla_cache_")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _created_cache_dir
  os.environ.update(CACHE_ENV)
  # jax read its environment when conftest imported it: set this process's options too.
  jax.config.update("jax_compilation_cache_dir", os.environ["JAX_COMPILATION_CACHE_DIR"])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
  # Markers are registered in pytest.ini.
  # On Python 3.13, TensorFlow's autograph (the C4 input pipeline) builds AST nodes through
  # gast with keyword arguments Python 3.15 will refuse: thousands of warnings per run, in
  # TensorFlow's dependency, not in this code; to be gone with a gast release that follows.
  config.addinivalue_line(
      "filterwarnings", "ignore::DeprecationWarning:gast.astn")


def pytest_collection_modifyitems(config, items):
  """`TESTS_REVERSED=1` runs the suite in reverse order: no test may depend on another
  having run first (or on which process compiled first)."""
  del config
  if os.environ.get("TESTS_REVERSED") == "1":
    items.reverse()


def pytest_unconfigure(config):
  del config
  if _created_cache_dir:
    shutil.rmtree(_created_cache_dir, ignore_errors=True)
