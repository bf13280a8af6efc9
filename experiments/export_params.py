r"""Keeps a finished run's final parameters (no optimizer state) in a folder of their own.

  python experiments/export_params.py --workdir=workdirs/sraven_hyla --output_dir=kept/hyla

The folder restores like the run (`restore.restore_params(DIR, member=i)`) and probes like it
(`experiments/probe_latents.py --workdir=DIR/<member>`), on any machine; the campaign keeps
one per finished cell (`hypernet_attention/train/export_params.py`).
"""

from absl import flags

from hypernet_attention import errors
from hypernet_attention.runs import cli
from hypernet_attention.train import export_params

_WORKDIR = flags.DEFINE_string("workdir", None, "A finished run's directory.", required=True)
_OUTPUT_DIR = flags.DEFINE_string(
    "output_dir", None, "The folder to write: new, empty, or a previous export (replaced); "
    "never the workdir, a folder in it or above it.", required=True)
_MAX_MIB = flags.DEFINE_float("max_mib", None, "Refuse to keep more than this many MiB.")


def main(argv):
  del argv
  if _MAX_MIB.value is not None and not _MAX_MIB.value > 0:
    raise errors.BadInput(f"--max_mib={_MAX_MIB.value}; allowed: a number of MiB > 0")
  try:
    record = export_params.export(
        _WORKDIR.value, _OUTPUT_DIR.value,
        None if _MAX_MIB.value is None else int(_MAX_MIB.value * 2**20))
  except ValueError as e:
    raise errors.BadInput(str(e)) from e
  print(f"Result: kept the parameters of step {record['step']:,} ({len(record['members']) or 1} "
        f"run(s), {record['bytes'] / 2**20:.2f} MiB) in {_OUTPUT_DIR.value}")


if __name__ == "__main__":
  cli.run(main)
