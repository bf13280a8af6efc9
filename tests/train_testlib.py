"""Shared helpers for the training tests (not a test module).

Compilation dominates these tests on a 2-core CPU, so they share a persistent XLA
compilation cache (also handed to their subprocesses): identical programs compile once.
"""

import contextlib
import fcntl
import os
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# The folder of the shared helpers (this file): subprocesses put it on sys.path to import them.
TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
if REPO not in sys.path:
  sys.path.insert(0, REPO)

# pylint: disable=wrong-import-position
# Re-exported: tests reach the experiment configs as tl.sraven_config, tl.fuzzy_config.
from experiments.configs import fuzzy_logic as fuzzy_config  # noqa: E402, F401
from experiments.configs import sraven as sraven_config  # noqa: E402, F401
from hypernet_attention import transformer  # noqa: E402
from hypernet_attention.runs import config_checks
from hypernet_attention.runs import registry  # noqa: E402

# pylint: enable=wrong-import-position

CACHE_DIR = os.path.join(tempfile.gettempdir(), "hypernet_attention_test_xla_cache")
CACHE_ENV = {
    "JAX_COMPILATION_CACHE_DIR": CACHE_DIR,
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}


@pytest.fixture(autouse=True, scope="module")
def compilation_cache():
  keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
          "jax_persistent_cache_min_entry_size_bytes")
  old = {k: getattr(jax.config, k) for k in keys}
  jax.config.update("jax_compilation_cache_dir", CACHE_DIR)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  yield
  for k, v in old.items():
    jax.config.update(k, v)


@contextlib.contextmanager
def multiprocess_slot():
  """At most one multi-process test at a time across pytest-xdist workers.

  Two of them at once on a 2-core machine start their processes seconds apart, and gloo's
  context setup (30 s deadline) then times out.
  """
  with open(os.path.join(tempfile.gettempdir(), "hypernet_attention_multiprocess.lock"),
            "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def reap(procs, timeout_s: float) -> list[str]:
  """Waits for every (process, open log file) pair, killing any still running after
  `timeout_s` (or when the wait fails); closes the logs and returns their texts."""
  try:
    for proc, _ in procs:
      proc.wait(timeout=timeout_s)
  finally:
    texts = []
    for proc, log in procs:
      if proc.poll() is None:
        proc.kill()
        proc.wait()
      log.close()
      with open(log.name) as f:
        texts.append(f.read())
  return texts


def subprocess_env() -> dict:
  env = dict(os.environ, **CACHE_ENV)
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  env.pop("XLA_FLAGS", None)
  return env


def smoke(experiment: str = "sraven", model: str = "hyla", **updates):
  """The smoke config of an experiment, with top-level or dotted-key updates."""
  config = registry.get(experiment).get_config(f"model={model},size=smoke")
  for key, value in updates.items():
    config_checks.set_dotted(config, key, value)
  return config


def token_model_params(model_config, seq_len: int = 8, seed: int = 0):
  """Initialized (boxed) params of `Transformer(model_config)` for a (1, seq_len) token input."""
  model = transformer.Transformer(model_config)
  return model.init(jax.random.PRNGKey(seed), jnp.zeros((1, seq_len), jnp.int32))["params"]


def flat_params(params) -> dict:
  return {jax.tree_util.keystr(p): np.asarray(jax.device_get(x))
          for p, x in jax.tree_util.tree_leaves_with_path(params)}


def snapshot(directory: str) -> dict:
  """path -> (size, mtime) of every file under `directory`."""
  out = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      st = os.stat(path)
      out[path] = (st.st_size, st.st_mtime_ns)
  return out


# The body of a fake `tensorflow` package that a test puts first on a subprocess's path: its
# import fails as on a machine without TensorFlow (tests/repo/test_no_tensorflow.py, the Grain
# path's tests/e2e/test_c4_grain.py).
TENSORFLOW_BLOCKER = ("raise ModuleNotFoundError(\"No module named 'tensorflow' (hidden by "
                      "tests/repo/test_no_tensorflow.py)\", name='tensorflow')\n")
