"""What the two language-modeling data paths share, with neither TensorFlow, seqio nor Grain.

The paths (`config.task.pipeline`, `PIPELINES`):
  seqio  `tasks/c4.py`: seqio Tasks on tf.data (needs TensorFlow: the [lm] extra).
  grain  `tasks/c4_grain.py`: `tfds.data_source` (ArrayRecord) or local text files through
         Grain (no TensorFlow: the [grain] extra).
Both tokenize with the same SentencePiece vocabulary, append EOS to every document and cut
the token stream into rows of exactly `sequence_length` tokens; this module holds their
constants, the checks of a vocabulary and of corpus files, and the byte counts behind bits
per byte, so that the two cannot drift apart. File I/O stays in each path (TensorFlow's
gfile there, etils' epath here), which is why the checks take bytes, not paths."""

from __future__ import annotations

import codecs
import copy
import io
import json
import os
import threading
from typing import Callable, Iterable, Iterator, Optional

from absl import logging
import jax
import ml_collections
import numpy as np
import sentencepiece as spm

from hypernet_attention import multihost
from hypernet_attention.errors import BadInput
from hypernet_attention.tasks import docstring_corpus

# config.task.pipeline -> the module of that data path (same functions in both).
PIPELINES = {"seqio": "hypernet_attention.tasks.c4", "grain": "hypernet_attention.tasks.c4_grain"}
TASKS = ("c4_lm", "text_lm")
SPLITS = ("train", "validation")
TEXT_SUFFIXES = (".txt", ".jsonl")
PAD_ID, EOS_ID, UNK_ID = 0, 1, 2  # T5's SentencePiece ids, which seqio assumes.
VOCABULARY_HELP = ("a SentencePiece .model file with pad=0, eos=1 (the T5 C4 vocabulary, "
                   "or one made by `python experiments/train_vocabulary.py`)")
CHECK_BYTES = 1 << 16  # Of each corpus file, checked before any work (C4 is 1024 files).
TEXT_HELP = ("UTF-8 text: .txt with one document per line, or .jsonl with one JSON object "
             "per line and the document in its 'text' field")


def one_line(message: str) -> str:
  return " ".join(message.split())


def check_pipeline(task_config) -> str:
  """`config.task.pipeline` (absent in configs written before it existed: seqio)."""
  name = task_config.get("pipeline", "seqio")
  if name not in PIPELINES:
    raise BadInput(f"config.task.pipeline={name!r}; allowed: {', '.join(PIPELINES)}")
  return name


def check_task_name(name: str) -> None:
  if name not in TASKS:
    raise BadInput(f"unknown config.task.name {name!r}; allowed: {', '.join(TASKS)}.")


def newest_c4(data_dir: str, glob: Callable[[str], Iterable[str]], build_flags: str = "") -> str:
  """The folder of the newest TFDS c4/en version under `data_dir` (`glob`: through its file
  system), or one clear line naming the `tfds build` (with `build_flags`) that makes one."""
  infos = glob(os.path.join(data_dir or ".", "c4", "en", "*", "dataset_info.json"))
  if not data_dir or not infos:
    raise BadInput(one_line(
        f"no prepared TFDS c4/en under data_dir={data_dir!r}; allowed: build it there with `tfds "
        f"build c4/en{build_flags} --data_dir={data_dir or 'DIR'}` (a local folder or a gs:// "
        "bucket; set --config.task.data_dir), or train on local files with --config.task.name="
        "text_lm --config.task.train_files=... --config.task.validation_files=..."))
  version = lambda p: tuple(int(x) for x in os.path.basename(os.path.dirname(p)).split("."))
  return os.path.dirname(max(infos, key=version))


def load_vocabulary(path: str, exists: Callable[[str], bool], make: Callable[[str], object]):
  """`make(path)`, the SentencePiece vocabulary at `path` (local or gs://; `exists` and
  `make` read through the path's file system), or one clear line if it is unusable.

  A gs:// path on a machine that cannot reach the bucket (no network, no credentials: most
  accelerator hosts and CI) makes the file system raise, not return False."""
  try:
    found = bool(path) and exists(path)
  except Exception as e:  # pylint: disable=broad-except
    raise BadInput(one_line(
        f"vocabulary file {path!r} cannot be read here ({getattr(e, 'message', e)}); "
        f"allowed: {VOCABULARY_HELP}, at a path this machine can read.")) from None
  if not found:
    raise BadInput(one_line(
        f"vocabulary file {path!r} does not exist; allowed: {VOCABULARY_HELP}."))
  try:
    vocabulary = make(path)
    processor = vocabulary.tokenizer
  except Exception as e:  # pylint: disable=broad-except  # sentencepiece: RuntimeError, OSError.
    raise BadInput(one_line(
        f"vocabulary file {path!r} is not a SentencePiece model ({e}); allowed: "
        f"{VOCABULARY_HELP}.")) from None
  if (processor.pad_id(), processor.eos_id()) != (PAD_ID, EOS_ID):
    raise BadInput(one_line(
        f"vocabulary {path!r} has pad={processor.pad_id()}, eos={processor.eos_id()}; "
        f"allowed: {VOCABULARY_HELP}."))
  return vocabulary


def sentencepiece_model(texts: Iterable[str], vocab_size: int, max_lines: int) -> bytes:
  """A unigram SentencePiece model trained on `texts` (the file's bytes).

  T5's conventions (pad=0, eos=1, unk=2, no bos) so that seqio treats it as the C4
  vocabulary; byte fallback so that no text maps to unk. Documents are fed line by line
  (SentencePiece skips "sentences" longer than 4192 bytes), at most `max_lines` of them."""
  def lines():
    count = 0
    for text in texts:
      for line in text.splitlines():
        if line.strip() and count < max_lines:
          count += 1
          yield line
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=lines(), model_writer=model, vocab_size=vocab_size,
        model_type="unigram", pad_id=PAD_ID, eos_id=EOS_ID, unk_id=UNK_ID, bos_id=-1,
        byte_fallback=True, character_coverage=0.9995, num_threads=1,
        minloglevel=2)  # Keeps SentencePiece's per-iteration log out of the console.
  except RuntimeError as e:  # E.g. fewer pieces than the text has characters.
    raise BadInput(one_line(f"cannot train a vocab_size={vocab_size} vocabulary on this "
                            f"text: {e}")) from None
  return model.getvalue()


def token_byte_lengths(vocabulary) -> np.ndarray:
  """(vocab_size,) UTF-8 bytes each token adds to the (normalized) text, for bits/byte.

  A piece's word-start marker counts as the one space it stands for; byte-fallback pieces
  count one byte; pad/eos/unk and other control pieces count zero."""
  processor = vocabulary.tokenizer
  lengths = np.zeros(vocabulary.vocab_size, np.int32)
  for i in range(processor.get_piece_size()):
    if processor.is_control(i) or processor.is_unknown(i):
      continue
    if processor.is_byte(i):
      lengths[i] = 1
    else:
      lengths[i] = len(processor.id_to_piece(i).replace("\u2581", " ").encode("utf-8"))
  return lengths


def text_files(pattern: str, split: str, glob: Callable[[str], Iterable[str]],
               head: Callable[[str], bytes]) -> list[str]:
  """The files matching the comma-separated glob(s) `pattern` (`glob` one pattern's files,
  `head` a file's first `CHECK_BYTES`); errors for none, mixed suffixes or no text. Every
  file is checked, not only up to the first with text."""
  files = sorted({f for p in pattern.split(",") if p.strip() for f in glob(p.strip())})
  if not files:
    raise BadInput(one_line(
        f"no files match {split} pattern {pattern!r}; allowed: comma-separated globs of "
        f"{'/'.join(TEXT_SUFFIXES)} files (--config.task.{split}_files)."))
  suffixes = {os.path.splitext(f)[1] for f in files}
  if len(suffixes) != 1 or not suffixes <= set(TEXT_SUFFIXES):
    raise BadInput(one_line(
        f"{split} files {pattern!r} have suffixes {sorted(suffixes)}; allowed: all "
        f"{TEXT_SUFFIXES[0]} or all {TEXT_SUFFIXES[1]}."))
  if not any([check_text_head(f, head(f)) for f in files]):
    raise BadInput(one_line(
        f"empty corpus: the {len(files)} {split} file(s) matching {pattern!r} hold no "
        f"text; allowed: files with at least one non-empty document."))
  return files


def check_text_head(path: str, head: bytes) -> bool:
  """Whether `head`, the first `CHECK_BYTES` (or fewer: the whole file) of corpus file `path`, holds
  a non-blank document; `BadInput` naming the file (and line) when it is binary, not UTF-8 (e.g.
  Latin-1) or, for .jsonl, a line that is not a JSON object with a string 'text'. Without this, the
  reader fails mid-training with a traceback, or a blank corpus trains a vocabulary on nothing."""
  cut = len(head) == CHECK_BYTES  # The last line may continue past the checked bytes.
  nul = head.find(b"\0")
  if nul >= 0:
    raise BadInput(f"corpus file {path!r} is binary (a NUL byte at offset {nul}); allowed: "
                   f"{TEXT_HELP}")
  try:
    text = codecs.getincrementaldecoder("utf-8")().decode(head, final=not cut)
  except UnicodeDecodeError as e:
    raise BadInput(f"corpus file {path!r} is not UTF-8 (byte {head[e.start]:#04x} at offset "
                   f"{e.start}; Latin-1? convert it with iconv -f latin1 -t utf-8); allowed: "
                   f"{TEXT_HELP}") from None
  lines = text.split("\n")[:-1] if cut else text.split("\n")
  if not path.endswith(".jsonl"):
    return any(line.strip() for line in lines)
  found = False
  for number, line in enumerate(lines, 1):
    try:  # Every line is checked, also after one with text.
      found = bool(line.strip() and json_text(line.encode("utf-8")).strip()) or found
    except ValueError as e:
      raise BadInput(f"corpus file {path!r} line {number} {e}; allowed: {TEXT_HELP}") from None
  return found


def json_text(line: bytes) -> str:
  """The document of one .jsonl line; ValueError saying what the line is unless it is a JSON
  object whose 'text' (absent: "") is a string."""
  try:
    record = json.loads(line.decode("utf-8"))
  except UnicodeDecodeError:
    raise ValueError("is not UTF-8") from None
  except json.JSONDecodeError as e:
    raise ValueError(f"is not JSON ({e.msg})") from None
  if not isinstance(record, dict) or not isinstance(record.get("text", ""), str):
    raise ValueError(f"is {type(record).__name__}"
                     + (" with a non-string 'text'" if isinstance(record, dict) else ""))
  return record.get("text", "")


_SKIPPED: set[int] = set()  # Hashes of the bad .jsonl lines named so far (each epoch
_SKIPPED_LOCK = threading.Lock()  # reads them again: named once).
WARN_SKIPPED = 3  # Distinct bad lines named in the log; later ones are skipped quietly.


def json_text_or_skip(raw: bytes) -> str:
  """`json_text(raw)`, or "" (dropped as empty) for a bad line, with one warning line naming
  it (the first time, for the first `WARN_SKIPPED` bad lines)."""
  try:
    return json_text(raw)
  except ValueError as e:
    with _SKIPPED_LOCK:
      new = hash(raw) not in _SKIPPED and len(_SKIPPED) < WARN_SKIPPED
      if new:
        _SKIPPED.add(hash(raw))
      count = len(_SKIPPED)
    if new:
      logging.warning("skipped a .jsonl corpus line that %s (allowed: a JSON object with a "
                      "string 'text'): %r%s", e, raw[:60],
                      "" if count < WARN_SKIPPED else "; further bad lines are skipped "
                      "without a warning")
    return ""


def check_batches(split: str, sequence_length: int, batch_size: int) -> None:
  """The arguments of either path's `batches`."""
  if split not in SPLITS:
    raise BadInput(f"split {split!r}; allowed: {', '.join(SPLITS)}.")
  if sequence_length < 2 or batch_size < 1:
    raise BadInput(f"sequence_length={sequence_length}, batch_size={batch_size}; "
                   "allowed: sequence_length >= 2, batch_size >= 1.")


def check_sequence_length(sequence_length: int, max_len: Optional[int]) -> None:
  """Rows may not be longer than the model's positions support (`model.max_len`)."""
  if max_len is not None and sequence_length > max_len:
    raise BadInput(one_line(
        f"task.sequence_length={sequence_length} exceeds model.max_len={max_len} (the "
        f"longest sequence the model's positions and decode cache support); allowed: "
        f"sequence_length <= {max_len}, or raise --config.model.max_len."))


def resolve(task_config, workdir: str, *, exists: Callable[[str], bool],
            documents: Callable[[ml_collections.ConfigDict], Iterator[str]],
            train_vocabulary: Callable[[Iterator[str], str, int], object]
            ) -> ml_collections.ConfigDict:
  """`config.task` with its defaults made concrete, writing what they need to `workdir`.

  `docstring_corpus_mb > 0`: text_lm on that much docstring text, written (once) to
  `{workdir}/corpus/`. `vocabulary=''`: a SentencePiece model of `vocab_size` pieces is
  trained (once) on the first `vocab_documents` training documents (`documents(task)`)
  into `{workdir}/vocabulary.model`. Run it on one process, then let the others read."""
  task = ml_collections.ConfigDict(task_config.to_dict())
  if task.docstring_corpus_mb > 0:
    train, validation = docstring_corpus.write(os.path.join(workdir, "corpus"),
                                               task.docstring_corpus_mb)
    task.update(name="text_lm", train_files=train, validation_files=validation)
  if not task.vocabulary:
    task.vocabulary = os.path.join(workdir, "vocabulary.model")
    if not exists(task.vocabulary):
      train_vocabulary(documents(task), task.vocabulary, task.vocab_size)
  return task


def prepare_config(config: ml_collections.ConfigDict, workdir: str,
                   resolve_task: Callable[..., ml_collections.ConfigDict]
                   ) -> ml_collections.ConfigDict:
  """`config` (locked copy) with `config.task` resolved by `resolve_task(task, workdir)`: process 0
  writes the corpus / vocabulary first, the others wait, then every process reads the same files."""
  if jax.process_index() == 0:
    resolve_task(config.task, workdir)
  multihost.sync("c4_prepare_config")  # Process 0 may train a vocabulary meanwhile.
  out = copy.deepcopy(config)  # Keeps the config's field types and lock.
  out.task.update(resolve_task(config.task, workdir).to_dict())
  return out
