r"""Trains any registered experiment: the one its config's `experiment` names.

  python experiments/train.py --config=experiments/configs/sraven.py:model=hyla,size=smoke
  python experiments/train.py --config=experiments/configs/<task>.py:size=smoke \
    --workdir=workdirs/<task>_smoke
The trainer, data and objective come from the experiment's record
(`hypernet_attention/runs/registry.py`), so a new task needs no entry point of its own.
`sraven_scaling.py`, `fuzzy_logic.py` (and `c4_lm.py`'s training) are this program with a default
--config. Rerunning with the same --workdir resumes; multi-process flags as in sraven_scaling.py.
"""

from hypernet_attention.runs import cli
from hypernet_attention.train import runtime

main = runtime.experiment_main()

if __name__ == "__main__":
  cli.run(main)
