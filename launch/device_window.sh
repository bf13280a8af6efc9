#!/bin/bash
# One short accelerator window of the paper-scale campaign (`launch/campaign`), as one command.
#
# A lent GPU machine is bare, cannot reach the network, and is given back when the command
# ends, so this script does the whole window in one go: installs the two packages the image
# lacks from carried wheels, runs the campaign's cells for at most SECONDS, stops them (they
# checkpoint on SIGTERM, and the campaign saves their progress and resume state), and
# bundles into $OUT what the repository needs: results.tar.gz (the new cell files and
# cut-off cells' progress, relative to the results folder) and each cut-off cell's resume
# state (<cell>.tar.gz, for `partial/`). Commit them here: the next window resumes those.
#
#   # here, once: the wheels the GPU image lacks (it has jax, flax, optax, orbax, chex, ...)
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux2014_x86_64 -d .whl ml-collections==1.1.0 clu==0.0.12
#   # there (carry .whl):
#   bash launch/device_window.sh 480 'b_sraven_hyla,b_sraven_softmax'
#
# The campaign's own budget would skip a cell whose estimate is longer than the window (a
# first window on a new device kind has only the reference rates, which assume no
# population gain), so the window is enforced here with `timeout` instead.
set -u
seconds=${1:?usage: device_window.sh SECONDS CELLS [MAX_CONCURRENT]}
cells=${2:?usage: device_window.sh SECONDS CELLS [MAX_CONCURRENT]}
concurrent=${3:-1}  # 1: processes on one GPU time-slice it
out=${OUT:-/tmp/device_window_out}
root=${ROOT:-workdirs/campaign}  # ROOT, RESULTS, SET, REDO: as --root, --results_dir, --set, --redo
results=${RESULTS:-experiments/results/paper_scale}
case $seconds in ''|*[!0-9]*) echo "SECONDS=$seconds; allowed: a whole number of seconds"; exit 2;; esac
# Honoured exactly: the runner and its cells get SIGTERM at SECONDS and up to kill_grace
# seconds (then SIGKILL) to finish a publish in flight, let the cells checkpoint (the runner
# waits up to its Options.stop_wait_s, 90 s, for them) and pack their resume states, so the
# command ends within SECONDS + ~170 s. kill_grace must exceed the runner's wait plus the
# packing (tests/launch/test_campaign_stops.py reads both). Fewer than 120 s cannot start a
# cell and stop it cleanly; 0 would mean "no limit" to timeout(1): no SIGTERM, no saved state.
kill_grace=150
# More than 5 digits is over 36000; checked as text, since bash arithmetic wraps at 2^63.
if (( ${#seconds} > 5 )) || (( 10#$seconds < 120 || 10#$seconds > 36000 )); then
  echo "SECONDS=$seconds; allowed: 120 to 36000 (the window ends within SECONDS + 170 s)"; exit 2
fi
case $concurrent in ''|*[!0-9]*|0) echo "MAX_CONCURRENT=$concurrent; allowed: an integer >= 1"; exit 2;; esac
for dir in "$out" "$root"; do
  mkdir -p "$dir" 2> /dev/null || { echo "OUT or ROOT=$dir cannot be a folder (a file is in the way); allowed: a folder path"; exit 2; }
done
ls .whl/*.whl > /dev/null 2>&1 || { echo ".whl/ holds no wheels; allowed: carry .whl (see the header)"; exit 2; }
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
python3 -c "import jax, flax, optax, orbax.checkpoint as oc, chex, clu, ml_collections
print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'orbax',
      oc.__version__, 'chex', chex.__version__, jax.devices())" || exit 1

listing() {  # The results folder's cell and partial files, each with its modification time
  # (kept parameters, params/<cell>/, are bundled apart below: one tarball per cell).
  (cd "$results" && find . -path ./params -prune -o -type f \( -name '*.json' -o -name '*.tar.gz' \) \
    -printf '%p %T@\n' 2>/dev/null | sort)
}
before=$(listing)
touch "$out/.window_start"
timeout -s TERM -k "$kill_grace" "$seconds" python3 -m launch.campaign --budget_minutes=600 \
  --set="${SET:-paper}" --root="$root" --results_dir="$results" --cells="$cells" \
  --max_concurrent="$concurrent" --stop_margin_s=0 ${REDO:+--redo="$REDO"} 2>&1 | tee "$out/campaign.out"

# What this window added or changed under the results folder: finished cells' files, and
# cut-off cells' progress and resume state (`launch/campaign/partial.py`).
after=$(listing)
changed=$(comm -13 <(echo "$before") <(echo "$after") | cut -d' ' -f1)
small=$(echo "$changed" | grep '\.json$')
(cd "$results" && tar czf "$out/results.tar.gz" $small) 2>/dev/null
cp "$root/progress.txt" "$out/" 2>/dev/null
for state in $(echo "$changed" | grep '\.tar\.gz$'); do cp "$results/$state" "$out/"; done
# Finished train cells' final parameters (what stage c decodes from): params-<cell>.tar.gz,
# unpacked here with `tar xzf params-<cell>.tar.gz -C $results`.
for record in $(find "$results/params" -mindepth 2 -maxdepth 2 -name final_params.json \
                  -newer "$out/.window_start" 2>/dev/null); do
  cell=$(basename "$(dirname "$record")")
  (cd "$results" && tar czf "$out/params-$cell.tar.gz" "params/$cell")
done
rm -f "$out/.window_start"
gone=$(comm -23 <(echo "$before" | cut -d' ' -f1) <(echo "$after" | cut -d' ' -f1))
echo "window done; changed under $results: $(echo $changed)"
[ -n "$gone" ] && echo "finished, so deleted there (git rm them here): $(echo $gone)"
echo "here: tar xzf results.tar.gz -C $results; cp <cell>.tar.gz $results/partial/;" \
  "for p in params-*.tar.gz; do tar xzf \$p -C $results; done"
ls -la "$out"
