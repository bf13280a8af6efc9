"""`measure/benchmark.py`'s timing loop, its refusals before allocation, and `measure/parity.py`.

No timing is asserted: the loop is shown to run every call (a counter) and to keep the
attention inside the loop (the compiled HLO), refusals are shown to allocate nothing.
"""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hypernet_attention import presets
from hypernet_attention.measure import benchmark
from hypernet_attention.measure import parity
from hypernet_attention.ops import dispatch

SMALL = dict(batch=1, heads=2, head_dim=8, causal=True, dtype="float32")


def test_the_loop_runs_every_call():
  calls = []

  def fn(q, k, v):
    jax.debug.callback(lambda: calls.append(1))
    return q * k + v

  x = jnp.ones((2, 3))
  compiled = benchmark.call_loop(fn, 23).lower(x, x, x).compile()
  jax.block_until_ready(compiled(x, x, x))
  jax.effects_barrier()
  assert len(calls) == 23


def _computations(hlo: str) -> dict[str, str]:
  """{computation name: its body text} of an HLO module's text."""
  blocks = re.split(r"\n(?=(?:ENTRY )?%?[\w.\-]+ [^\n]*\{\n)", hlo)
  out = {}
  for block in blocks:
    match = re.match(r"(ENTRY )?%?([\w.\-]+) ", block)
    if match:
      out["ENTRY" if match.group(1) else match.group(2)] = block
  return out


def _reachable(computations: dict[str, str], root: str, skip=()) -> set[str]:
  seen, todo = set(), [root]
  while todo:
    name = todo.pop()
    if name in seen or name not in computations:
      continue
    seen.add(name)
    for callee in re.findall(r"(?:calls|body|condition|to_apply|branch_computations)="
                             r"\{?%?([\w.\-]+)", computations[name]):
      if callee not in skip:
        todo.append(callee)
  return seen


def test_the_attention_stays_inside_the_loop():
  """A pure function of loop-invariant inputs: XLA hoists such a call unless each call
  depends on the one before (it did with only an optimization barrier)."""
  fn = benchmark.attention_fn("hyla_reference", causal=True)
  shape = benchmark.Shape(seq_len=16, **SMALL)
  hlo = benchmark.call_loop(fn, 20).lower(*shape.specs()).compile().as_text()
  computations = _computations(hlo)
  bodies = set(re.findall(r"\bwhile\([^\n]*body=%?([\w.\-]+)", computations["ENTRY"]))
  assert len(bodies) == 1, bodies
  has_dot = lambda names: any(re.search(r"\bdot\(", computations[n]) for n in names)
  assert has_dot(_reachable(computations, *bodies))
  assert not has_dot(_reachable(computations, "ENTRY", skip=bodies))


def test_fwd_bwd_runs_the_forward_too(x64):
  """Blockwise's custom VJP keeps only the inputs, so under `jax.grad` alone XLA drops its
  forward (the "fwd+bwd" of every measurement through 2026-11-27 timed the backward only):
  the timed function returns the loss's value, the sum of the outputs (float64 reference),
  and its program holds the forward's tile loop beside the backward's."""
  shape = benchmark.Shape(seq_len=64, **SMALL)
  fns = benchmark.fwd_and_fwd_bwd("hyla_blockwise", causal=True)
  q, k, v = (jax.random.normal(jax.random.PRNGKey(i), s.shape, jnp.float32) for i, s in
             enumerate(shape.specs()))
  value, grads = jax.jit(fns["fwd_bwd"])(q, k, v)
  expected = jnp.sum(parity.hyla_reference(*(np.asarray(x, np.float64) for x in (q, k, v))))
  np.testing.assert_allclose(value, expected, rtol=1e-4)
  assert len(grads) == 3
  loops = lambda f: jax.jit(f).lower(*shape.specs()).compile().as_text().count(" while(")
  grad_only = jax.grad(lambda *a: jnp.sum(fns["fwd"](*a)), (0, 1, 2))
  assert loops(fns["fwd_bwd"]) > loops(grad_only) >= 1


@pytest.fixture
def no_allocation(monkeypatch):
  """Fails the test if the benchmark draws inputs; returns a check that no array appeared."""
  def refuse(*args, **kwargs):
    raise AssertionError("an input was allocated")
  monkeypatch.setattr(jax.random, "normal", refuse)
  before = len(jax.live_arrays())
  return lambda: len(jax.live_arrays()) == before


def test_inputs_too_big_are_refused_from_shapes_alone(no_allocation):
  """Issue 46, case 6: T=1,000,000 was refused only after building ~24 GB."""
  shape = benchmark.Shape(batch=4, heads=8, head_dim=64, seq_len=1_000_000, causal=True,
                          dtype="float32")
  limits = benchmark.Limits(max_temp_bytes=2**30, device_bytes=16 * 2**30)
  row = benchmark.measure("hyla_blockwise", shape, repeats=1, limits=limits)
  assert row["status"] == "over_device_memory"
  assert "fwd_temp_bytes" not in row  # Refused before compiling.
  assert "shorter --seq_lens" in row["message"] and "about 0" not in row["message"]
  assert no_allocation()


def test_temporaries_over_budget_are_refused_after_compiling_before_allocating(no_allocation):
  shape = benchmark.Shape(seq_len=128, **SMALL)
  limits = benchmark.Limits(max_temp_bytes=1024, device_bytes=2**30)
  row = benchmark.measure("hyla_reference", shape, repeats=1, limits=limits)
  assert row["status"] == "over_memory_budget", row
  assert row["fwd_temp_bytes"] > 1024
  assert "--max_temp_gb" in row["message"]
  assert no_allocation()


def test_advice_names_a_batch_that_fits():
  shape = benchmark.Shape(batch=8, heads=8, head_dim=64, seq_len=4096, causal=True,
                          dtype="float32")
  row = benchmark._refusal(shape, "it", need=4e9, have=1e9, limit="device", name="x")
  assert "--batch=2 at most" in row["message"]


def test_a_cell_predicted_over_its_time_budget_is_not_compiled(no_allocation):
  shape = benchmark.Shape(seq_len=64, **SMALL)
  row = benchmark.measure("linear", shape, repeats=1, calls=20,
                          limits=benchmark.Limits(cell_budget_s=1.0),
                          estimate_ms={"fwd": 100.0, "fwd_bwd": 300.0})  # 300 ms x 3 x 2 > 1 s
  assert row["status"] == "over_time_budget" and "fwd_temp_bytes" not in row
  assert no_allocation()
  # Long calls run fewer times per loop to fit; short ones never run fewer than asked.
  assert benchmark.calls_within(20, {"fwd": 10.0, "fwd_bwd": 30.0}, 1.0) == 16
  assert benchmark.calls_within(20, {"fwd": 0.1, "fwd_bwd": 1.0}, 0.02) == 0
  assert benchmark.calls_within(20, {"fwd": 0.1, "fwd_bwd": 1.0}, 10.0) == 20
  assert benchmark.calls_within(20, {}, 10.0) == 20


def test_run_measures_the_baseline_first_and_every_ratio_against_it():
  rows = []
  out = benchmark.run([32, 48], ["linear"], repeats=2, calls=3, on_row=rows.append,
                      log=lambda line: None, **SMALL)
  assert rows == out
  assert [r["implementation"] for r in out] == ["softmax_xla", "linear"] * 2
  for r in out:
    assert r["status"] == "ok" and r["baseline"] == "softmax_xla", r
    for key in ("fwd_ms", "fwd_min_ms", "fwd_bwd_ms", "fwd_bwd_tflops", "fwd_bwd_vs_baseline"):
      assert math.isfinite(r[key]) and r[key] > 0, (key, r)
    assert r["fwd_min_ms"] <= r["fwd_ms"] and r["calls"] == 3
    assert 0 < r["fwd_bwd_loop_overhead_ms"] < math.inf
  assert all(r["fwd_vs_baseline"] == 1.0 for r in out if r["implementation"] == "softmax_xla")


def test_implementations_are_read_from_presets_at_call_time(monkeypatch):
  monkeypatch.setattr(presets, "IMPLEMENTATIONS", (*presets.IMPLEMENTATIONS, "fused"))
  assert "hyla_fused" in benchmark.implementations()
  assert "fused" in parity.hyla_implementations()
  assert "hyla_auto" not in benchmark.implementations()
  assert "reference" not in parity.hyla_implementations()


def test_parity_passes_blockwise_and_catches_a_planted_bug(monkeypatch):
  kw = dict(batch=2, heads=2, head_dim=8)
  good = next(parity.check(24, "float32", ["blockwise"], **kw))
  assert good["status"] == "pass", good
  real = dispatch.attention
  # The bug: the causal mask dropped (keys after the query leak in).
  monkeypatch.setattr(dispatch, "attention", lambda q, k, v, **kwargs: real(
      q, k, v, **{**kwargs, "is_causal": False}))
  bad = next(parity.check(24, "float32", ["blockwise"], **kw))
  assert bad["status"] == "fail" and bad["out_err"] > 10 * bad["out_bound"], bad
  monkeypatch.setattr(dispatch, "attention", real)
  rows = parity.run([24, 16], "bfloat16", names=["blockwise"], log=lambda line: None, **kw)
  assert [(r["seq_len"], r["dtype"]) for r in rows] == [
      (16, "float32"), (24, "bfloat16"), (16, "bfloat16")]
  assert all(np.isfinite(r["dq_err"]) for r in rows)
