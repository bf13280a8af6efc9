"""The suite's compilation cache (tests/conftest.py) reaches the processes tests start.

The suite fits its time budget because a program that one process compiled is read, not
compiled again, by the next process that needs it (trainers, campaign runners, the
processes of a multi-process run). These tests start two processes the way tests do (the
inherited environment, nothing passed by hand) that compile the same new program: the
first writes it to the session's cache, the second reads it back, a cache hit that JAX
itself reports, and computes the same bits.
"""

import os
import sys
import uuid

import train_testlib as tl

# Compiles a program no other test has (a fresh constant), then prints JAX's own count of
# persistent-cache hits and the result's bits.
PROGRAM = """
import sys
import jax
import jax.numpy as jnp
import numpy as np
HIT = "/jax/compilation_cache/cache_hits"
hits = []
jax.monitoring.register_event_listener(lambda event, **kw: hits.append(event == HIT))
salt = float(sys.argv[1])
x = np.arange(12.0, dtype=np.float32).reshape(3, 4)  # numpy: no program of its own
result = np.asarray(jax.jit(lambda x: jnp.sin(x * salt) @ x.T)(x))
print(sum(hits), result.tobytes().hex())
"""


def _start(salt: str, env: dict) -> tuple[int, str]:
  result = tl.run([sys.executable, "-c", PROGRAM, salt], env=env, capture_output=True,
                  text=True, check=True)
  hits, bits = result.stdout.split()
  return int(hits), bits


def test_a_program_compiled_by_one_process_is_read_by_the_next():
  cache = os.environ.get("JAX_COMPILATION_CACHE_DIR")
  assert cache and os.path.isdir(cache), "tests/conftest.py sets the session's cache"
  salt = str(1 + uuid.uuid4().int % 1000 / 1000)  # A program new to this session's cache.
  env = dict(os.environ)
  first_hits, first_bits = _start(salt, env)
  second_hits, second_bits = _start(salt, env)
  assert (first_hits, second_hits) == (0, 1)
  assert second_bits == first_bits  # The cached executable is the compiled one.


def test_without_the_cache_the_next_process_compiles_again():
  """The check above can fail: with the cache off, the second process gets no hit."""
  salt = str(2 + uuid.uuid4().int % 1000 / 1000)
  env = dict(os.environ, JAX_ENABLE_COMPILATION_CACHE="false")
  assert [_start(salt, env)[0] for _ in range(2)] == [0, 0]
