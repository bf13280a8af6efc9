"""Language-modeling data (`tasks/c4.py`) and the C4 config.

The `c4_lm` Task runs on `tfds.testing.mock_data` (short random texts, so enough examples
to fill packed rows) against metadata written the way `tfds build` writes it; `text_lm`
runs on a generated corpus of random words with a vocabulary trained on it. Expected
token streams are computed independently with the `sentencepiece` processor. seqio needs
TensorFlow: without it (the README's `[dev]` install) the tests of the seqio path skip.
"""

import json
import os
import re

import jax
import ml_collections
import numpy as np
import pytest
import sentencepiece as spm

from experiments.configs import c4_lm as c4_config
from hypernet_attention import errors
from hypernet_attention import transformer
from hypernet_attention.tasks import lm_text
from hypernet_attention.train import build
from hypernet_attention.train import state as state_lib

import c4_testlib
import train_testlib as tl

try:  # The seqio path needs TensorFlow (not in '.[dev]'): without it, its tests skip.
  import seqio
  import tensorflow_datasets as tfds

  from hypernet_attention.tasks import c4
except ModuleNotFoundError:
  seqio = tfds = c4 = None
needs_seqio = c4_testlib.seqio_tests(c4 is not None)

SEQ = 16


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  return c4_testlib.write_corpus(str(tmp_path_factory.mktemp("corpus")))


def _task_config(**changes):
  config = ml_collections.ConfigDict(dict(
      name="text_lm", data_dir="", train_files="", validation_files="", vocabulary=""))
  config.update(changes)
  return config


def _text_task(corpus, train=None):
  return c4.build_task(_task_config(
      train_files=train or corpus["train"], validation_files=corpus["validation"],
      vocabulary=corpus["vocabulary"]))


def _rows(task, shard=None, **kwargs):
  kwargs = dict(split="train", sequence_length=SEQ, batch_size=1, seed=0, shuffle=False,
                num_epochs=1, shard_info=shard or seqio.ShardInfo(0, 1)) | kwargs
  return np.concatenate([b["targets"] for b in
                         c4.batches(task, **kwargs).as_numpy_iterator()])


def _stream(corpus, docs):
  processor = spm.SentencePieceProcessor(model_file=corpus["vocabulary"])
  return np.concatenate([processor.encode(d) + [lm_text.EOS_ID] for d in docs])


@needs_seqio
def test_trained_vocabulary_round_trips_and_counts_bytes(corpus):
  vocabulary = c4.load_vocabulary(corpus["vocabulary"])
  assert vocabulary.vocab_size == 300
  assert (vocabulary.pad_id, vocabulary.eos_id) == (lm_text.PAD_ID, lm_text.EOS_ID)
  lengths = lm_text.token_byte_lengths(vocabulary)
  for doc in corpus["docs"][:20]:
    ids = vocabulary.encode(doc)
    assert vocabulary.decode(ids) == doc
    # Word-start markers count as spaces: the document plus the one before its first word.
    assert lengths[ids].sum() == len(doc.encode("utf-8")) + 1
  assert lengths[[lm_text.PAD_ID, lm_text.EOS_ID, lm_text.UNK_ID]].sum() == 0


@needs_seqio
def test_packing_keeps_every_token_once_in_order(corpus):
  rows_NT = _rows(_text_task(corpus))
  stream = _stream(corpus, corpus["docs"])
  assert rows_NT.shape[1] == SEQ and len(stream) - rows_NT.size < SEQ
  np.testing.assert_array_equal(rows_NT.reshape(-1), stream[:rows_NT.size])


@needs_seqio
def test_txt_files_give_the_jsonl_stream(corpus, tmp_path):
  txt = tmp_path / "train.txt"
  txt.write_text("".join(d + "\n" for d in corpus["docs"]))
  np.testing.assert_array_equal(_rows(_text_task(corpus, str(txt))),
                                _rows(_text_task(corpus)))


@needs_seqio
def test_inputs_are_targets_shifted_right(corpus):
  batch = next(c4.batches(_text_task(corpus), split="train", sequence_length=SEQ,
                          batch_size=4, seed=0).as_numpy_iterator())
  assert batch["targets"].shape == batch["inputs"].shape == (4, SEQ)
  np.testing.assert_array_equal(batch["inputs"][:, 0], lm_text.PAD_ID)
  np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
  np.testing.assert_array_equal(batch["weights"], 1)


def _first_batches(task, seed, count=4):
  iterator = c4.DataIterator(c4.batches(task, split="train", sequence_length=SEQ,
                                        batch_size=4, seed=seed))
  return np.stack([next(iterator)["targets"] for _ in range(count)])


@needs_seqio
def test_order_is_a_function_of_the_seed(corpus):
  task = _text_task(corpus)
  np.testing.assert_array_equal(_first_batches(task, 0), _first_batches(task, 0))
  assert not np.array_equal(_first_batches(task, 0), _first_batches(task, 1))


@needs_seqio
def test_two_shards_read_disjoint_documents(corpus):
  task = _text_task(corpus)
  for index in range(2):
    rows_NT = _rows(task, seqio.ShardInfo(index, 2))
    # Each process packs its own documents: every other line of the file.
    expected = _stream(corpus, corpus["docs"][index::2])
    np.testing.assert_array_equal(rows_NT.reshape(-1), expected[:rows_NT.size])


@needs_seqio
def test_iterator_restore_continues_exactly(corpus, tmp_path):
  def iterator():
    return c4.DataIterator(c4.batches(_text_task(corpus), split="train",
                                      sequence_length=SEQ, batch_size=8, seed=3))
  first = iterator()
  for _ in range(3):
    next(first)
  first.save(str(tmp_path / "data"))
  # 40 more batches of 8 rows cross the end of the ~70-row epoch several times.
  expected = [next(first)["targets"] for _ in range(40)]
  resumed = iterator()
  resumed.restore(str(tmp_path / "data"))
  np.testing.assert_array_equal([next(resumed)["targets"] for _ in range(40)], expected)
  fresh = iterator()
  assert not np.array_equal(next(fresh)["targets"], expected[0])


@needs_seqio
def test_c4_task_on_mock_tfds(corpus, tmp_path):
  num_examples = 256  # Mock texts are a few words: ~10 tokens each.
  data_dir = c4_testlib.mock_c4_dir(tmp_path, num_examples)
  with tfds.testing.mock_data(num_examples=num_examples, data_dir=data_dir):
    task = c4.build_task(_task_config(name="c4_lm", data_dir=data_dir,
                                      vocabulary=corpus["vocabulary"]))
    assert seqio.get_mixture_or_task("c4_lm") is task
    for split in lm_text.SPLITS:
      batches = list(c4.batches(task, split=split, sequence_length=SEQ, batch_size=8,
                                seed=0, num_epochs=1, shuffle=False).as_numpy_iterator())
      assert len(batches) >= 10
      targets = np.concatenate([b["targets"] for b in batches])
      assert targets.min() >= 1 and targets.max() < 300
      assert (targets == lm_text.EOS_ID).sum() >= num_examples * 0.8  # One per document.


def _error_line(error):
  message = str(error.value)
  assert "\n" not in message
  return message


@needs_seqio
def test_missing_c4_data_names_the_directory_and_both_remedies(corpus, tmp_path):
  with pytest.raises(errors.BadInput) as error:
    c4.build_task(_task_config(name="c4_lm", data_dir=str(tmp_path / "tfds"),
                               vocabulary=corpus["vocabulary"]))
  message = _error_line(error)
  assert str(tmp_path / "tfds") in message
  assert "tfds build c4/en" in message and "text_lm" in message


@needs_seqio
@pytest.mark.parametrize("kind", ["missing", "not_a_model"])
def test_bad_vocabulary_is_one_clear_line(corpus, tmp_path, kind):
  path = tmp_path / "vocabulary.model"
  if kind == "not_a_model":
    path.write_bytes(b"not a sentencepiece model")
  with pytest.raises(errors.BadInput) as error:
    c4.build_task(_task_config(train_files=corpus["train"],
                               validation_files=corpus["validation"], vocabulary=str(path)))
  assert str(path) in _error_line(error) and "SentencePiece" in _error_line(error)


@needs_seqio
def test_unreachable_bucket_vocabulary_is_one_clear_line(corpus, monkeypatch):
  """The default T5 vocabulary (gs://) on a machine without network or credentials: the
  GCS file system raises rather than answering 'no' (it used to escape as a traceback)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  path = "gs://t5-data/vocabs/cc_all.32000/sentencepiece.model"

  def unreachable(p):
    if p.startswith("gs://"):
      raise tf.errors.FailedPreconditionError(None, None, "Could not resolve host: x")
    return os.path.exists(p)

  monkeypatch.setattr(tf.io.gfile, "exists", unreachable)
  with pytest.raises(errors.BadInput) as error:
    c4.build_task(_task_config(train_files=corpus["train"],
                               validation_files=corpus["validation"], vocabulary=path))
  message = _error_line(error)
  assert path in message and "cannot be read here" in message and "Could not resolve" in message


@needs_seqio
@pytest.mark.parametrize("kind", ["empty", "no_match", "mixed"])
def test_bad_corpus_is_one_clear_line(corpus, tmp_path, kind):
  (tmp_path / "a.txt").write_text("")
  (tmp_path / "b.jsonl").write_text(json.dumps({"text": "x"}) + "\n")
  pattern = {"empty": "a.txt", "no_match": "c*.txt", "mixed": "*"}[kind]
  with pytest.raises(errors.BadInput) as error:
    c4.build_task(_task_config(train_files=str(tmp_path / pattern),
                               validation_files=corpus["validation"],
                               vocabulary=corpus["vocabulary"]))
  assert pattern in _error_line(error)
  assert {"empty": "empty corpus", "no_match": "no files", "mixed": "suffixes"}[kind] in (
      _error_line(error))


# Corpus files that are not text (issue 25, point 7): one line naming the file (and line),
# before any work; before, TensorFlow's reader or the vocabulary trainer raised mid-way.
BAD_TEXT = {
    # name: (file name, bytes, expected message)
    "binary": ("a.txt", b"text\n\x00\x01\x02", "is binary (a NUL byte at offset 5)"),
    "latin1": ("a.txt", "caf\u00e9 au lait\n".encode("latin-1"),
               "is not UTF-8 (byte 0xe9 at offset 3; Latin-1?"),
    "blank": ("a.txt", b"  \n\t\n\n", "empty corpus"),
    "blank_jsonl": ("a.jsonl", b'{"text": " "}\n{"url": "x"}\n', "empty corpus"),
    "not_json": ("a.jsonl", b'{"text": "fine"}\nplain text\n', "line 2 is not JSON"),
    "json_list": ("a.jsonl", b'["text"]\n', "line 1 is list; allowed: UTF-8 text"),
    "json_text_number": ("a.jsonl", b'{"text": 3}\n', "line 1 is dict with a non-string"),
}


@needs_seqio
@pytest.mark.parametrize("kind", sorted(BAD_TEXT))
def test_corpus_that_is_not_text_is_one_line_naming_the_file(tmp_path, kind):
  name, data, message = BAD_TEXT[kind]
  (tmp_path / name).write_bytes(data)
  with pytest.raises(errors.BadInput, match=re.escape(message)) as error:
    c4.text_files(str(tmp_path / name), "train")
  assert (kind.startswith("blank") or str(tmp_path / name) in str(error.value)
          and "\n" not in str(error.value))


@needs_seqio
def test_text_files_check_only_complete_lines(tmp_path):
  """A line cut by the checked head (`CHECK_BYTES`) is not judged; a character cut there is
  no decoding error."""
  record = json.dumps({"text": "\u00e9" * 100}) + "\n"
  (tmp_path / "a.jsonl").write_text(record * (2 * lm_text.CHECK_BYTES // len(record)))
  assert c4.text_files(str(tmp_path / "a.jsonl"), "train")


def test_sequence_length_above_max_len_is_refused():
  with pytest.raises(ValueError, match="sequence_length=1024 exceeds model.max_len=512"):
    lm_text.check_sequence_length(1024, 512)
  lm_text.check_sequence_length(512, 512)
  model = transformer.Transformer(transformer.TransformerConfig(
      input_kind="embed", vocab_size=10, output_dim=10, max_len=8, causal=True))
  with pytest.raises(ValueError, match="exceed max_len=8"):
    model.init(jax.random.PRNGKey(0), np.zeros((1, 9), np.int32))


def _count_params(size, tied):
  config = c4_config.get_config(f"model=hyla,size={size}")
  model_config = build.transformer_config(
      config.model, input_kind="embed", vocab_size=32_000, output_dim=32_000,
      tied_embedding=tied)
  shapes = jax.eval_shape(lambda: tl.token_model_params(model_config))
  return state_lib.count_params(shapes)


def test_50m_parameter_count_matches_the_formula():
  v, e, layers, m = 32_000, 512, 6, 2048
  per_layer = 4 * (e * e + e) + (e * m + m) + (m * e + e) + 4 * e
  tied = v * e + layers * per_layer + 2 * e
  assert _count_params("50m", tied=False) == tied + e * v + v == 51_715_328
  assert _count_params("50m", tied=True) == tied == 35_299_328


@needs_seqio
def test_resolve_writes_a_docstring_corpus_and_vocabulary_once(tmp_path):
  task = c4_config.get_config("size=smoke").task.to_dict() | dict(docstring_corpus_mb=0.1)
  resolved = c4.resolve(ml_collections.ConfigDict(task), str(tmp_path))
  assert resolved.name == "text_lm" and resolved.vocabulary == str(tmp_path / "vocabulary.model")
  assert c4.load_vocabulary(resolved.vocabulary).vocab_size == task["vocab_size"]
  train_docs = list(c4.documents(c4.source(resolved), "train"))
  assert len(train_docs) > 20 and sum(map(len, train_docs)) > 0.05 * 2**20
  stamp = os.path.getmtime(resolved.vocabulary)
  assert c4.resolve(ml_collections.ConfigDict(task), str(tmp_path)) == resolved
  assert os.path.getmtime(resolved.vocabulary) == stamp
