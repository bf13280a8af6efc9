r"""Trains one SRAVEN model (one point of the paper's scaling grid); see configs/sraven.py.

With no flags: HYLA at `size=demo` (2-feature SRAVEN, ~10 min on a 2-core CPU) into
./workdirs/sraven_<time>; it ends with OOD accuracy on held-out rule combinations against
its ceiling and chance:
  python experiments/sraven_scaling.py
Paper size on a GPU/TPU:
  python experiments/sraven_scaling.py \
    --config=experiments/configs/sraven.py:model=hyla,size=paper,width=1,depth=4 \
    --workdir=workdirs/sraven_hyla_w1_d4
Rerunning with the same --workdir resumes from the newest checkpoint. Several processes join
one run by themselves where the environment names a cluster (SLURM, TPU workers, Vertex AI;
see train/runtime.py), else add --coordinator_address=HOST:PORT --num_processes=N
--process_id=I (or --multi_process); all with the same --workdir on shared storage.
"""

from hypernet_attention.runs import cli
from hypernet_attention.train import runtime

main = runtime.experiment_main("sraven")  # experiments/train.py with this default --config.

if __name__ == "__main__":
  cli.run(main)
