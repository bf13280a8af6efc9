#!/usr/bin/env bash
# Run one experiment on every host of a TPU VM pod slice, without XManager.
#
#   launch/tpu_pod.sh TPU_NAME ZONE EXPERIMENT CONFIG_ARG WORKDIR [--config.key=value ...]
#   launch/tpu_pod.sh my-v5e-16 us-west4-a sraven_scaling "model=hyla,size=paper" \
#       gs://BUCKET/sraven/hyla_seed0 --config.seed=0
#
# Every host runs the same program; `jax.distributed.initialize()` discovers the pod's
# topology from the TPU metadata, so no coordinator flags are needed. The workdir must be on
# storage that all hosts see (GCS): checkpoints are written collectively.
set -euo pipefail
if [[ $# -lt 5 ]]; then
  sed -n '2,11p' "$0" >&2
  exit 2
fi
tpu=$1; zone=$2; experiment=$3; config_arg=$4; workdir=$5; shift 5
case "$experiment" in
  sraven_scaling) config_file=sraven.py ;;
  fuzzy_logic) config_file=fuzzy_logic.py ;;
  *) echo "Unknown experiment '$experiment'; allowed: sraven_scaling, fuzzy_logic." >&2; exit 2 ;;
esac
repo=$(cd "$(dirname "$0")/.." && pwd)
name=$(basename "$repo")

# Copy the working tree to every host, install it, then start the same command everywhere.
tar -C "$(dirname "$repo")" --exclude="$name/.venv" --exclude="$name/workdirs" -czf /tmp/"$name".tgz "$name"
gcloud compute tpus tpu-vm scp /tmp/"$name".tgz "$tpu":~ --zone="$zone" --worker=all
gcloud compute tpus tpu-vm ssh "$tpu" --zone="$zone" --worker=all --command="
  set -e
  tar -xzf ~/$name.tgz -C ~
  cd ~/$name
  python3 -m pip install -q -e '.[tpu]'
  python3 experiments/$experiment.py \
    --config=experiments/configs/$config_file:$config_arg \
    --workdir=$workdir $*"
