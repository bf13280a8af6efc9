"""train/metrics.py: CLU collections merge to the float64 means of everything they saw."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hypernet_attention.train import metrics


def _batches(seed, sizes):
  rng = np.random.default_rng(seed)
  return [{"loss": rng.exponential(size=n).astype(np.float32),
           "accuracy": (rng.random(n) < 0.5).astype(np.float32)} for n in sizes]


def test_merged_collections_are_means_over_all_examples():
  """Batches of unequal size: the mean over examples, not the mean of batch means."""
  batches = _batches(0, (3, 7, 1))
  got = metrics.means(metrics.merge_all([metrics.collect(b) for b in batches]))
  for name in ("loss", "accuracy"):
    expected = np.concatenate([b[name] for b in batches]).astype(np.float64).mean()
    assert got[name] == pytest.approx(expected, rel=1e-6)
  assert got["loss"] != pytest.approx(np.mean([b["loss"].mean() for b in batches]), rel=1e-3)


def test_reduce_over_stacked_steps_equals_merging_them():
  """What a scanned chunk does (`Collection.reduce` over the step axis)."""
  steps = [metrics.collect(b) for b in _batches(1, (4, 4, 4))]
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *steps)
  reduced, merged = stacked.reduce(), metrics.merge_all(steps)
  assert metrics.means(reduced) == pytest.approx(metrics.means(merged), rel=1e-6)
  assert metrics.count(reduced) == 12


def test_a_dropped_step_counts_nothing():
  """A population's non-finite step (`keep_if(False, ...)`) leaves the window as it was."""
  good, bad = (metrics.collect(b) for b in _batches(2, (5, 5)))
  bad = jax.tree.map(lambda x: x * jnp.nan if x.dtype == jnp.float32 else x, bad)
  window = good.merge(metrics.keep_if(jnp.array(False), bad))
  assert metrics.means(window) == pytest.approx(metrics.means(good))
  assert metrics.count(window) == 5
  assert metrics.count(metrics.keep_if(jnp.array(False), good)) == 0


def test_step_metrics_keep_the_step_loss_and_average_the_gradient_norm():
  (batch,) = _batches(3, (6,))
  per_step, collection = metrics.step_metrics(batch, jnp.float32(2.5))
  assert float(per_step["loss"]) == pytest.approx(batch["loss"].mean(), rel=1e-6)
  assert float(per_step["grad_norm"]) == 2.5
  assert metrics.means(collection)["grad_norm"] == 2.5
  assert collection.grad_norm.count == 1
