"""The paper-scale campaign: the paper's sweeps as cells that add up across short windows.

`cells.py` (what runs, in priority order), `plan.py` (estimates per device kind),
`runner.py` (the budgeted runner), `collect_cell.py` and `records.py` (one JSON file per
finished cell), `partial.py` (cut-off cells), `schema.py` (both files checked when read),
`report.py` (the report beside the paper); `python -m launch.campaign`."""
