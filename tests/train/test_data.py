"""The two data paths without the loop: on-device sampling and host batches to global arrays.

On device: a batch is a pure function of (key, batch size, split) and `example` gives its
shapes without computing it. On the host: `RandomTokens` rows are shifted targets over the
vocabulary, a function of (seed, process, index) whose position survives save / restore
(also through the Orbax handler that checkpoints use); `to_global` turns per-process rows
into one global array on the mesh and refuses slices that do not make up the batch.
"""

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from hypernet_attention.tasks import fuzzy_logic
from hypernet_attention.train import data
from hypernet_attention.train import sharding

import train_testlib as tl


@pytest.fixture(scope="module")
def source():
  return data.OnDeviceSource(fuzzy_logic.FuzzyLogic(num_examples=4))


def test_on_device_batch_is_a_function_of_key_size_and_split(source):
  assert source.on_device and source.splits == tuple(fuzzy_logic.SPLITS)
  a, b = (source.sample(jax.random.key(3), 5, "train") for _ in range(2))
  jax.tree.map(np.testing.assert_array_equal, a, b)
  other = source.sample(jax.random.key(4), 5, "train")
  assert not np.array_equal(a["x"], other["x"])
  example = source.example(7)  # Shapes only, of a batch of 7.
  assert jax.tree.map(lambda x: (x.shape, x.dtype), example) == jax.tree.map(
      lambda x: ((7,) + x.shape[1:], x.dtype), a)
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(example))


def test_random_tokens_are_shifted_rows_in_the_vocabulary():
  batch = next(data.RandomTokens(seed=0, batch_size=4, sequence_length=6, vocab_size=11))
  assert {k: (v.shape, v.dtype) for k, v in batch.items()} == {
      k: ((4, 6), np.int32) for k in ("inputs", "targets", "weights")}
  np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
  assert batch["inputs"].min() >= 0 and batch["inputs"].max() < 11
  assert len(np.unique(batch["inputs"])) > 5  # Not a constant.
  np.testing.assert_array_equal(batch["weights"], 1)


def test_random_tokens_differ_by_process_and_resume_at_their_position(tmp_path):
  def tokens(process=0, seed=0):
    return data.RandomTokens(seed, 2, 8, 1000, process_index=process, process_count=2)

  first = tokens()
  batches = [next(first)["inputs"] for _ in range(3)]
  assert not np.array_equal(batches[0], batches[1])
  assert not np.array_equal(batches[0], next(tokens(process=1))["inputs"])
  assert not np.array_equal(batches[0], next(tokens(seed=1))["inputs"])
  np.testing.assert_array_equal(next(tokens())["inputs"], batches[0])  # Same seed, same rows.

  saved = tokens()
  next(saved)
  saved.save(str(tmp_path / "a"))
  resumed = tokens()
  resumed.restore(str(tmp_path / "a"))
  np.testing.assert_array_equal(next(resumed)["inputs"], batches[1])  # Neither replay nor skip.
  # Through the Orbax handler a checkpoint step uses: the position lands in the step folder.
  with ocp.Checkpointer(data.DataIteratorHandler()) as ckpt:
    ckpt.save(tmp_path / "step", args=data.DataIteratorArgs(saved))
    restored = ckpt.restore(tmp_path / "step", args=data.DataIteratorArgs(tokens()))
  np.testing.assert_array_equal(next(restored)["inputs"], batches[1])


def test_local_batch_size_splits_over_processes(monkeypatch):
  assert data.local_batch_size(12) == 12  # One process here.
  monkeypatch.setattr(jax, "process_count", lambda: 4)
  assert data.local_batch_size(12) == 3
  with pytest.raises(ValueError, match=r"eval.batch_size=10 is not divisible by the 4 "
                     r"processes.*multiple of 4"):
    data.local_batch_size(10, "eval.batch_size")


def test_host_rows_become_one_global_array_on_the_mesh():
  mesh = sharding.make_mesh(tl.smoke("sraven").mesh)
  rows = {"inputs": np.arange(12, dtype=np.int32).reshape(4, 3),
          "weights": np.ones((4,), np.float32)}
  out = data.to_global(rows, mesh, 4)
  for name, x in rows.items():
    np.testing.assert_array_equal(np.asarray(out[name]), x)
    assert out[name].sharding == sharding.batch_sharding(mesh, x.ndim)
  specs = data.global_shardings({"inputs": jax.ShapeDtypeStruct((4, 3), np.int32)}, mesh)
  assert specs["inputs"].spec == jax.sharding.PartitionSpec(sharding.BATCH_AXES, None)
  with pytest.raises(ValueError, match=r"host batch feature 'inputs' has 4 rows x 1 processes "
                     r"!= global batch_size=8; allowed: 8 rows per process"):
    data.to_global(rows, mesh, 8)
