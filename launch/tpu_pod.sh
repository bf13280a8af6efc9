#!/usr/bin/env bash
# Run one experiment on every host of a TPU VM pod slice, without XManager.
#
#   launch/tpu_pod.sh TPU_NAME ZONE EXPERIMENT CONFIG_ARG WORKDIR [--config.key=value ...]
#   launch/tpu_pod.sh my-v5e-16 us-west4-a sraven "model=hyla,size=paper" \
#       gs://BUCKET/sraven/hyla_seed0 --config.seed=0
#
# EXPERIMENT is a name of hypernet_attention/runs/registry.py (sraven, fuzzy_logic, ...).
# Every host runs the same program with --multi_process: jax.distributed.initialize() finds
# the pod's hosts from the TPU metadata, so no coordinator flags are needed. The workdir must
# be on storage that all hosts see (GCS): checkpoints are written collectively.
# Everything is checked on this machine first (python -m hypernet_attention.runs.preflight:
# the experiment, the config and its overrides, the workdir; needs the package installed
# here): a bad argument is one line and exit 2, before anything is copied or started.
set -euo pipefail
# A missing, empty or misplaced argument: one line naming it (and the usage), exit 2.
names=(TPU_NAME ZONE EXPERIMENT CONFIG_ARG WORKDIR)
usage="usage: launch/tpu_pod.sh ${names[*]} [--config.key=value ...]"
for i in "${!names[@]}"; do
  value=${*:i+1:1}
  if [[ $# -le $i ]]; then
    echo "tpu_pod.sh: error: missing ${names[*]:i}; $usage" >&2
    exit 2
  elif [[ (-z "$value" && ${names[i]} != CONFIG_ARG) || "$value" == -* ]]; then
    echo "tpu_pod.sh: error: ${names[i]}='$value'; allowed: a non-empty value that is not" \
      "a flag (overrides go after WORKDIR; CONFIG_ARG may be ''); $usage" >&2
    exit 2
  fi
done
tpu=$1; zone=$2; experiment=$3; config_arg=$4; workdir=$5; shift 5
repo=$(cd "$(dirname "$0")/.." && pwd)
name=$(basename "$repo")
# Names the entry point and config file, after checking the config with its overrides.
checked=$(cd "$repo" && python3 -m hypernet_attention.runs.preflight \
  "$experiment" "$config_arg" "$workdir" "$@") || exit 2
read -r script config_file <<< "$checked"
extra=$(printf ' %q' "$@")

# Copy the working tree to every host, install it, then start the same command everywhere.
# Only what git would carry (tracked and untracked-but-not-ignored files): virtual
# environments of any name, workdirs and caches stay here. Outside a git checkout, everything
# but the usual environment and output folders.
archive="${TMPDIR:-/tmp}/$name.tgz"
if git -C "$repo" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  git -C "$repo" ls-files -z --cached --others --exclude-standard \
    | tar -C "$repo" --null --ignore-failed-read --transform="s,^,$name/," -czf "$archive" -T -
else
  tar -C "$(dirname "$repo")" --exclude="$name/.venv*" --exclude="$name/workdirs" \
    --exclude=__pycache__ -czf "$archive" "$name"
fi
gcloud compute tpus tpu-vm scp "$archive" "$tpu":~ --zone="$zone" --worker=all
gcloud compute tpus tpu-vm ssh "$tpu" --zone="$zone" --worker=all --command="
  set -e
  tar -xzf ~/$name.tgz -C ~
  cd ~/$name
  python3 -m pip install -q -e '.[tpu]'
  python3 $script --multi_process \
    --config=$config_file:$(printf '%q' "$config_arg") \
    --workdir=$(printf '%q' "$workdir")$extra"
