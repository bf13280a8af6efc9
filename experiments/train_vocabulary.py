r"""Trains the SentencePiece vocabulary of a language-modeling config on its own text.

For users without the 32k C4 vocabulary (T5's gs://t5-data/vocabs/cc_all.32000/), or with
another corpus. Unigram model, T5's special ids (pad=0, eos=1, unk=2), byte fallback; reads
the first `task.vocab_documents` training documents (see `tasks/c4.py:train_vocabulary`).

  python experiments/train_vocabulary.py --config=experiments/configs/c4_lm.py:size=50m \
    --config.task.data_dir=gs://BUCKET/tensorflow_datasets --output=gs://BUCKET/c4_32k.model
  python experiments/train_vocabulary.py --config=experiments/configs/c4_lm.py:size=50m \
    --config.task.name=text_lm --config.task.train_files='corpus/*.jsonl' \
    --config.task.validation_files=corpus/val.jsonl --output=corpus/vocabulary.model

Then pass --config.task.vocabulary=<output> to experiments/c4_lm.py. (Leaving
task.vocabulary empty there trains one into the workdir the same way.)
"""

import os

from absl import flags

from hypernet_attention.runs import cli
from hypernet_attention.runs import config_checks
from hypernet_attention.runs import console
from hypernet_attention.runs import run_files

_CONFIG = cli.define_config(
    os.path.join(os.path.dirname(__file__), "configs/c4_lm.py:size=50m"),
    "Language-modeling config file and its argument.")
_OUTPUT = flags.DEFINE_string("output", None, "Path of the .model file to write.")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace --output if it exists.")


def main(argv):
  del argv
  config_checks.validate(_CONFIG.value)
  output = run_files.output_path(_OUTPUT.value, "--output", overwrite=_OVERWRITE.value)
  console.import_tensorflow_quietly()  # seqio and c4 load TensorFlow, which logs natively.
  from hypernet_attention.tasks import c4  # pylint: disable=g-import-not-at-top
  task = _CONFIG.value.task
  print(f"training a {task.vocab_size}-piece vocabulary on the first "
        f"{task.vocab_documents} {task.name} training documents ...", flush=True)
  vocabulary = c4.train_vocabulary(
      c4.documents(c4.source(task), "train", task.vocab_documents), output, task.vocab_size)
  print(f"wrote {output}: {vocabulary.vocab_size} pieces")


if __name__ == "__main__":
  cli.run(main)
