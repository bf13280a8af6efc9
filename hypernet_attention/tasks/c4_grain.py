"""Language-modeling data through Grain, without TensorFlow (`config.task.pipeline='grain'`).

The same tasks, vocabulary and rows as the seqio path (`tasks/c4.py`), for machines without
TensorFlow (accelerator images):
  c4_lm    `tfds.data_source("c4/en:V")`: the ArrayRecord files that `tfds build c4/en
           --file_format=array_record --data_dir=DIR` writes (a folder or a gs:// bucket);
           random access, read without TensorFlow.
  text_lm  the documents of local `.txt` / `.jsonl` files (as the seqio path reads them,
           bad .jsonl lines skipped with a warning), held in memory.
Per process: documents -> shard `process_index` of `process_count` (every `process_count`-th
document, `grain.sharding.ShardOptions`) -> Grain's global shuffle from `seed`, a new order every
epoch -> repeated -> SentencePiece ids + EOS, empty documents dropped ->
`ConcatThenSplitIterDataset`: the token stream cut into rows of exactly `sequence_length` tokens (no
padding; the stream's last partial row is dropped) -> batches {'inputs', 'targets', 'weights'},
inputs = targets shifted right (BOS = pad id 0), as seqio's `LMFeatureConverter` makes them.
Unshuffled, one shard, the rows equal the seqio path's (tests/e2e/test_c4_grain.py). Where they
differ: seqio shuffles files and then rows in a 1,000-row buffer, Grain all documents; and a
repeated Grain stream packs across the epoch boundary (seqio starts each epoch on a new row), which
only the unshuffled evaluation of a split shorter than `eval.num_problems` rows would show.

The training iterator is Grain's `DatasetIterator`: its position is saved with each Orbax
checkpoint by Grain's own handler (`train/data.GrainIteratorHandler`), so a resume is exact.

Shape letters: B batch (per process), T tokens per row."""

from __future__ import annotations

import dataclasses
import glob
import itertools
import json
import os
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

from etils import epath
import fsspec
import grain
import ml_collections
import numpy as np
import sentencepiece as spm

from hypernet_attention.errors import BadInput
from hypernet_attention.tasks import lm_text

# Grain's reader threads per iterator (tokenizing runs in them) and documents read ahead.
READ_OPTIONS = grain.ReadOptions(num_threads=4, prefetch_buffer_size=256)
NO_SHARDING = grain.sharding.NoSharding()


class Vocabulary:
  """The part of `seqio.SentencePieceVocabulary` that training and sampling use, on the
  `sentencepiece` package alone: `encode`, `decode`, `eos_id`, `vocab_size`, `tokenizer`."""

  eos_id = lm_text.EOS_ID

  def __init__(self, model: bytes):
    self.tokenizer = spm.SentencePieceProcessor(model_proto=model)

  @property
  def vocab_size(self) -> int:
    return self.tokenizer.get_piece_size()

  def encode(self, text: str) -> list[int]:
    return self.tokenizer.encode(text)

  def decode(self, ids: Iterable[int]) -> str:
    return self.tokenizer.decode([int(i) for i in ids])


def load_vocabulary(path: str) -> Vocabulary:
  """`lm_text.load_vocabulary` through etils' epath."""
  return lm_text.load_vocabulary(path, lambda p: epath.Path(p).exists(),
                                 lambda p: Vocabulary(epath.Path(p).read_bytes()))


def train_vocabulary(texts: Iterable[str], model_path: str, vocab_size: int = 32_000,
                     max_lines: int = 2_000_000) -> Vocabulary:
  """`lm_text.sentencepiece_model` of `texts`, written to `model_path` (aside, then renamed,
  so an interrupted run leaves no half-written vocabulary)."""
  model = lm_text.sentencepiece_model(texts, vocab_size, max_lines)
  path = epath.Path(model_path)
  path.parent.mkdir(parents=True, exist_ok=True)
  (tmp := epath.Path(model_path + ".tmp")).write_bytes(model)
  tmp.replace(path)
  return load_vocabulary(model_path)


def _glob(pattern: str) -> list[str]:
  if "://" not in pattern:
    return glob.glob(pattern)
  fs, _ = fsspec.core.url_to_fs(pattern)
  return [fs.unstrip_protocol(p) for p in fs.glob(pattern)]


def _head(path: str) -> bytes:
  with epath.Path(path).open("rb") as f:
    return f.read(lm_text.CHECK_BYTES)


def read_documents(files: Sequence[str]) -> list[str]:
  """The files' documents in order: one per line (TensorFlow's line reader: '\\n' or
  '\\r\\n' ends a line), a .jsonl line's 'text' field; blank ones dropped, as seqio's."""
  docs = []
  for path in files:
    lines = epath.Path(path).read_bytes().split(b"\n")
    if lines and not lines[-1]:
      lines.pop()  # The newline that ends the file starts no line.
    for line in lines:
      line = line.removesuffix(b"\r")
      text = (lm_text.json_text_or_skip(line) if path.endswith(".jsonl")
              else line.decode("utf-8", "replace"))
      if text.encode("utf-8").strip():  # ASCII whitespace, as tf.strings.strip.
        docs.append(text)
  return docs


def c4_documents(data_dir: str, split: str) -> grain.MapDataset:
  """The texts of TFDS `c4/en` (newest version under `data_dir`, ArrayRecord) as a
  random-access Grain dataset; one clear error if it is absent or in another format."""
  folder = lm_text.newest_c4(data_dir, _glob, " --file_format=array_record")
  info = json.loads(epath.Path(folder, "dataset_info.json").read_text())
  file_format = info.get("fileFormat", "tfrecord")
  if file_format != "array_record":
    raise BadInput(lm_text.one_line(
        f"TFDS c4/en in {folder!r} is {file_format}; allowed with "
        f"task.pipeline='grain': array_record (`tfds build c4/en --file_format=array_record "
        f"--data_dir={data_dir}`), or task.pipeline='seqio' (needs TensorFlow)"))
  if not _glob(os.path.join(folder, f"c4-{split}.array_record*")):
    raise BadInput(lm_text.one_line(  # (TFDS itself fails with a 76-line AssertionError)
        f"TFDS c4/en in {folder!r} holds no {split} shards "
        f"(c4-{split}.array_record-*); allowed: a complete build (`tfds build c4/en "
        f"--file_format=array_record --data_dir={data_dir}`)"))
  import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top  # Only for c4.
  source = tfds.data_source(f"c4/en:{os.path.basename(folder)}", split=split, data_dir=data_dir)
  return grain.MapDataset.source(source).map(lambda record: record["text"])


@dataclasses.dataclass(frozen=True)
class Task:
  """A language-modeling task: its vocabulary and each split's documents (random access:
  str or UTF-8 bytes)."""
  name: str
  vocabulary: Vocabulary
  documents: dict[str, grain.MapDataset]


def build_task(task_config) -> Task:
  """`config.task` (name, data_dir or *_files, vocabulary) -> its `Task`. The vocabulary
  is checked first, then the data, so either error comes before any work."""
  lm_text.check_task_name(task_config.name)
  vocabulary = load_vocabulary(task_config.vocabulary)
  return Task(task_config.name, vocabulary,
              {split: build_documents(task_config, split) for split in lm_text.SPLITS})


def task_vocabulary(task: Task) -> Vocabulary:
  return task.vocabulary


def resolve(task_config, workdir: str) -> ml_collections.ConfigDict:
  """`lm_text.resolve` with epath and this path's documents (the first training documents
  in file order train a vocabulary)."""
  def documents(task):
    texts = build_documents(task, "train")
    count = min(len(texts), task.vocab_documents or len(texts))
    return (_text(texts[i]) for i in range(count))
  return lm_text.resolve(task_config, workdir, exists=lambda p: epath.Path(p).exists(),
                         documents=documents, train_vocabulary=train_vocabulary)


def build_documents(task_config, split: str) -> grain.MapDataset:
  """The split's documents of `config.task`: TFDS c4/en or the text files."""
  if task_config.name == "c4_lm":
    return c4_documents(task_config.data_dir, split)
  files = lm_text.text_files(task_config.get(f"{split}_files"), split, _glob, _head)
  return grain.MapDataset.source(read_documents(files))


def _text(text: str | bytes) -> str:
  return text.decode("utf-8") if isinstance(text, bytes) else text


def _has_text(text: str | bytes) -> bool:
  return bool((text if isinstance(text, bytes) else text.encode("utf-8")).strip())


def batches(task: Task, *, split: str, sequence_length: int, batch_size: int, seed: int,
            shard: grain.sharding.ShardOptions = NO_SHARDING,
            shuffle: bool = True, num_epochs: Optional[int] = None) -> grain.IterDataset:
  """Per-process batches {'inputs', 'targets', 'weights'}: (B, T) int32, B = batch_size.

  `num_epochs=None` repeats forever (training); evaluation reads the first batches of the
  unshuffled split."""
  lm_text.check_batches(split, sequence_length, batch_size)
  encode = task.vocabulary.tokenizer.encode

  def tokens(text):
    return {"targets": np.asarray(encode(_text(text)) + [lm_text.EOS_ID], np.int32)}

  documents = task.documents[split][shard.shard_index::shard.shard_count]
  if shuffle:
    documents = documents.shuffle(seed=seed)
  rows = grain.experimental.ConcatThenSplitIterDataset(
      documents.repeat(num_epochs).filter(_has_text).map(tokens).to_iter_dataset(
          READ_OPTIONS), length_struct={"targets": sequence_length})
  # The stream's last, partial row (padded with segment id 0) is dropped, as by seqio.
  rows = rows.filter(lambda row: row["targets_segment_ids"][-1] != 0)
  return rows.map(lambda row: row["targets"]).batch(batch_size, drop_remainder=True).map(_features)


def _features(targets_BT: np.ndarray) -> dict[str, np.ndarray]:
  """Rows -> seqio's `LMFeatureConverter` features: inputs shifted right (BOS = pad id 0),
  weight 1 on every non-pad target."""
  inputs_BT = np.pad(targets_BT[:, :-1], ((0, 0), (1, 0)), constant_values=lm_text.PAD_ID)
  return {"inputs": inputs_BT, "targets": targets_BT,
          "weights": (targets_BT != lm_text.PAD_ID).astype(np.int32)}


def _evaluate_batches(dataset: grain.IterDataset, num_batches: int
                      ) -> Iterator[dict[str, np.ndarray]]:
  iterator = iter(dataset)
  try:
    yield from itertools.islice(iterator, num_batches)
  finally:
    iterator.close()  # Stops its reader threads now, not when it is collected.


def readers(task: Task, sequence_length: int) -> tuple[Callable[..., Any], ...]:
  """`batches` of `task` as the two readers of a host source (`train/data.HostSource`,
  which `objectives.c4_lm` builds from them): train, shuffled from the seed, endless, a
  Grain iterator that Grain's handler checkpoints; evaluate, the split's first rows,
  unshuffled. Their arguments are `HostSource.train`'s and `HostSource.evaluate`'s."""

  def train(seed, batch_size, process_index, process_count) -> Any:
    return iter(batches(task, split="train", sequence_length=sequence_length,
                        batch_size=batch_size, seed=seed,
                        shard=grain.sharding.ShardOptions(process_index, process_count)))

  def evaluate(split, batch_size, num_batches, process_index, process_count):
    return _evaluate_batches(batches(
        task, split=split, sequence_length=sequence_length, batch_size=batch_size, seed=0,
        shuffle=False, shard=grain.sharding.ShardOptions(process_index, process_count)),
        num_batches)

  return train, evaluate
