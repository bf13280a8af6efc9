r"""Plots scalars of a training run's TensorBoard events to a PNG.

  python experiments/plot_curves.py --workdir=workdirs/c4_lm_<time> \
    --tags=train/loss,validation/loss --out=experiments/results/c4_lm_local_loss.png
"""

from absl import app
from absl import flags

from hypernet_attention.train import curves

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.", required=True)
_TAGS = flags.DEFINE_list("tags", ["train/loss", "validation/loss"], "Scalars to plot.")
_OUT = flags.DEFINE_string("out", None, "PNG path.", required=True)
_TITLE = flags.DEFINE_string("title", "", "Plot title (default: the workdir).")


def main(argv):
  del argv
  data = curves.read_scalars(_WORKDIR.value, _TAGS.value)
  curves.plot(data, _OUT.value, _TITLE.value or _WORKDIR.value)
  for tag, (steps, values) in data.items():
    print(f"{tag}: step {steps[0]} {values[0]:.4f} -> step {steps[-1]} {values[-1]:.4f}")
  print(f"wrote {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
