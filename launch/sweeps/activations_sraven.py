"""The rebuttal's activation sweep: HYLA on SRAVEN with phi in {gelu, relu, sigmoid, silu, tanh}.

5 activations x lr {3e-4, 1e-3} x wd {0.1, 0.3} x warmup {1000, 3000} x 3 seeds = 120 jobs
at `size=paper`, width 1, depth 4 (the grid is our assumption: the rebuttal names none). The
rebuttal's OOD accuracies: gelu 58.92, relu 69.13, sigmoid 56.26, silu 71.04, tanh 54.87
(source unconfirmed: the rebuttal)."""

from launch.sweeps import common

EXPERIMENT = "sraven"
ACTIVATIONS = ("gelu", "relu", "sigmoid", "silu", "tanh")


def get_sweep():
  configs = [{"config": "model=hyla,size=paper,width=1,depth=4", "model.activation": a}
             for a in ACTIVATIONS]
  return common.grid_points(configs, EXPERIMENT)
