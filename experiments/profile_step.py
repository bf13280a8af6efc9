r"""Where one model's train step spends its time, per JAX op (CPU, GPU), from a profiler trace.

  python experiments/profile_step.py --experiment=sraven --size=paper --model=hyla
  python experiments/profile_step.py --model=hyla@model.implementation=reference --top=40
  python experiments/profile_step.py --experiment=c4_lm --size=50m --model=hyla@batch_size=64

`--experiment=c4_lm` trains on uniformly random tokens (as `benchmark_training.py
--synthetic_tokens`): the same step, with no TensorFlow, seqio or vocabulary needed.

Builds the config as `benchmark_training.py` does, compiles and runs one chunk, traces a
second chunk with `jax.profiler` and prints the ops that took the most time per step, summed
over layers, forward (FWD) and backward (BWD) apart (`hypernet_attention/train/profiling.py`).
The trace stays in --trace_dir for TensorBoard's profile plugin or Perfetto."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hypernet_attention import errors
from hypernet_attention.runs import cli  # noqa: E402
from hypernet_attention.runs import registry  # noqa: E402
from hypernet_attention.runs import run_files  # noqa: E402
from hypernet_attention.train import benchmark  # noqa: E402
from hypernet_attention.train import objectives  # noqa: E402
from hypernet_attention.train import profiling  # noqa: E402


def main():
  parser = errors.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--experiment", default="sraven", choices=sorted(registry.names()))
  parser.add_argument("--size", default="paper")
  parser.add_argument("--model", default="hyla",
                      help="attention preset; 'preset@key=value,...' adds config overrides")
  parser.add_argument("--steps", type=int, default=10, help="steps in the traced chunk")
  parser.add_argument("--top", type=int, default=25, help="ops to print")
  parser.add_argument("--trace_dir", default=None, help="default: a fresh temporary dir")
  args = parser.parse_args()
  parser.check_positive(args, "steps")
  # A host-data experiment (C4) is profiled on random tokens through the same step.
  overrides = ("" if registry.get(args.experiment).on_device
               else f"task.name={objectives.SYNTHETIC_LM}")
  try:  # Bad config arguments or overrides: one line, before any work.
    config = benchmark.model_config(args.experiment, args.model, args.size, overrides)
  except (ValueError, KeyError, AttributeError) as e:
    parser.error(str(e))
  if args.trace_dir:
    run_files.check_output_dir(args.trace_dir, "--trace_dir")
  profile = profiling.profile_train_step(config, args.steps, args.trace_dir)
  print("| ms/step | share | output shape | op (layers summed) |\n|---|---|---|---|")
  for row in profile.ops[:args.top]:
    print(f"| {row.ms_per_step:.2f} | {row.ms_per_step / profile.ms_per_step:.1%} | "
          f"{row.shape} | {row.op} |")
  print(f"Result: {args.experiment} {args.size} {args.model}: {profile.ms_per_step:.1f} ms "
        f"per step in {len(profile.ops)} ops; trace in {profile.trace_dir}")


if __name__ == "__main__":
  cli.run_plain(main)
