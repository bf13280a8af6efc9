"""The Grain data path (`tasks/c4_grain.py`, `config.task.pipeline='grain'`).

Equal rows and batches to the seqio path on the same documents and vocabulary, disjoint
process shards, and end to end without TensorFlow: a subprocess whose `import tensorflow`
raises (as `tests/repo/test_no_tensorflow.py` hides it) trains the smoke config through Grain,
is stopped, resumes from Grain's checkpointed iterator and must match the uninterrupted
run batch for batch; and it reads TFDS c4/en from ArrayRecord through `tfds.data_source`.
The fixtures (corpus, vocabulary, ArrayRecord files) are written without TensorFlow, so all
but the comparison with seqio run in the README's `[dev]` install, which has none.
"""

import json
import os
import sys

import ml_collections
import numpy as np
import pytest

import c4_testlib
import train_testlib as tl

grain = pytest.importorskip("grain")
# pylint: disable=g-import-not-at-top,wrong-import-position
from hypernet_attention.tasks import c4_grain  # noqa: E402

pytestmark = pytest.mark.e2e  # Drives the whole training loop (tests/pytest.ini).
SEQ = 16


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  return c4_testlib.write_corpus(str(tmp_path_factory.mktemp("corpus")))


def _task_config(corpus, **changes):
  return ml_collections.ConfigDict(dict(
      name="text_lm", data_dir="", train_files=corpus["train"],
      validation_files=corpus["validation"], vocabulary=corpus["vocabulary"]) | changes)


def _grain_rows(task, **kwargs):
  kwargs = dict(split="train", sequence_length=SEQ, batch_size=1, seed=0, shuffle=False,
                num_epochs=1) | kwargs
  return np.concatenate([b["targets"] for b in c4_grain.batches(task, **kwargs)])


@pytest.mark.lm  # Needs seqio: run by CI's `-m lm` (tests/pytest.ini).
@pytest.mark.parametrize("split", ["train", "validation"])
def test_rows_and_batches_equal_the_seqio_paths(corpus, split):
  c4 = pytest.importorskip("hypernet_attention.tasks.c4", reason=c4_testlib.NO_SEQIO)
  seqio_task, grain_task = c4.build_task(_task_config(corpus)), c4_grain.build_task(
      _task_config(corpus))
  expected = np.concatenate([b["targets"] for b in c4.batches(
      seqio_task, split=split, sequence_length=SEQ, batch_size=1, seed=0, shuffle=False,
      num_epochs=1).as_numpy_iterator()])
  rows = _grain_rows(grain_task, split=split)
  assert rows.shape == expected.shape and rows.shape[0] > 100
  np.testing.assert_array_equal(rows, expected)
  # The features of a batch: inputs shifted right with BOS 0, weights 1 (no padding).
  seqio_batch = next(c4.batches(seqio_task, split=split, sequence_length=SEQ, batch_size=4,
                                seed=0, shuffle=False).as_numpy_iterator())
  grain_batch = next(iter(c4_grain.batches(grain_task, split=split, sequence_length=SEQ,
                                           batch_size=4, seed=0, shuffle=False)))
  assert sorted(grain_batch) == ["inputs", "targets", "weights"]
  for name, value in seqio_batch.items():
    assert grain_batch[name].dtype == np.int32
    np.testing.assert_array_equal(grain_batch[name], value, err_msg=name)


def test_shards_are_disjoint_and_the_order_is_a_function_of_the_seed(corpus):
  task = c4_grain.build_task(_task_config(corpus))
  whole = _grain_rows(task)
  halves = [_grain_rows(task, shard=grain.sharding.ShardOptions(i, 2)) for i in (0, 1)]
  as_set = lambda rows: {tuple(r) for r in rows}
  assert not as_set(halves[0]) & as_set(halves[1])
  # Every document is in one shard: together they hold (about) the whole stream's tokens.
  assert abs(sum(h.size for h in halves) - whole.size) <= 2 * SEQ
  shuffled = [_grain_rows(task, shuffle=True, seed=s) for s in (0, 0, 1)]
  np.testing.assert_array_equal(shuffled[0], shuffled[1])
  assert not np.array_equal(shuffled[0], shuffled[2])
  # A permutation of the documents: the same tokens, up to the last partial row.
  assert abs(shuffled[0].size - whole.size) <= SEQ


# Runs with TensorFlow hidden: smoke training through Grain, whole and stopped + resumed,
# recording every host batch; then c4/en from ArrayRecord through tfds.data_source.
NO_TF = """
import json, sys
sys.path.insert(0, {tests!r})
import numpy as np
from experiments.configs import c4_lm
from hypernet_attention.tasks import c4_grain
import jax
from hypernet_attention.runs import config_checks
from hypernet_attention.train import loop, trainer
corpus, workdir, c4_dir = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
seen, next_batch = [], trainer.Trainer._next_batch
def record(self):  # Every training batch, in order.
  batch = next_batch(self)
  seen.append(np.asarray(batch["targets"]).tolist())
  return batch
trainer.Trainer._next_batch = record
def config(**changes):
  c = c4_lm.get_config("model=hyla,size=smoke")
  c.task.update(pipeline="grain", train_files=corpus["train"],
                validation_files=corpus["validation"], vocabulary=corpus["vocabulary"])
  for key, value in changes.items():
    config_checks.set_dotted(c, key, value)
  return c
whole = loop.train_and_evaluate(config(), workdir + "/whole")
uninterrupted, seen[:] = list(seen), []
loop.train_and_evaluate(config(stop_after_steps=4), workdir + "/split")
stopped = len(seen)
resumed = loop.train_and_evaluate(config(), workdir + "/split")
params = lambda s: [np.asarray(x).tolist() for x in jax.tree.leaves(s["state"].params)]
c4_config = config().task
c4_config.update(name="c4_lm", data_dir=c4_dir)
c4_task = c4_grain.build_task(c4_config)
batch = next(iter(c4_grain.batches(c4_task, split="validation", sequence_length=16,
                                   batch_size=2, seed=0)))
print(json.dumps(dict(
    loaded=sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow"),
    uninterrupted=uninterrupted, seen=seen, stopped=stopped,
    same_params=params(whole) == params(resumed), steps=[whole["step"], resumed["step"]],
    loss=whole["validation/loss"], c4_shape=list(batch["targets"].shape),
    c4_documents=len(c4_task.documents["train"]))))
"""


def test_a_c4_build_without_shards_is_one_line(tmp_path):
  """A c4/en folder whose dataset_info.json names array_record but whose shards are gone (a
  build cut short, a partial copy): one line naming the folder and the split, where
  `tfds.data_source` fails with a 76-line AssertionError; the other split still reads."""
  from hypernet_attention.errors import BadInput  # pylint: disable=g-import-not-at-top
  data_dir = c4_testlib.write_c4_array_record(tmp_path / "tfds", 4)
  for shard in (tmp_path / "tfds" / "c4" / "en" / "3.1.0").glob("c4-train.array_record-*"):
    shard.unlink()
  with pytest.raises(BadInput, match="holds no train shards") as refusal:
    c4_grain.c4_documents(data_dir, "train")
  assert "\n" not in str(refusal.value)
  assert len(c4_grain.c4_documents(data_dir, "validation")) == 4


@pytest.mark.slow
def test_trains_resumes_exactly_and_reads_c4_without_tensorflow(corpus, tmp_path):
  c4_dir = c4_testlib.write_c4_array_record(tmp_path / "tfds", 60)
  blocked = tmp_path / "no_tensorflow"
  (blocked / "tensorflow").mkdir(parents=True)
  (blocked / "tensorflow" / "__init__.py").write_text(tl.TENSORFLOW_BLOCKER)
  env = tl.subprocess_env()
  env["PYTHONPATH"] = str(blocked) + os.pathsep + env["PYTHONPATH"]
  script = NO_TF.format(tests=tl.TESTS)
  proc = tl.run(
      [sys.executable, "-c", script, json.dumps({k: corpus[k] for k in
                                                 ("train", "validation", "vocabulary")}),
       str(tmp_path / "wd"), c4_dir], env=env, cwd=tl.REPO, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["loaded"] == []
  assert out["steps"] == [8, 8] and out["stopped"] == 4
  assert len(out["uninterrupted"]) == 8 and out["seen"] == out["uninterrupted"]
  assert out["uninterrupted"][3] != out["uninterrupted"][4]  # Not vacuous.
  assert out["same_params"]
  assert 0 < out["loss"] < 2 * np.log(300)
  assert out["c4_shape"] == [2, 16] and out["c4_documents"] == 60
  # Grain's own handler wrote each checkpoint's iterator position.
  state = json.loads((tmp_path / "wd" / "split" / "checkpoints" / "4" / "grain" /
                      "process_0-of-1.json").read_text())
  assert "parent_state" in json.dumps(state)


@pytest.mark.slow
@tl.multiprocess_slot()
def test_two_processes_read_their_own_shards(corpus, tmp_path):
  summary = c4_testlib.run_two_processes(corpus, tmp_path, "grain")
  assert (summary["num_processes"], summary["num_devices"], summary["step"]) == (2, 4, 8)
  task = c4_grain.build_task(_task_config(corpus))
  for i in (0, 1):
    seen_NBT = np.load(tmp_path / f"batches_{i}.npy")
    assert seen_NBT.shape == (8, 8, 16)  # 8 steps of half the batch of 16.
    # Exactly what shard i of 2 holds, read alone; Grain's handler wrote its position.
    expected = iter(c4_grain.batches(task, split="train", sequence_length=16, batch_size=8,
                                     seed=0, shard=grain.sharding.ShardOptions(i, 2)))
    np.testing.assert_array_equal(seen_NBT, [next(expected)["targets"] for _ in range(8)])
    assert (tmp_path / "wd" / "checkpoints" / "8" / "grain" / f"process_{i}-of-2.json").exists()
