"""`hypernet_attention/train/benchmark.py`'s population table and its step cost: what a
population of P members costs per member-step, against the single run and a FLOP formula."""

import os
import subprocess
import sys

import jax
import numpy as np
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


def test_random_tokens_are_shifted_rows_in_the_vocabulary_and_resume_exactly(tmp_path):
  """`data.RandomTokens` (the C4 step timed without TensorFlow): rows as `c4.batches` yields
  them, every process its own stream, and a restored iterator continues where it stopped."""
  from hypernet_attention.train import data  # pylint: disable=g-import-not-at-top
  tokens = data.RandomTokens(seed=3, batch_size=4, sequence_length=64, vocab_size=50)
  first, second = next(tokens), next(tokens)
  assert first["inputs"].shape == (4, 64) and first["inputs"].dtype == np.int32
  np.testing.assert_array_equal(first["inputs"][:, 1:], first["targets"][:, :-1])
  np.testing.assert_array_equal(first["weights"], np.ones((4, 64)))
  assert first["inputs"].min() >= 0 and first["targets"].max() < 50
  assert len(np.unique(first["inputs"])) > 40  # Spread over the vocabulary, not constant.
  assert not np.array_equal(first["inputs"], second["inputs"])
  other = next(data.RandomTokens(3, 4, 64, 50, process_index=1, process_count=2))
  assert not np.array_equal(first["inputs"], other["inputs"])
  tokens.save(str(tmp_path))
  expected = next(tokens)
  resumed = data.RandomTokens(seed=3, batch_size=4, sequence_length=64, vocab_size=50)
  resumed.restore(str(tmp_path))
  np.testing.assert_array_equal(next(resumed)["targets"], expected["targets"])
