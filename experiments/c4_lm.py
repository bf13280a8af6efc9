r"""Trains a decoder-only language model on C4 (or local text); see configs/c4_lm.py.

With no flags: HYLA at `size=local` (minutes on a 2-core CPU: ~4 MB of docstrings of the installed
packages, a vocabulary trained on them) into ./workdirs/c4_lm_<time>, then prints a sample:
  python experiments/c4_lm.py
The paper's 50M model on TFDS c4/en:
  python experiments/c4_lm.py --config=experiments/configs/c4_lm.py:model=hyla,size=50m \
    --config.task.data_dir=gs://BUCKET/tensorflow_datasets --workdir=gs://BUCKET/c4_hyla
Sample from a run's newest checkpoint (with the attention key/value cache):
  python experiments/c4_lm.py --generate --workdir=workdirs/c4_lm_<time> --prompt="Return"
Rerunning with the same --workdir resumes, data position included. Several processes: as
in sraven_scaling.py (--coordinator_address, --num_processes, --process_id).
"""

import os

from absl import flags

from hypernet_attention import decoding
from hypernet_attention import errors
from hypernet_attention.runs import cli
from hypernet_attention.runs import config_checks
from hypernet_attention.train import lm
from hypernet_attention.train import runtime

_CONFIG, _WORKDIR = runtime.define_run_flags(
    os.path.join(os.path.dirname(__file__), "configs/c4_lm.py:model=hyla,size=local"))
_GENERATE = flags.DEFINE_bool("generate", False, "Only sample from --workdir's newest checkpoint.")
_PROMPT = flags.DEFINE_string("prompt", lm.SAMPLING["prompt"], "Text the samples continue.")
_NUM_TOKENS = flags.DEFINE_integer("num_tokens", lm.SAMPLING["num_tokens"], "Tokens to sample.")
_TEMPERATURE = flags.DEFINE_float("temperature", lm.SAMPLING["temperature"],
                                  "Sampling temperature (0: greedy).")


def main(argv):
  del argv
  sampling = dict(prompt=_PROMPT.value, num_tokens=_NUM_TOKENS.value,
                  temperature=_TEMPERATURE.value)
  decoding.check_sampling(**sampling)  # Bad input is refused before start-up.
  if _GENERATE.value:
    if not _WORKDIR.value:
      raise errors.BadInput("--generate needs the --workdir of a training run")
    runtime.start()
    print(lm.sample_from_workdir(_WORKDIR.value, **sampling))
    return
  checked = config_checks.validate(_CONFIG.value)
  runtime.start()
  workdir = (runtime.fresh_workdir(checked.config.experiment) if _WORKDIR.value is None
             else _WORKDIR.value)
  lm.train_and_sample(checked, workdir, **sampling)


if __name__ == "__main__":
  cli.run(main)
