"""Shared helpers for the language-modeling tests (not a test module): a generated corpus
of random words, a vocabulary trained on it, and a mocked TFDS c4/en."""

import json
import os
import socket
import subprocess
import sys

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds

from hypernet_attention.tasks import c4

import train_testlib as tl


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
  source = c4.text_source(out["train"], out["validation"])
  out["vocabulary"] = os.path.join(root, "vocabulary.model")
  c4.train_vocabulary(c4.documents(source), out["vocabulary"], vocab_size=vocab_size)
  return out


def mock_c4_dir(root, num_examples: int) -> str:
  """The metadata `tfds build c4/en` writes, for a build of `num_examples` per split."""
  builder = tfds.builder("c4/en", data_dir=str(root))
  builder.info.set_splits(tfds.core.SplitDict([
      tfds.core.SplitInfo(name=split, shard_lengths=[num_examples], num_bytes=0,
                          filename_template=tfds.core.ShardedFileTemplate(
                              data_dir=builder.data_dir, dataset_name="c4", split=split,
                              filetype_suffix="tfrecord"))
      for split in c4.SPLITS]))
  os.makedirs(builder.data_dir)
  builder.info.write_to_directory(builder.data_dir)
  return str(root)


def mock_c4_records(num_examples: int):
  """An `as_dataset_fn` for `tfds.testing.mock_data`: c4-shaped records whose texts are
  generated documents (longer than the mock's default words, and from tensors, so the
  input iterator can be checkpointed)."""
  def as_dataset(self, split, **kwargs):
    del self, kwargs
    texts = documents(2 if "validation" in str(split) else 3, num_examples)
    return tf.data.Dataset.from_tensor_slices(
        {"text": texts, "url": [f"https://example.com/{i}" for i in range(num_examples)],
         "timestamp": ["2019-04-25T12:00:00Z"] * num_examples})
  return as_dataset


def write_c4_array_record(root, num_examples: int) -> str:
  """A TFDS c4/en data_dir in ArrayRecord (what `tfds build c4/en --file_format=array_record`
  writes), whose texts are generated documents: for the Grain path's `tfds.data_source`.
  Serializing the records needs TensorFlow; reading them back does not."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  builder = tfds.builder("c4/en", data_dir=str(root), file_format="array_record")
  splits = [tfds.core.SplitInfo(
      name=split, shard_lengths=[num_examples], num_bytes=0,
      filename_template=tfds.core.ShardedFileTemplate(
          data_dir=builder.data_dir, dataset_name="c4", split=split,
          filetype_suffix="array_record")) for split in c4.SPLITS]
  builder.info.set_splits(tfds.core.SplitDict(splits))
  os.makedirs(builder.data_dir)
  builder.info.write_to_directory(builder.data_dir)
  for split in splits:
    writer = array_record_module.ArrayRecordWriter(
        os.fspath(split.filename_template.sharded_filepaths(1)[0]), "group_size:1")
    for text in documents(2 if split.name == "validation" else 3, num_examples):
      writer.write(builder.info.features.serialize_example(
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
  procs = [subprocess.Popen(
      [sys.executable, helper, str(port), str(i), os.path.dirname(corpus["train"]),
       os.path.join(out_dir, "wd"), str(out_dir), *pipeline], env=tl.subprocess_env(),
      stdout=logs[i], stderr=subprocess.STDOUT) for i in (0, 1)]
  try:
    for proc in procs:
      proc.wait(timeout=420)
  finally:
    for proc, log in zip(procs, logs):
      if proc.poll() is None:
        proc.kill()
        proc.wait()
      log.close()
  for i, proc in enumerate(procs):
    with open(os.path.join(out_dir, f"log{i}.txt")) as f:
      assert proc.returncode == 0, f.read()[-3000:]
  with open(os.path.join(out_dir, "summary.json")) as f:
    return json.load(f)
