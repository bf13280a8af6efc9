r"""Trains one fuzzy-logic in-context regression model; see configs/fuzzy_logic.py.

  python experiments/fuzzy_logic.py \
    --config=experiments/configs/fuzzy_logic.py:model=hyla,size=paper --workdir=workdirs/fuzzy_hyla
With no flags: HYLA at `size=local` into ./workdirs/fuzzy_logic_<time>. Rerunning with the
same --workdir resumes; multi-process flags as in sraven_scaling.py.
"""

from hypernet_attention.runs import cli
from hypernet_attention.train import runtime

main = runtime.experiment_main("fuzzy_logic")  # experiments/train.py with this default --config.

if __name__ == "__main__":
  cli.run(main)
