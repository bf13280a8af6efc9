r"""Re-evaluates the campaign's finished cells from their kept parameters on independent draws.

  python experiments/redraw_cells.py --cells=a_fuzzy_linear_seed2,c_fuzzy_decoding_hyla_seed2

A train cell gets its OOD metric over `--draws` sets of `--problems` problems, a probe cell its
held-out decoding score (trained and step 0) over `--probe_draws` draws, each with its
evaluation error (hypernet_attention/probing/redraw.py says why). One file per cell,
`<results_dir>/redraw/<cell>.json`, which the campaign's report reads beside the cell file.
"""

import dataclasses
import json
import os
import platform
import time

from absl import flags
import jax

from hypernet_attention import errors
from hypernet_attention.probing import redraw
from hypernet_attention.runs import cli
from hypernet_attention.runs import registry
from hypernet_attention.runs import run_files

_RESULTS = flags.DEFINE_string("results_dir", "experiments/results/paper_scale",
                               "The campaign's cell files, with params/ beside them.")
_CELLS = flags.DEFINE_list("cells", None, "Cells to re-evaluate.", required=True)
_OPTIONS = {f.name: flags.DEFINE_integer(f.name, f.default, f"RedrawOptions.{f.name}.")
            for f in dataclasses.fields(redraw.RedrawOptions)
            if isinstance(f.default, int)}


def _read(results_dir: str, cell: str) -> dict:
  record = run_files.read_json(os.path.join(results_dir, f"{cell}.json"))
  if record is None:
    raise errors.BadInput(f"--cells: {cell!r} has no cell file in {results_dir!r}; allowed: "
                          "a finished cell of --results_dir")
  return record


def main(argv):
  del argv
  options = redraw.RedrawOptions(**{k: flag.value for k, flag in _OPTIONS.items()})
  results = _RESULTS.value
  jobs = []
  for cell in _CELLS.value:  # Every cell checked before any work.
    record = _read(results, cell)
    source = _read(results, record["source"]) if record["kind"] == "probe" else record
    if record["kind"] not in ("train", "probe") or not source.get("params"):
      raise errors.BadInput(f"--cells: {cell!r} is a {record['kind']} cell without kept "
                            "parameters; allowed: train cells that keep them, or their probes")
    jobs.append((cell, record, os.path.join(results, source["params"])))
  for cell, record, params_dir in jobs:
    start = time.time()
    metric = registry.get(record["experiment"]).metric
    members = {m["name"]: redraw.member(params_dir, i, metric, options,
                                        probe=record["kind"] == "probe")
               for i, m in enumerate(record["members"])}
    out = {"cell": cell, "kind": record["kind"], "options": options.__dict__,
           "members": members, "device": jax.devices()[0].device_kind,
           "jax_version": jax.__version__, "python": platform.python_version(),
           "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "wall_s": time.time() - start}
    folder = os.path.join(results, "redraw")  # The report reads it (launch/campaign/records.py).
    os.makedirs(folder, exist_ok=True)
    run_files.write_json(os.path.join(folder, f"{cell}.json"), out)
    print(f"{cell}: {out['wall_s']:.0f} s, {json.dumps(members)}", flush=True)


if __name__ == "__main__":
  cli.run(main)
