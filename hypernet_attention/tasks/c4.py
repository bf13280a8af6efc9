"""Language-modeling data (the paper's Fig. 6): seqio Tasks `c4_lm` and `text_lm`, packed rows.

Two seqio Tasks, registered by name:
  c4_lm    TFDS `c4/en` (field `text`) from a `data_dir` that is a local folder or a
           `gs://` bucket where `tfds build c4/en --data_dir=DIR` has run; splits `train`,
           `validation`.
  text_lm  local text files: `.txt` (one document per line) or `.jsonl` (one JSON object
           per line, the document in its `text` field, as C4's own json dumps); one file
           pattern per split.
Both tokenize with a SentencePiece vocabulary (`lm_text`; e.g. T5's 32k C4 vocabulary, or one
trained by `experiments/train_vocabulary.py`), append EOS to every document, then *concatenate
and split* the token stream into rows of exactly `sequence_length` tokens: every token is used
once, no row is padded (the stream's last partial row is dropped). Inputs are the rows shifted
right (seqio's `LMFeatureConverter`, BOS = pad id 0): a row of T tokens gives T predictions.

Order and sharding: files and rows are shuffled from `seed` (deterministic: the same seed
gives the same batches); process `i` of `n` reads shard `seqio.ShardInfo(i, n)`, disjoint
from the others. `DataIterator` yields per-process numpy batches and saves / restores its
position with a per-process `tf.train.Checkpoint` of the tf.data iterator (as t5x does),
so a resumed run neither replays nor skips data.

Shape letters: B batch (per process), T tokens per row."""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

import chex
import ml_collections
import numpy as np
import seqio
import tensorflow as tf

from hypernet_attention.errors import BadInput
from hypernet_attention.tasks import lm_text


def load_vocabulary(path: str) -> seqio.SentencePieceVocabulary:
  """`lm_text.load_vocabulary` through TensorFlow's file system."""
  return lm_text.load_vocabulary(path, tf.io.gfile.exists, seqio.SentencePieceVocabulary)


def train_vocabulary(texts: Iterable[str], model_path: str, vocab_size: int = 32_000,
                     max_lines: int = 2_000_000) -> seqio.SentencePieceVocabulary:
  """Trains a unigram SentencePiece model on `texts` (`lm_text.sentencepiece_model`) and
  writes it to `model_path`."""
  model = lm_text.sentencepiece_model(texts, vocab_size, max_lines)
  directory = os.path.dirname(model_path)
  if directory:
    tf.io.gfile.makedirs(directory)
  # Written aside and renamed, so an interrupted run leaves no half-written vocabulary.
  with tf.io.gfile.GFile(model_path + ".tmp", "wb") as f:
    f.write(model)
  tf.io.gfile.rename(model_path + ".tmp", model_path, overwrite=True)
  return load_vocabulary(model_path)


def c4_source(data_dir: str) -> seqio.TfdsDataSource:
  """TFDS `c4/en`, the newest version prepared under `data_dir` (`lm_text.newest_c4`)."""
  version = os.path.basename(lm_text.newest_c4(data_dir, tf.io.gfile.glob))
  return seqio.TfdsDataSource(tfds_name=f"c4/en:{version}", tfds_data_dir=data_dir,
                              splits=lm_text.SPLITS)


def text_files(pattern: str, split: str) -> list[str]:
  """`lm_text.text_files` through TensorFlow's file system."""
  return lm_text.text_files(pattern, split, tf.io.gfile.glob, _head)


def _head(path: str) -> bytes:
  with tf.io.gfile.GFile(path, "rb") as f:
    return f.read(lm_text.CHECK_BYTES)


def text_source(train_files: str, validation_files: str) -> seqio.TextLineDataSource:
  return seqio.TextLineDataSource(
      {"train": text_files(train_files, "train"),
       "validation": text_files(validation_files, "validation")})


def _parse_json_text(line: tf.Tensor) -> tf.Tensor:
  """`lm_text.json_text_or_skip` of one .jsonl line, in tf.data: only each file's first
  `lm_text.CHECK_BYTES` are checked before work (a C4-sized corpus cannot be read first)."""
  def parse(line_bytes):
    return lm_text.json_text_or_skip(line_bytes.numpy())
  return tf.py_function(parse, [line], tf.string)


def to_text(source: seqio.DataSource, dataset: tf.data.Dataset) -> tf.data.Dataset:
  """A source's records -> {'text': document}, dropping empty documents."""
  if isinstance(source, seqio.TfdsDataSource):
    dataset = dataset.map(lambda ex: {"text": ex["text"]})
  else:
    jsonl = source.list_shards("train")[0].endswith(".jsonl")
    parse = _parse_json_text if jsonl else tf.identity
    dataset = dataset.map(lambda line: {"text": tf.ensure_shape(parse(line), [])},
                          num_parallel_calls=tf.data.AUTOTUNE)
  return dataset.filter(lambda ex: tf.strings.length(tf.strings.strip(ex["text"])) > 0)


def documents(source: seqio.DataSource, split: str = "train",
              max_documents: Optional[int] = None) -> Iterator[str]:
  """The split's documents as Python strings, in file order (e.g. to train a vocabulary)."""
  dataset = to_text(source, source.get_dataset(split, shuffle=False))
  if max_documents:
    dataset = dataset.take(max_documents)
  for example in dataset.as_numpy_iterator():
    yield example["text"].decode("utf-8")


@seqio.map_over_dataset
def _rekey_targets(example):
  return {"targets": example["text"]}


def concatenate_and_split(dataset: tf.data.Dataset,
                          sequence_length: Mapping[str, int]) -> tf.data.Dataset:
  """Token streams of consecutive documents -> rows of exactly sequence_length['targets'].

  A running remainder carries the tokens that did not fill a row into the next document,
  so every token lands in exactly one row, in order; only the last partial row is lost."""
  length = sequence_length["targets"]

  def step(carry_T, example):
    tokens_T = tf.concat([carry_T, tf.cast(example["targets"], tf.int32)], 0)
    rows = tf.shape(tokens_T)[0] // length
    return tokens_T[rows * length:], {"targets": tf.reshape(tokens_T[:rows * length],
                                                            [rows, length])}

  return dataset.scan(tf.zeros([0], tf.int32), step).unbatch()


def register(name: str, source: seqio.DataSource,
             vocabulary: seqio.SentencePieceVocabulary) -> seqio.Task:
  """(Re-)registers Task `name` on `source` with `vocabulary` and returns it.

  Re-registering replaces the previous definition, so a process can build tasks for
  different data directories (tests, eval on another corpus) under the same name."""
  lm_text.check_task_name(name)
  seqio.TaskRegistry.remove(name)

  def text_preprocessor(dataset):
    return to_text(source, dataset)

  return seqio.TaskRegistry.add(
      name, source=source,
      preprocessors=[text_preprocessor, _rekey_targets, seqio.preprocessors.tokenize,
                     seqio.preprocessors.append_eos, concatenate_and_split],
      output_features={"targets": seqio.Feature(vocabulary, add_eos=True)})


def source(task_config) -> seqio.DataSource:
  """`config.task` (name, data_dir or *_files) -> its seqio DataSource."""
  lm_text.check_task_name(task_config.name)
  if task_config.name == "c4_lm":
    return c4_source(task_config.data_dir)
  return text_source(task_config.train_files, task_config.validation_files)


def build_task(task_config) -> seqio.Task:
  """`config.task` (name, data_dir or *_files, vocabulary) -> the registered seqio Task.

  The vocabulary is checked first, then the data, so either error comes before any work."""
  vocabulary = load_vocabulary(task_config.vocabulary)
  return register(task_config.name, source(task_config), vocabulary)


def resolve(task_config, workdir: str) -> ml_collections.ConfigDict:
  """`lm_text.resolve` with TensorFlow's file system and this path's documents."""
  return lm_text.resolve(task_config, workdir, exists=tf.io.gfile.exists,
                         documents=lambda task: documents(source(task), "train",
                                                          task.vocab_documents),
                         train_vocabulary=train_vocabulary)


def batches(task: seqio.Task, *, split: str, sequence_length: int, batch_size: int,
            seed: int, shard_info: seqio.ShardInfo = seqio.ShardInfo(0, 1),
            shuffle: bool = True, num_epochs: Optional[int] = None) -> tf.data.Dataset:
  """Per-process batches {'inputs', 'targets', 'weights'}: (B, T) int32, B = batch_size.

  `num_epochs=None` repeats forever (training); evaluation takes a fixed number of batches
  of one pass with `shuffle=False`."""
  lm_text.check_batches(split, sequence_length, batch_size)
  dataset = seqio.get_dataset(
      task, task_feature_lengths={"targets": sequence_length},
      feature_converter=seqio.LMFeatureConverter(pack=False), dataset_split=split,
      shuffle=shuffle, num_epochs=num_epochs, shard_info=shard_info, seed=seed,
      batch_size=batch_size, verbose=False)
  dataset = dataset.map(lambda ex: {"inputs": ex["decoder_input_tokens"],
                                    "targets": ex["decoder_target_tokens"],
                                    "weights": ex["decoder_loss_weights"]})
  options = tf.data.Options()
  options.deterministic = True
  # The only external state is the jsonl parser's py_function, which holds none between
  # elements; without this the iterator could not be checkpointed.
  options.experimental_external_state_policy = (tf.data.experimental.ExternalStatePolicy.IGNORE)
  return dataset.with_options(options).prefetch(2)


class DataIterator:
  """Numpy batches from a tf.data pipeline, with a position that can be saved and restored.

  `save(directory)` writes this process's iterator state (`{directory}/process_{i}-of-
  {n}.*`, the t5x layout); `restore(directory)` on an iterator over the same pipeline
  continues exactly where the saved one was."""

  def __init__(self, dataset: tf.data.Dataset, shard_info: seqio.ShardInfo = seqio.ShardInfo(0, 1)):
    self._iterator = iter(dataset)
    self._checkpoint = tf.train.Checkpoint(iterator=self._iterator)
    self._name = f"process_{shard_info.index}-of-{shard_info.num_shards}"

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    batch = {k: v.numpy() for k, v in next(self._iterator).items()}
    # Tokens, targets and loss weights: (B, T) each, T fixed by the pipeline's padding.
    chex.assert_rank(batch["inputs"], 2)
    chex.assert_equal_shape([batch["inputs"], batch["targets"], batch["weights"]])
    return batch

  def path(self, directory: str) -> str:
    return os.path.join(directory, self._name)

  def save(self, directory: str) -> None:
    tf.io.gfile.makedirs(directory)
    self._checkpoint.write(self.path(directory))

  def restore(self, directory: str) -> None:
    if not tf.io.gfile.exists(self.path(directory) + ".index"):
      raise BadInput(lm_text.one_line(
          f"no data iterator state {self.path(directory)!r}; allowed: a directory written "
          f"by DataIterator.save with the same process count."))
    self._checkpoint.read(self.path(directory)).assert_consumed()


def task_vocabulary(task: seqio.Task) -> seqio.SentencePieceVocabulary:
  return task.output_features["targets"].vocabulary


def readers(task: seqio.Task, sequence_length: int) -> tuple[Callable[..., Any], ...]:
  """`batches` of a registered seqio Task as the two readers of a host source
  (`train/data.HostSource`, which `objectives.c4_lm` builds from them): train(seed,
  batch_size, process_index, process_count), shuffled from the seed, endless, and
  evaluate(split, batch_size, num_batches, process_index, process_count), the split's
  first rows, unshuffled, repeated if it is short."""

  def train(seed, batch_size, process_index, process_count):
    shard = seqio.ShardInfo(process_index, process_count)
    return DataIterator(batches(task, split="train", sequence_length=sequence_length,
                                batch_size=batch_size, seed=seed, shard_info=shard), shard)

  def evaluate(split, batch_size, num_batches, process_index, process_count):
    dataset = batches(task, split=split, sequence_length=sequence_length,
                      batch_size=batch_size, seed=0, shuffle=False,
                      shard_info=seqio.ShardInfo(process_index, process_count))
    return dataset.take(num_batches).as_numpy_iterator()

  return train, evaluate
