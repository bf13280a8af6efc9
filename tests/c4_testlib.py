"""Shared helpers for the language-modeling tests (not a test module): a generated corpus
of random words, a vocabulary trained on it, and a mocked TFDS c4/en.

Importable without TensorFlow (the README's `[dev]` install has none): the corpus, its
vocabulary and the ArrayRecord c4/en are written without it; only the seqio path's mocks
(`mock_c4_dir`, `mock_c4_records`) import it, when called.
"""

import json
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

from hypernet_attention.tasks import lm_text

import train_testlib as tl

SPLITS = lm_text.SPLITS
# Why a seqio test skips: the README's `[dev]` install has no TensorFlow.
NO_SEQIO = ("the seqio path needs TensorFlow, not in '.[dev]': pip install -e '.[dev,lm]' "
            "(CI runs these tests with every extra: pytest -m lm, .ci/run)")


def seqio_tests(available: bool):
  """The decorator of the seqio path's tests: marked `lm` (tests/pytest.ini) and skipped,
  saying why, unless `available` (the module imported seqio and `tasks/c4.py`)."""
  def mark(test):
    return pytest.mark.lm(pytest.mark.skipif(not available, reason=NO_SEQIO)(test))
  return mark


def documents(seed: int, count: int) -> list[str]:
  rng = np.random.default_rng(seed)
  words = ["".join(rng.choice(list("abcdefghijkl"), size=rng.integers(2, 7)))
           for _ in range(200)]
  return [" ".join(rng.choice(words, size=rng.integers(3, 40))) for _ in range(count)]


def write_corpus(root, vocab_size: int = 300) -> dict:
  """{'train', 'validation', 'vocabulary': paths, 'docs': train documents} under `root`."""
  out = {"docs": documents(0, 120)}
  for split, docs in (("train", out["docs"]), ("validation", documents(1, 30))):
    out[split] = os.path.join(root, f"{split}.jsonl")
    with open(out[split], "w") as f:
      f.writelines(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(docs))
  out["vocabulary"] = os.path.join(root, "vocabulary.model")
  with open(out["vocabulary"], "wb") as f:  # What `c4.train_vocabulary` writes for them.
    f.write(lm_text.sentencepiece_model(out["docs"], vocab_size, max_lines=2_000_000))
  return out


def mock_c4_dir(root, num_examples: int) -> str:
  """The metadata `tfds build c4/en` writes, for a build of `num_examples` per split."""
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  builder = tfds.builder("c4/en", data_dir=str(root))
  builder.info.set_splits(tfds.core.SplitDict([
      tfds.core.SplitInfo(name=split, shard_lengths=[num_examples], num_bytes=0,
                          filename_template=tfds.core.ShardedFileTemplate(
                              data_dir=builder.data_dir, dataset_name="c4", split=split,
                              filetype_suffix="tfrecord"))
      for split in SPLITS]))
  os.makedirs(builder.data_dir)
  builder.info.write_to_directory(builder.data_dir)
  return str(root)


def mock_c4_records(num_examples: int):
  """An `as_dataset_fn` for `tfds.testing.mock_data`: c4-shaped records whose texts are
  generated documents (longer than the mock's default words, and from tensors, so the
  input iterator can be checkpointed)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top  # Only the seqio path's.

  def as_dataset(self, split, **kwargs):
    del self, kwargs
    texts = documents(2 if "validation" in str(split) else 3, num_examples)
    return tf.data.Dataset.from_tensor_slices(
        {"text": texts, "url": [f"https://example.com/{i}" for i in range(num_examples)],
         "timestamp": ["2019-04-25T12:00:00Z"] * num_examples})
  return as_dataset


def write_c4_array_record(root, num_examples: int, version: str = "3.1.0") -> str:
  """A TFDS c4/en data_dir in ArrayRecord (what `tfds build c4/en --file_format=array_record`
  writes: dataset_info.json, features.json and one shard per split), whose texts are
  generated documents: for the Grain path's `tfds.data_source`. Written without TensorFlow
  (TFDS registers no c4 builder without it): TFDS's features serialize the records to its
  own tf.Example protos, and array_record writes the files."""
  # pylint: disable=g-import-not-at-top
  from array_record.python import array_record_module
  import tensorflow_datasets as tfds
  directory = os.path.join(root, "c4", "en", version)
  os.makedirs(directory)
  features = tfds.features.FeaturesDict({name: tfds.features.Text() for name in (
      "text", "url", "timestamp", "content-length", "content-type")})
  features.save_config(directory)
  template = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
  with open(os.path.join(directory, "dataset_info.json"), "w") as f:
    json.dump({"name": "c4", "configName": "en", "version": version,
               "fileFormat": "array_record", "splits": [
                   {"name": split, "shardLengths": [str(num_examples)],
                    "filepathTemplate": template} for split in SPLITS]}, f)
  for split in SPLITS:
    writer = array_record_module.ArrayRecordWriter(
        os.path.join(directory, f"c4-{split}.array_record-00000-of-00001"), "group_size:1")
    for text in documents(2 if split == "validation" else 3, num_examples):
      writer.write(features.serialize_example(
          {"text": text, "url": "https://example.com", "timestamp": "2019-04-25T12:00:00Z",
           "content-length": str(len(text)), "content-type": "text/plain"}))
    writer.close()
  return str(root)


def run_two_processes(corpus: dict, out_dir, *pipeline: str) -> dict:
  """Runs tests/e2e/c4_process_helper.py as processes 0 and 1 of one run on the smoke
  corpus (workdir `out_dir`/wd; each writes its batches_<i>.npy there); returns process 0's
  summary. `pipeline`: the helper's optional PIPELINE argument."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  helper = os.path.join(tl.TESTS, "e2e", "c4_process_helper.py")
  logs = [open(os.path.join(out_dir, f"log{i}.txt"), "w") for i in (0, 1)]
  procs = [(subprocess.Popen(
      [sys.executable, helper, str(port), str(i), os.path.dirname(corpus["train"]),
       os.path.join(out_dir, "wd"), str(out_dir), *pipeline], env=tl.multiprocess_env(),
      stdout=logs[i], stderr=subprocess.STDOUT), logs[i]) for i in (0, 1)]
  # Waited for while they progress, not for a fixed time a loaded machine exceeds.
  texts = tl.reap(procs, "the two c4_process_helper.py processes", stacks_signal=signal.SIGUSR1)
  assert [proc.returncode for proc, _ in procs] == [0, 0], tl.tails(texts)
  with open(os.path.join(out_dir, "summary.json")) as f:
    return json.load(f)
