"""Learning curves from a run's TensorBoard events (what `events.py` recorded), as a PNG.

`experiments/plot_curves.py` is the command; the curves in experiments/results/ are made with it."""

from __future__ import annotations

import os
import tempfile
from typing import Optional, Sequence

from etils import epath
import numpy as np
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.util import tensor_util

from hypernet_attention.runs import run_files


def read_scalars(workdir: str, tags: Optional[Sequence[str]] = None
                 ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{tag: (steps, values)} for each of `tags` (None: every scalar, {} before the first
  log) in the event files of `workdir`; a tag asked for and absent is a ValueError."""
  if run_files.is_remote(workdir):
    # tensorboard reads buckets through TensorFlow when it is installed (else fsspec):
    # read local copies instead, whichever is there.
    with tempfile.TemporaryDirectory() as local:
      for f in run_files.path(workdir).glob("events.out.tfevents.*"):
        (epath.Path(local) / f.name).write_bytes(f.read_bytes())
      return read_scalars(local, tags)
  if not run_files.path(workdir).is_dir():  # Not created yet: nothing logged yet.
    _check_tags(set(), tags, workdir)
    return {}
  events = event_accumulator.EventAccumulator(
      workdir, size_guidance={event_accumulator.TENSORS: 0, event_accumulator.SCALARS: 0})
  events.Reload()
  # The scalars plugin's tensors (TF2's format) and TF1 scalars; not the hparams records.
  # A run stopped before its first log has none (tensorboard raises KeyError for a plugin
  # it has not seen): its curves are empty, which is not an error.
  try:
    plugin_tags = set(events.PluginTagToContent("scalars"))
  except KeyError:
    plugin_tags = set()
  available = plugin_tags | set(events.Tags()["scalars"])
  out = {}
  for tag in _check_tags(available, tags, workdir):
    if tag in events.Tags()["tensors"]:
      records = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto)))
                 for e in events.Tensors(tag)]
    else:
      records = [(e.step, e.value) for e in events.Scalars(tag)]
    steps, values = zip(*sorted(dict(records).items()))  # Last write per step wins.
    out[tag] = (np.asarray(steps), np.asarray(values))
  return out


def _check_tags(available: set[str], tags: Optional[Sequence[str]], workdir: str) -> Sequence[str]:
  """`tags` (None: every available one), once each is shown to be available."""
  tags = sorted(available) if tags is None else tags
  missing = sorted(set(tags) - available)
  if missing and not available:
    raise ValueError(f"no scalars logged yet under {workdir!r} (no event file, or the run "
                     f"stopped before its first log); asked for {missing}")
  if missing:
    raise ValueError(f"no scalars {missing} in the events under {workdir!r}; allowed: "
                     f"{sorted(available)}")
  return tags


def plot(curves: dict[str, tuple[np.ndarray, np.ndarray]], path: str, title: str,
         ylabel: str = "loss (nats per token)") -> None:
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, ax = plt.subplots(figsize=(6, 4))
  for tag, (steps, values) in curves.items():
    ax.plot(steps, values, marker="o", markersize=3, label=tag)
  ax.set(xlabel="step", ylabel=ylabel, title=title)
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)
