"""The rebuttal's activation sweep: HYLA on SRAVEN with phi in {gelu, relu, sigmoid, silu, tanh}.

5 activations x 3 seeds = 15 jobs at `size=paper` (the rebuttal's OOD accuracies: gelu 58.92,
relu 69.13, sigmoid 56.26, silu 71.04, tanh 54.87; source unconfirmed, PAPER.md Sec. 1).
"""

from launch.sweeps import common

EXPERIMENT = "sraven_scaling"
ACTIVATIONS = ("gelu", "relu", "sigmoid", "silu", "tanh")


def get_sweep():
  return [
      {"config": "model=hyla,size=paper,width=1,depth=4", "model.activation": p["activation"],
       "seed": p["seed"]}
      for p in common.product(activation=list(ACTIVATIONS), seed=list(common.SEEDS))
  ]
