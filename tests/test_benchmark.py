"""`hypernet_attention/train/benchmark.py`'s population table and its step cost: what a
population of P members costs per member-step, against the single run and a FLOP formula."""

import os
import subprocess
import sys

import jax
import pytest

from hypernet_attention.train import benchmark
from hypernet_attention.train import state as state_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_step_cost_scales_with_members_and_covers_the_dense_flops():
  config = benchmark.model_config("fuzzy_logic", "softmax", "smoke")
  one = benchmark.step_cost(benchmark.population_config(config, 1))
  two = benchmark.step_cost(benchmark.population_config(config, 2))
  single = benchmark.prepare(benchmark.population_config(config, 1), 1)
  # Two members do twice one member's work and move about twice its bytes.
  assert two["flops"] == pytest.approx(2 * one["flops"], rel=0.1)
  assert two["bytes_accessed"] == pytest.approx(2 * one["bytes_accessed"], rel=0.25)
  # At least the dense layers' forward + backward: 6 x params x tokens (biases aside).
  example = single.setup.objective.source.example(config.batch_size)
  tokens = config.batch_size * jax.tree.leaves(example)[0].shape[1]
  params = state_lib.count_params(single.state.params)
  assert 6 * params * tokens * 0.5 < one["flops"] < 6 * params * tokens * 20


@pytest.mark.slow
def test_population_table_prints_the_cost_columns():
  out = subprocess.run(
      [sys.executable, os.path.join("experiments", "benchmark_training.py"),
       "--experiment=fuzzy_logic", "--size=smoke", "--models=hyla", "--members=1,2",
       "--steps=2", "--repeats=1", "--cost"], cwd=REPO, capture_output=True, text=True,
      timeout=600, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr[-2000:]
  rows = [l for l in out.stdout.splitlines() if l.startswith("| fuzzy_logic | smoke | hyla |")]
  assert len(rows) == 2
  gb = [float(r.strip("|").split("|")[-1]) for r in rows]
  assert gb[0] > 0 and gb[1] == pytest.approx(gb[0], rel=0.25)  # Per member: about equal.
