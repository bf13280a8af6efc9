#!/usr/bin/env bash
# Every entry point of experiments/ and launch/ in an environment with ALL extras installed
# together ([dev,lm,launch]): pins that merely resolve can still break imports (e.g. a
# SentencePiece whose generated proto needs a newer protobuf than [launch] allows). Each
# module is imported in its own process, then each tool runs once at smoke size.
# Usage (from the repository root, in a venv with '.[dev,lm,launch]'):
#   .ci/extras_smoke.sh                 imports, then every tool once
#   .ci/extras_smoke.sh --imports_only  imports only (CI's first interpreter: the tools run
#                                       on its second, where the suite ran without its slow tests)
set -euo pipefail
case "${1:-}" in
  "") imports_only=0 ;;
  --imports_only) imports_only=1 ;;
  *) echo "extras_smoke.sh: error: unknown argument '$1'; allowed: --imports_only or nothing" >&2
     exit 2 ;;
esac
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD JAX_PLATFORMS=cpu
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
step() {  # step NAME COMMAND...: run, time, and on failure show its output and stop.
  local name=$1 t0; shift
  t0=$(date +%s)
  if ! "$@" > "$tmp/log" 2>&1; then
    tail -n 30 "$tmp/log"; echo "extras smoke FAILED: $name"; exit 1
  fi
  echo "ok  $(( $(date +%s) - t0 ))s  $name"
}

step "the C4 stack and xmanager import together" python -c "
import sentencepiece, seqio, tensorflow_text, xmanager
from sentencepiece import sentencepiece_model_pb2
from hypernet_attention.tasks import c4"
# One process per module (entry points define flags), two at a time (one per core).
modules=()
for f in experiments/*.py launch/[!_]*.py; do
  module=${f%.py}; modules+=("${module//\//.}")
done
t0=$(date +%s)
if ! printf '%s\n' "${modules[@]}" | xargs -P 2 -I{} sh -c \
    'python -c "import importlib, sys; importlib.import_module(sys.argv[1])" {} \
     > "$1/import_{}.log" 2>&1 || { tail -n 30 "$1/import_{}.log"; echo "cannot import {}"; exit 1; }' \
    sh "$tmp"; then
  echo "extras smoke FAILED: imports"; exit 1
fi
echo "ok  $(( $(date +%s) - t0 ))s  import each of ${#modules[@]} modules of experiments/ and launch/"
if (( imports_only )); then
  echo "extras smoke: every entry point imported (tools not run: --imports_only)"
  exit 0
fi

smoke() { echo "--config=experiments/configs/$1.py:model=hyla,size=smoke"; }
step "sraven_scaling.py" python experiments/sraven_scaling.py "$(smoke sraven)" \
  --workdir="$tmp/sraven_runs/s0"
step "fuzzy_logic.py" python experiments/fuzzy_logic.py "$(smoke fuzzy_logic)" \
  --workdir="$tmp/fuzzy_runs/s0"
step "probe_latents.py" python experiments/probe_latents.py --workdir="$tmp/sraven_runs/s0" \
  --output_dir="$tmp/probe" --num_problems=64 --permutations=2
step "plot_curves.py" python experiments/plot_curves.py --workdir="$tmp/sraven_runs/s0" \
  --tags=train/loss,test/loss --out="$tmp/curves.png"
step "launch.collect" python -m launch.collect --root="$tmp/sraven_runs" --out="$tmp/table"
step "launch.xm_launch --dry_run" python -m launch.xm_launch --sweep=table_a1_sraven --dry_run
step "task_stats.py" python experiments/task_stats.py --num_problems=128 --ceiling_problems=32
step "benchmark_attention.py" python experiments/benchmark_attention.py --seq_lens=32 \
  --batch=1 --heads=2 --head_dim=8 --repeats=1 --implementations=softmax,hyla_blockwise \
  --out_dir="$tmp/bench_attention"
step "benchmark_training.py" python experiments/benchmark_training.py --experiment=sraven \
  --size=smoke --models=softmax,hyla --steps=2 --repeats=1
step "profile_step.py" python experiments/profile_step.py --experiment=sraven --size=smoke \
  --steps=2 --trace_dir="$tmp/trace"

# C4 on a tiny generated corpus (the tests' helper): vocabulary, training, sampling.
step "tiny corpus" python -c "
import json, sys; sys.path.insert(0, 'tests')
import c4_testlib
json.dump(c4_testlib.write_corpus(sys.argv[1]), open(sys.argv[1] + '/corpus.json', 'w'))" "$tmp"
lm=(--config.task.name=text_lm --config.task.train_files="$tmp/train.jsonl"
    --config.task.validation_files="$tmp/validation.jsonl")
step "train_vocabulary.py" python experiments/train_vocabulary.py "$(smoke c4_lm)" "${lm[@]}" \
  --config.task.vocab_size=300 --output="$tmp/vocab2.model"
step "c4_lm.py" python experiments/c4_lm.py "$(smoke c4_lm)" "${lm[@]}" \
  --config.task.vocabulary="$tmp/vocabulary.model" --workdir="$tmp/runs_lm/c4"
step "c4_lm.py --generate" python experiments/c4_lm.py --generate --workdir="$tmp/runs_lm/c4" \
  --num_tokens=8
echo "extras smoke: every entry point ran"
