r"""Training throughput: optimizer steps per second of the real train step, per model.

  python experiments/benchmark_training.py --experiment=sraven --size=paper \
      --models=softmax,linear,hyla --steps=200
  (add e.g. hyla@model.implementation=reference to time one model with its own override)

Builds each config exactly as `sraven_scaling.py` / `fuzzy_logic.py` would (same mesh, same
jitted `lax.scan` chunk with on-device data generation and dropout), compiles all of them,
then times `--repeats` rounds of one `--steps`-step chunk per model, interleaved (A, B, C, A,
B, C, ...), and prints the median steps/s (and problems/s) per model and the median over
rounds of its step time / the first model's (so ratios hold on a shared, noisy machine).
No workdir, checkpoints or evaluation.

Populations (`--members=1,4,16,64`): per model, populations of that many seeds
(`hypernet_attention/train/population.py`) timed interleaved with the single run; prints
aggregate member-steps/s, the speedup over training the members one by one, and device
memory per member (XLA's memory analysis of the compiled chunk) against the single run's:
  python experiments/benchmark_training.py --experiment=sraven --size=paper --models=hyla \
      --members=1,4,16,64 --steps=50
`--cost` adds XLA's FLOPs and bytes accessed per member-step: bytes over the device's
memory bandwidth bound what more members can gain.

Language models (`--experiment=c4_lm`) also print tokens/s, model FLOPs utilization (the
FLOP formula is in `hypernet_attention/train/benchmark.py`; the peak is looked up by device
kind or given with --peak_tflops) and the host input pipeline's tokens/s alone. Their data
(corpus, vocabulary) is resolved into --data_dir first, e.g. on a machine without C4:
  python experiments/benchmark_training.py --experiment=c4_lm --size=50m --steps=2 \
    --repeats=1 --config_overrides=task.docstring_corpus_mb=4,task.vocabulary=V.model
or, where TensorFlow, seqio or the C4 vocabulary are not (a GPU image), on uniformly random
tokens over `task.vocab_size` (32,000 at 50m): the same step, with no data to resolve:
  python experiments/benchmark_training.py --experiment=c4_lm --size=50m --synthetic_tokens"""

import json
import math
import os
import sys

import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hypernet_attention import errors
from hypernet_attention.runs import cli  # noqa: E402
from hypernet_attention.runs import console  # noqa: E402
from hypernet_attention.runs import registry  # noqa: E402
from hypernet_attention.train import benchmark  # noqa: E402
from hypernet_attention.train import objectives  # noqa: E402
from hypernet_attention.train import runtime  # noqa: E402

MAX_STEPS = 100_000  # Per timed chunk (see main).


def main():
  parser = errors.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--experiment", default="sraven", choices=sorted(registry.EXPERIMENTS))
  parser.add_argument("--size", default="paper")
  parser.add_argument("--models", default="softmax,linear,hyla",
                      help="comma-separated presets; 'preset@key=value' adds an override "
                      "for that model only, e.g. hyla@model.implementation=reference")
  parser.add_argument("--steps", type=int, default=200, help="steps per timed chunk")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--config_overrides", default="",
                      help="comma-separated dotted key=value overrides")
  parser.add_argument("--data_dir", default=os.path.join("workdirs", "benchmark_data"),
                      help="c4_lm: where a corpus / vocabulary the config asks for is written")
  parser.add_argument("--synthetic_tokens", action="store_true",
                      help="c4_lm: uniformly random tokens over task.vocab_size instead of "
                      "C4 (no TensorFlow, seqio or vocabulary needed; same step)")
  parser.add_argument("--peak_tflops", type=float, default=None,
                      help="device peak for MFU (default: looked up by device kind)")
  parser.add_argument("--members", default="",
                      help="comma-separated population sizes, e.g. 1,4,16,64: per model, "
                      "aggregate member-steps/s and device memory per member of populations "
                      "against the single run, timed interleaved")
  parser.add_argument("--cost", action="store_true",
                      help="--members: also XLA's FLOPs and bytes accessed per member-step "
                      "(cost analysis of one compiled step), to see what bounds a population")
  args = parser.parse_args()
  parser.check_positive(args, "steps", "repeats")  # A zero-step chunk times nothing.
  # Longer chunks time nothing more (100 million ran silently for days); the step is int32.
  most_steps = min(MAX_STEPS, (2**31 - 1) // (args.repeats + 1))
  if args.steps > most_steps:
    parser.error(f"--steps={args.steps} with --repeats={args.repeats} runs "
                 f"{args.steps * (args.repeats + 1):,} steps; allowed: --steps <= {most_steps:,} "
                 f"(a timed chunk of at most {MAX_STEPS:,} steps, and the state's int32 step "
                 "counter must not pass 2**31 - 1)")
  if args.peak_tflops is not None and not 0 < args.peak_tflops < math.inf:
    parser.error(f"--peak_tflops={args.peak_tflops}; allowed: a finite number > 0")
  host_data = not registry.get(args.experiment).on_device  # c4_lm's seqio pipeline.
  if args.synthetic_tokens:
    if not host_data:
      parser.error(f"--synthetic_tokens with --experiment={args.experiment}; allowed: "
                   f"{', '.join(registry.names(on_device=False))} only (the other "
                   "experiments generate their data on device)")
    args.config_overrides = ",".join(
        s for s in (args.config_overrides, f"task.name={objectives.SYNTHETIC_LM}") if s)
  models = [m.strip() for m in args.models.split(",") if m.strip()]
  if not models:
    parser.error(f"--models={args.models!r}; allowed: comma-separated attention presets, "
                 "e.g. softmax,hyla or hyla@model.implementation=reference")
  counts = []
  if args.members:
    try:
      counts = [int(m) for m in args.members.split(",") if m]
      if not counts or min(counts) < 1:
        raise ValueError
    except ValueError:
      parser.error(f"--members={args.members!r}; allowed: comma-separated integers >= 1")
  try:  # Bad presets, sizes or overrides: one line, before any work.
    configs = [benchmark.model_config(args.experiment, m, args.size, args.config_overrides)
               for m in models]
  except (ValueError, KeyError, AttributeError) as e:
    parser.error(str(e))
  print(runtime.log_topology())
  if counts:
    population_table(args, models, configs, counts)
    return
  pipeline = None
  if host_data and not args.synthetic_tokens:  # [lm]: TensorFlow, seqio.
    console.import_tensorflow_quietly()  # seqio loads TensorFlow, which logs natively.
    from hypernet_attention.tasks import c4  # pylint: disable=g-import-not-at-top
    from hypernet_attention.tasks import lm_text  # pylint: disable=g-import-not-at-top
    configs = [lm_text.prepare_config(c, args.data_dir, c4.resolve) for c in configs]
    pipeline = benchmark.input_tokens_per_second(configs[0])
  rows = benchmark.train_steps_per_second(configs, steps=args.steps, repeats=args.repeats,
                                         labels=models)
  for row, model in zip(rows, models):
    row["label"] = model
    row["synthetic_tokens"] = args.synthetic_tokens  # The report names the data from this.
    row["mfu"] = benchmark.mfu(row, args.peak_tflops)
    print(json.dumps(row), flush=True)
  tokens = "tokens_per_s" in rows[0]
  print(f"\n| experiment | size | model | params | batch | steps/s | step time / {models[0]}'s "
        f"| problems/s | compile s |"
        + (" tokens/s | MFU |" if tokens else ""))
  print("|---|---|---|---|---|---|---|---|---|" + ("---|---|" if tokens else ""))
  for r in rows:
    print(f"| {r['experiment']} | {args.size} | {r['label']} | {r['params']:,} | {r['batch_size']} "
          f"| {r['steps_per_s']:.3g} | {r['step_time_ratio']:.3f} | {r['problems_per_s']:.3g} | "
          f"{r['compile_s']:.1f} |" + (
              f" {r['tokens_per_s']:,.0f} | " + (f"{r['mfu']:.2%} |" if r["mfu"] else "- |")
              if tokens else ""))
  if args.synthetic_tokens:
    print("input: synthetic tokens (uniformly random; the C4 pipeline was not timed)")
  if pipeline:
    print(f"input pipeline alone: {pipeline:,.0f} tokens/s (this process)")
  print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}")


def population_table(args, models, configs, counts):
  """`--members`: one population table per model (see `benchmark.population_rows`). Every
  model's populations are compiled and checked against memory before any is built."""
  plans = [benchmark.population_plans(config, counts, args.steps) for config in configs]
  tables = [(model, benchmark.population_rows(config, counts, steps=args.steps,
                                              repeats=args.repeats, cost=args.cost, plans=planned))
            for model, config, planned in zip(models, configs, plans)]
  print("\n| experiment | size | model | members | member-steps/s | x one run | "
        "MiB per member | vs one run's |" + (" GFLOP per member-step | GB accessed per "
                                            "member-step |" if args.cost else ""))
  print("|---|---|---|---|---|---|---|---|" + ("---|---|" if args.cost else ""))
  for model, rows in tables:
    base = next((r for r in rows if r["members"] == 1), None)
    for r in rows:
      memory = r["device_bytes_per_member"]
      ratio = f"{memory / base['device_bytes_per_member']:.2f}" if base else "-"
      print(f"| {args.experiment} | {args.size} | {model} | {r['members']} | "
            f"{r['member_steps_per_s']:.3g} | {r['speedup']:.2f} | {memory / 2**20:.2f} | "
            f"{ratio} |" + (f" {r['flops_per_member_step'] / 1e9:.2f} | "
                            f"{r['bytes_accessed_per_member_step'] / 1e9:.2f} |"
                            if args.cost else ""), flush=True)
  print(f"device: {jax.devices()[0].device_kind} x{jax.device_count()}")


if __name__ == "__main__":
  cli.run_plain(main)  # What the library refuses (e.g. an unreadable vocabulary): one line.
