r"""Plots scalars of a training run's TensorBoard events to a PNG.

  python experiments/plot_curves.py --workdir=workdirs/c4_lm_<time> \
    --tags=train/loss,validation/loss --out=experiments/results/c4_lm_local_loss.png

An existing --out is replaced only with --overwrite.
"""

import os

from absl import flags

from hypernet_attention import errors
from hypernet_attention.runs import cli
from hypernet_attention.runs import curves
from hypernet_attention.runs import run_files

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory.", required=True)
_TAGS = flags.DEFINE_list("tags", ["train/loss", "validation/loss"], "Scalars to plot.")
_OUT = flags.DEFINE_string("out", None, "PNG path.", required=True)
_TITLE = flags.DEFINE_string("title", "", "Plot title (default: the workdir).")
_OVERWRITE = flags.DEFINE_bool("overwrite", False, "Replace --out if it exists.")


def main(argv):
  del argv
  workdir = os.path.expanduser(_WORKDIR.value)
  if not os.path.isdir(workdir):
    raise errors.BadInput(f"--workdir={_WORKDIR.value!r} is not a directory; allowed: "
                              "a training run's workdir")
  out = run_files.output_path(_OUT.value, "--out", overwrite=_OVERWRITE.value)
  try:
    data = curves.read_scalars(workdir, _TAGS.value)
  except ValueError as e:
    raise errors.BadInput(str(e)) from None
  curves.plot(data, out, _TITLE.value or workdir)
  for tag, (steps, values) in data.items():
    print(f"{tag}: step {steps[0]} {values[0]:.4f} -> step {steps[-1]} {values[-1]:.4f}")
  print(f"wrote {out}")


if __name__ == "__main__":
  cli.run(main)
