"""Compile once, proven: a whole run traces its jitted train chunk and evaluation once.

The most common silent slowdown of a JAX training loop is a jitted step that re-traces (a
Python scalar that changes, a shape that drifts, a weak type, a function re-jitted per call):
it runs correctly and only a profile shows it. These tests run the public entry point,
`loop.train_and_evaluate`, through a smoke run with several chunks, evaluations, a
checkpoint and a resume (single run: every on-device experiment of the registry; population:
every one that trains populations, so a new task's record adds it), and count every
trace JAX records through its own monitoring hook (the jaxpr-trace event, which carries the
traced function's name), so they need nothing from the loop's internals. A run is one
process invocation: a resume is a new invocation and traces again, once.
"""

import collections
import contextlib
import functools

import jax
import pytest

from hypernet_attention.runs import registry
from hypernet_attention.train import loop

import train_testlib as tl

pytestmark = pytest.mark.e2e  # Drives the whole training loop (tests/pytest.ini).

# JAX records this event each time it traces a Python function to a jaxpr (cache misses
# only), with `fun_name`; `jax.monitoring` is its public listener API.
TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
# The jitted functions a run calls repeatedly: the scanned train chunk (static length) and
# the evaluation (single run and population alike).
REPEATED = ("chunk", "evaluate")


@contextlib.contextmanager
def count_traces():
  """Yields a Counter {function name: traces} filled while the block runs."""
  counts = collections.Counter()

  def listener(event, duration, **kwargs):
    del duration
    if event == TRACE_EVENT:
      counts[kwargs.get("fun_name")] += 1

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield counts
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


def assert_traced_once(counts, names=REPEATED):
  """Fails like `chex.assert_max_traces(n=1)`: naming the function and its trace count."""
  for name in names:
    assert counts[name] == 1, (
        f"{name} traced {counts[name]} times in one run; expected once (a re-trace per call "
        f"recompiles: a changing Python scalar, a drifting shape or weak type, a re-jit). "
        f"All traces: {dict(counts)}")


def _config(experiment, population, **updates):
  # 8 steps in chunks of 2: 4 chunks, evaluations and checkpoints at steps 4 and 8.
  # Ceilings (SRAVEN's) are a host-side estimate, no jitted step of the run.
  updates = {"steps_per_loop": 2, "log_every_steps": 2, "eval.ceiling_problems": 0, **updates}
  if population:
    updates["population.members"] = ({"seed": 0}, {"seed": 1})
  config = tl.smoke(experiment, "softmax", **updates)
  config.async_checkpoints = False
  return config


@pytest.mark.parametrize("experiment, population", [
    pytest.param(e, p, id=f"{e}-{'population' if p else 'single'}")
    for p, names in ((False, registry.names(on_device=True)),
                     (True, registry.names(population=True))) for e in names])
def test_run_and_resume_trace_each_step_function_once(experiment, population, tmp_path):
  workdir = str(tmp_path / "wd")
  # Steps 1-4: two chunks, an evaluation and a checkpoint at step 4, then the run stops.
  with count_traces() as first:
    loop.train_and_evaluate(_config(experiment, population, stop_after_steps=4), workdir)
  assert_traced_once(first)
  # Resumed from the checkpoint: two more chunks, the evaluation at step 8, a checkpoint.
  with count_traces() as resumed:
    loop.train_and_evaluate(_config(experiment, population), workdir)
  assert_traced_once(resumed)


def test_a_train_chunk_rejitted_per_call_is_caught(tmp_path, monkeypatch):
  """The counter can fail: the classic bug of a jit built inside the loop (each call a new
  function to JAX, so each chunk re-traces) makes the same run fail the assertion."""
  real_jit = jax.jit

  def jit_per_call(fun, *args, **kwargs):
    if getattr(fun, "__name__", None) != "chunk":
      return real_jit(fun, *args, **kwargs)
    # A new function object per call, as a jit built inside the loop would be: JAX's
    # trace cache is keyed on the function, so re-jitting the same object would not miss.
    fresh = lambda: real_jit(functools.wraps(fun)(lambda *a: fun(*a)), *args, **kwargs)  # noqa: E731
    per_call = lambda *call_args: fresh()(*call_args)  # noqa: E731
    per_call.lower = lambda *call_args: fresh().lower(*call_args)  # The memory check's.
    return per_call

  monkeypatch.setattr(jax, "jit", jit_per_call)
  with count_traces() as counts:
    loop.train_and_evaluate(_config("fuzzy_logic", False, num_train_steps=4),
                            str(tmp_path / "wd"))
  assert counts["chunk"] == 3  # The memory check's compilation, then both chunks re-traced.
  with pytest.raises(AssertionError, match="chunk traced 3 times"):
    assert_traced_once(counts)
