r"""Trains one fuzzy-logic in-context regression model; see configs/fuzzy_logic.py.

  python experiments/fuzzy_logic.py \
    --config=experiments/configs/fuzzy_logic.py:model=hyla,size=paper --workdir=workdirs/fuzzy_hyla
With no flags: HYLA at `size=local` into ./workdirs/fuzzy_logic_<time>. Rerunning with the
same --workdir resumes; multi-process flags as in sraven_scaling.py.
"""


from absl import flags
from ml_collections import config_flags

from hypernet_attention.train import cli
from hypernet_attention.train import loop
from hypernet_attention.train import registry
from hypernet_attention.train import runtime

_CONFIG = config_flags.DEFINE_config_file(
    "config", registry.get("fuzzy_logic").config_flag("model=hyla,size=local", absolute=True),
    "Experiment config file and its argument.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (default: a fresh one "
                               "under ./workdirs/).")


def main(argv):
  del argv
  runtime.start()
  workdir = runtime.fresh_workdir("fuzzy_logic") if _WORKDIR.value is None else _WORKDIR.value
  loop.train_and_evaluate(_CONFIG.value, workdir)


if __name__ == "__main__":
  cli.run(main)
