r"""Probes the latent codes of trained runs: decoders, controls, topographic similarity, figures.

One run (writes DIR/probe/{codes_<step>.npz, codes_0.npz, metrics.json, report.md, *.png}):
  python experiments/probe_latents.py --workdir=workdirs/sraven_hyla
Several runs side by side (each in OUT/<model>/, the comparison in OUT/):
  python experiments/probe_latents.py --workdir=runs/softmax --workdir=runs/linear \
    --workdir=runs/hyla --output_dir=probes/sraven
A sweep root (runs and population members below it) writes ROOT/probe/ unless --output_dir
is given. A population probes every member (POP/probe/<member>/, one result line each); one
member: --workdir=POP --member=i, or --workdir=POP/<member name>.
`--step` picks a checkpoint (default: the newest); `--step=0` probes the initialization.
Fuzzy logic probes one fixed query point for every problem, as the authors' code does;
`--query=random` draws it per problem (then the self-code varies with the query point).
The definitions are in hypernet_attention/probing/ (decode.py, stats.py, extract.py).
"""

import os

from absl import flags

from hypernet_attention import errors
from hypernet_attention.probing import report
from hypernet_attention.runs import cli
from hypernet_attention.runs import run_files
from hypernet_attention.train import restore

_WORKDIR = flags.DEFINE_multi_string("workdir", None, "Training run directory (repeatable), "
                                     "or a sweep root.", required=True)
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: newest; 0: the init).")
_OUTPUT_DIR = flags.DEFINE_string("output_dir", None, "Where to write (default: DIR/probe).")
_NUM_PROBLEMS = flags.DEFINE_integer("num_problems", 1024, "Problems per split.")
_FEATURES = flags.DEFINE_string("features", "all", "SRAVEN: 'all' features or 'last' (the "
                                "authors' setting).")
_QUERY = flags.DEFINE_string("query", "fixed", "Fuzzy logic: 'fixed' (one query point for "
                             "every problem, the authors' setting) or 'random' (a fresh "
                             "query point per problem).")
_MEMBER = flags.DEFINE_integer("member", None, "A population's member to probe (its outputs go "
                                "to the member's directory); a member's directory works too.")
_PERMUTATIONS = flags.DEFINE_integer("permutations", 100, "Permutations of the decoder null.")


def main(argv):
  del argv
  try:
    options = report.ProbeOptions(num_problems=_NUM_PROBLEMS.value, features=_FEATURES.value,
                                  permutations=_PERMUTATIONS.value, query=_QUERY.value)
    workdirs = _WORKDIR.value
    real = [w if run_files.is_remote(w) else os.path.realpath(w) for w in workdirs]
    if twice := next((w for w in real if real.count(w) > 1), None):
      raise errors.BadInput(f"--workdir={twice} is given {real.count(twice)} times; allowed: "
                            "each run once")
    if _MEMBER.value is not None:
      workdirs = [restore.member_dir(w, _MEMBER.value) for w in workdirs]
    probes = report.probe_workdirs(workdirs, _STEP.value, options, _OUTPUT_DIR.value)
  except ValueError as e:  # restore's and the probe's bad input: one line, exit 2
    raise errors.BadInput(str(e)) from e
  for p in probes:
    metric = report.headline(p.codes)[-1]
    best = max(p.analysis.items(), key=lambda a: report.score_of(a[1]["decode"], metric))
    print(f"{p.name}: step {p.codes.step}, best held-out {metric} "
          f"{report.score_of(best[1]['decode'], metric):.3f} ({best[0]}), step 0 "
          f"{report.score_of(p.analysis0[best[0]]['decode'], metric):.3f}; {p.seconds:.0f} s")


if __name__ == "__main__":
  cli.run(main)
