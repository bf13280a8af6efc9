r"""Training throughput: optimizer steps per second of the real train step, per model.

  python experiments/benchmark_training.py --experiment=sraven --size=paper \
      --models=softmax,linear,hyla --steps=200

Builds each config exactly as `sraven_scaling.py` / `fuzzy_logic.py` would (same mesh, same
jitted `lax.scan` chunk with on-device data generation and dropout), compiles it, then times
`--repeats` chunks of `--steps` steps and prints the median steps/s (and problems/s) per
model. No workdir, checkpoints or evaluation. `--config_overrides` takes `key=value` pairs,
e.g. `model.implementation=reference`.
"""

import argparse
import json
import os
import sys

import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# pylint: disable=wrong-import-position
from hypernet_attention.train import benchmark  # noqa: E402
from hypernet_attention.train import config_lib  # noqa: E402
from hypernet_attention.train import registry  # noqa: E402
from hypernet_attention.train import runtime  # noqa: E402


def load_config(experiment, arg, overrides):
  """get_config(arg) with comma-separated dotted `key=value` overrides."""
  config = registry.get(experiment).get_config(arg)
  for item in (s for s in overrides.split(",") if s.strip()):
    key, value = (t.strip() for t in item.split("=", 1))
    config_lib.set_dotted(config, key, value)
  return config


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--experiment", default="sraven", choices=sorted(registry.EXPERIMENTS))
  parser.add_argument("--size", default="paper")
  parser.add_argument("--models", default="softmax,linear,hyla")
  parser.add_argument("--steps", type=int, default=200, help="steps per timed chunk")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--config_overrides", default="",
                      help="comma-separated dotted key=value overrides")
  args = parser.parse_args()
  print(runtime.log_topology())
  rows = []
  for model in [m for m in args.models.split(",") if m]:
    config = load_config(args.experiment, f"model={model},size={args.size}",
                         args.config_overrides)
    row = benchmark.train_steps_per_second(config, steps=args.steps, repeats=args.repeats)
    print(json.dumps(row), flush=True)
    rows.append(row)
  print(f"\n| experiment | size | model | params | batch | steps/s | problems/s | compile s |")
  print("|---|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['experiment']} | {args.size} | {r['model']} | {r['params']:,} | "
          f"{r['batch_size']} | {r['steps_per_s']:.2f} | {r['problems_per_s']:.0f} | "
          f"{r['compile_s']:.1f} |")
  print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}")


if __name__ == "__main__":
  main()
