"""The loop's metrics as `clu.metrics` collections (which, unlike CLU's writers, import no
TensorFlow: tests/repo/test_no_tensorflow.py checks).

Every objective returns per-example metrics {name: (B,)} (`objectives.py`). A train step or
an evaluation batch turns them into a `Collection` of `Average`s (a sum and a count per
name); collections merge across the steps of a chunk (in the scanned carry), across chunks
on the host until a log step, and across the batches of an evaluation split; `compute()`
gives the means. The count travels with the sum, so a mean never divides by an assumed
number of examples, and a population's frozen member (`population.py`) contributes its
finite steps only. Sums over a batch sharded across devices are XLA's reductions inside
jit, so no `gather_from_model_output` (a pmap idiom) is needed.

A train chunk's steps are stacked by the scan and merged by `Collection.reduce` (the same
merge CLU uses across devices). Besides its collection, a train chunk keeps the loss and
gradient norm of every step (`ChunkMetrics.per_step`): the loop stops or freezes at the
first non-finite *step*, and tests compare loss curves step by step."""

from __future__ import annotations

import functools
from typing import Any, Mapping, Sequence

from clu import metrics as clu_metrics
import flax
import jax
import jax.numpy as jnp


@functools.lru_cache(maxsize=None)
def averages(names: tuple[str, ...]) -> type[clu_metrics.Collection]:
  """The `Collection` class averaging each of `names` (one class per set of names, so that
  collections made in different traces merge)."""
  return clu_metrics.Collection.create(
      **{name: clu_metrics.Average.from_output(name) for name in names})


def collect(per_example: Mapping[str, jax.Array]) -> clu_metrics.Collection:
  """A collection of the means of `per_example` ({name: (B,) or scalar})."""
  return averages(tuple(sorted(per_example))).single_from_model_output(**per_example)


def keep_if(keep: jax.Array, collection: clu_metrics.Collection) -> clu_metrics.Collection:
  """`collection` where `keep` (a traced bool), else the empty one (a merge no-op)."""
  return jax.tree.map(lambda new, empty: jnp.where(keep, new, empty), collection,
                      type(collection).empty())


def merge_all(collections: Sequence[clu_metrics.Collection]) -> clu_metrics.Collection:
  return functools.reduce(lambda a, b: a.merge(b), collections)


def member(collection: clu_metrics.Collection, index: int) -> clu_metrics.Collection:
  """Member `index`'s slice of a population's collection or state (leading member axis)."""
  return jax.tree.map(lambda x: x[index], collection)


def means(collection: clu_metrics.Collection) -> dict[str, float]:
  """{name: mean} of a host-side collection."""
  return {name: float(v) for name, v in collection.compute().items()}


def count(collection: clu_metrics.Collection) -> int:
  """How many examples (steps, for per-step scalars) the collection's loss counted: 0 for a
  member frozen before this window."""
  return int(collection.loss.count)


@flax.struct.dataclass
class ChunkMetrics:
  """What a train chunk reports: `per_step` {'loss', 'grad_norm': (steps,)} ((P, steps) for
  a population) and `window`, the collection of every metric over the chunk's steps."""
  per_step: dict[str, jax.Array]
  window: Any  # clu_metrics.Collection (a leading member axis for a population)


def step_metrics(per_example: Mapping[str, jax.Array], grad_norm: jax.Array) -> tuple[
    dict[str, jax.Array], clu_metrics.Collection]:
  """One train step's (per-step scalars, collection) from its per-example metrics."""
  per_step = {"loss": jnp.mean(per_example["loss"]), "grad_norm": grad_norm}
  return per_step, collect({**per_example, "grad_norm": grad_norm})
