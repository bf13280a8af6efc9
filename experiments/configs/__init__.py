"""Experiment configs: `get_config(arg)` files for `--config=experiments/configs/X.py:arg`.

Each file offers `size=paper|local|smoke` and `model=<attention preset>`; see its docstring."""
