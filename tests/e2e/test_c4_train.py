"""The training loop on host-side language-modeling data (`c4_lm` / `text_lm`).

End to end on a mocked TFDS c4/en, resume that neither replays nor skips batches, two
processes (2 fake devices each) reading their own shards, the host-to-global batch
helper's errors, and the benchmark's FLOP formula. All but the last two read text through
seqio, which needs TensorFlow: without it (the README's `[dev]` install) they skip.
"""

import json
import math
import os
import sys

import chex
import jax
import numpy as np
import pytest

from experiments.configs import c4_lm as c4_config
from hypernet_attention.runs import config_checks
from hypernet_attention.runs import config_common
from hypernet_attention.train import benchmark
from hypernet_attention.train import build
from hypernet_attention.train import data
from hypernet_attention.train import loop
from hypernet_attention.train import sharding

import c4_testlib
import train_testlib as tl

try:  # The seqio path needs TensorFlow (not in '.[dev]'): without it, its tests skip.
  import seqio
  import tensorflow_datasets as tfds

  from hypernet_attention.tasks import c4
  from hypernet_attention.tasks import lm_text
except ModuleNotFoundError:
  seqio = tfds = c4 = lm_text = None
needs_seqio = c4_testlib.seqio_tests(c4 is not None)

pytestmark = pytest.mark.e2e  # Drives the whole training loop (tests/pytest.ini).


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  return c4_testlib.write_corpus(str(tmp_path_factory.mktemp("corpus")))


def _config(corpus, **changes):
  config = c4_config.get_config("model=hyla,size=smoke")
  config.task.update(train_files=corpus["train"], validation_files=corpus["validation"],
                     vocabulary=corpus["vocabulary"])
  for key, value in changes.items():
    config_checks.set_dotted(config, key, value)
  return config


@needs_seqio
def test_mock_c4_trains_and_evaluates_end_to_end(corpus, tmp_path):
  num_examples = 200
  data_dir = c4_testlib.mock_c4_dir(tmp_path / "tfds", num_examples)
  # Synchronous saves: mock_data swaps the file system while it builds a dataset, which
  # an asynchronous save writing at that moment would see.
  config = _config(corpus, **{"task.name": "c4_lm", "task.data_dir": data_dir,
                              "async_checkpoints": False})
  with tfds.testing.mock_data(num_examples=num_examples, data_dir=data_dir,
                              as_dataset_fn=c4_testlib.mock_c4_records(num_examples)):
    summary = loop.train_and_evaluate(config, str(tmp_path / "wd"))
  assert summary["step"] == 8
  for split in ("train", "validation"):
    loss = summary[f"{split}/loss"]
    assert 0 < loss < 2 * math.log(300)  # Near ln(vocabulary) after 8 steps.
    assert summary[f"{split}/perplexity"] == pytest.approx(math.exp(loss), rel=1e-6)
    assert 0 < summary[f"{split}/bits_per_byte"] < 10
    assert 0 <= summary[f"{split}/accuracy"] <= 1


def _recording(monkeypatch):
  """Every training batch any DataIterator hands out, in order."""
  seen = []
  original = c4.DataIterator.__next__

  def record(self):
    batch = original(self)
    seen.append(batch["targets"])
    return batch

  monkeypatch.setattr(c4.DataIterator, "__next__", record)
  return seen


@needs_seqio
def test_killed_and_resumed_run_sees_the_uninterrupted_batches(corpus, tmp_path,
                                                               monkeypatch):
  seen = _recording(monkeypatch)
  whole = loop.train_and_evaluate(_config(corpus), str(tmp_path / "whole"))
  uninterrupted, seen[:] = list(seen), []
  loop.train_and_evaluate(_config(corpus, stop_after_steps=4), str(tmp_path / "split"))
  assert len(seen) == 4  # Stopped (as if killed) right after the step-4 checkpoint.
  resumed = loop.train_and_evaluate(_config(corpus), str(tmp_path / "split"))
  assert len(uninterrupted) == 8 and len(seen) == 8
  np.testing.assert_array_equal(np.stack(seen), np.stack(uninterrupted))
  # The batches differ from step to step (the check would be vacuous otherwise).
  assert not np.array_equal(uninterrupted[3], uninterrupted[4])
  chex.assert_trees_all_equal(resumed["state"].params, whole["state"].params)


def test_to_global_fails_loudly_when_the_batch_does_not_divide():
  mesh = sharding.make_mesh(config_common.base_config(experiment="c4_lm").mesh)
  rows = {"targets": np.zeros((4, 8), np.int32)}
  batch = data.to_global(rows, mesh, 4)
  assert batch["targets"].shape == (4, 8) and isinstance(batch["targets"], jax.Array)
  with pytest.raises(ValueError, match="'targets' has 4 rows x 1 processes != global "
                                       "batch_size=6"):
    data.to_global(rows, mesh, 6)


def test_flops_per_token_of_the_50m_model_is_the_stated_formula():
  config = c4_config.get_config("model=hyla,size=50m")
  model_config = build.transformer_config(
      config.model, input_kind="embed", vocab_size=32_000, output_dim=32_000)
  params = jax.eval_shape(lambda: tl.token_model_params(model_config))
  non_embedding = 51_715_328 - 32_000 * 512
  assert benchmark.flops_per_token(model_config, params, 512) == (
      6 * non_embedding + 12 * 6 * 512 * 512)


@needs_seqio
@pytest.mark.slow
@tl.multiprocess_slot()
def test_two_processes_read_their_own_shards(corpus, tmp_path):
  summary = c4_testlib.run_two_processes(corpus, tmp_path)
  assert (summary["num_processes"], summary["num_devices"], summary["step"]) == (2, 4, 8)
  task = c4.build_task(_config(corpus).task)
  for i in (0, 1):
    seen_NBT = np.load(tmp_path / f"batches_{i}.npy")
    assert seen_NBT.shape == (8, 8, 16)  # 8 steps of half the batch of 16.
    # Exactly what shard i of 2 holds, read alone.
    expected = c4.DataIterator(c4.batches(task, split="train", sequence_length=16,
                                          batch_size=8, seed=0,
                                          shard_info=seqio.ShardInfo(i, 2)))
    np.testing.assert_array_equal(seen_NBT, [next(expected)["targets"] for _ in range(8)])


@needs_seqio
def test_a_bad_line_past_the_checked_head_is_skipped_with_one_warning(corpus, tmp_path):
  """Only each file's first `CHECK_BYTES` are checked before work (a C4-sized corpus cannot
  be read first); a bad line further on is dropped with one warning line naming it (before:
  a TensorFlow traceback each time the pipeline read it, and the line dropped all the same)."""
  # A few long documents fill the checked head, so the bad line is among the first read.
  lines = [json.dumps({"text": " ".join(c4_testlib.documents(i, 150))}) + "\n"
           for i in range(40)]
  head = []
  while sum(map(len, head)) <= lm_text.CHECK_BYTES:
    head.append(lines[len(head)])
  train = tmp_path / "train.jsonl"
  train.write_text("".join(head) + "plain text, not JSON\n" + "".join(lines[len(head):]))
  assert c4.text_files(str(train), "train")  # The check before work passes.
  out = tl.run(
      [sys.executable, os.path.join("experiments", "c4_lm.py"),
       "--config=experiments/configs/c4_lm.py:model=hyla,size=smoke",
       f"--config.task.train_files={train}",
       f"--config.task.validation_files={corpus['validation']}",
       f"--config.task.vocabulary={corpus['vocabulary']}", f"--workdir={tmp_path / 'wd'}"],
      env=tl.subprocess_env(), cwd=tl.REPO, capture_output=True, text=True)
  assert out.returncode == 0, out.stderr[-3000:]
  warnings = [line for line in out.stderr.splitlines() if "skipped a .jsonl" in line]
  assert len(warnings) == 1, out.stderr[-3000:]
  assert warnings[0].endswith("line that is not JSON (Expecting value) (allowed: a JSON "
                              "object with a string 'text'): b'plain text, not JSON'"), warnings[0]
  assert "Traceback" not in out.stderr, out.stderr[-3000:]
  assert json.loads((tmp_path / "wd" / "summary.json").read_text())["step"] == 8
