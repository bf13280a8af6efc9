#!/usr/bin/env bash
# Run one experiment on a SLURM GPU cluster: one process per node, all joining one
# jax.distributed run (JAX reads SLURM's variables: SLURM_NTASKS, SLURM_PROCID,
# SLURM_STEP_NODELIST, ...; runtime.detect_cluster sees SLURM_NTASKS > 1).
#
#   launch/slurm.sh [SBATCH OPTIONS] EXPERIMENT CONFIG_ARG WORKDIR [--config.key=value ...]
#   launch/slurm.sh --nodes=2 --gpus-per-node=8 sraven "model=hyla,size=paper" \
#       /shared/runs/sraven_hyla_seed0 --config.seed=0
#
# Run it on the login node: it checks the arguments there (python -m
# hypernet_attention.runs.preflight: the experiment, the config with its overrides, the
# workdir; one line and exit 2 if bad), then submits itself with `sbatch [SBATCH OPTIONS]`
# (the options are the leading arguments that start with '-'). Inside the job it checks
# again and starts `srun`. (`sbatch [OPTIONS] launch/slurm.sh ...` works too; then the check
# runs at the start of the job.) EXPERIMENT is a name of hypernet_attention/runs/registry.py.
# Submit from the repository root with its Python environment active; WORKDIR must be on
# storage all nodes see. Rerunning the same command resumes from the newest checkpoint.
#SBATCH --job-name=hypernet-attention
#SBATCH --ntasks-per-node=1
#SBATCH --output=slurm-%j.out
set -euo pipefail
sbatch_args=()
names=(EXPERIMENT CONFIG_ARG WORKDIR)
usage="usage: launch/slurm.sh [SBATCH OPTIONS] ${names[*]} [--config.key=value ...]"
while [[ $# -gt 0 && "$1" == -* ]]; do
  if [[ "$1" == --config* ]]; then  # Not an sbatch option: an override put first.
    echo "slurm.sh: error: $1 comes before ${names[*]}; allowed: overrides after WORKDIR;" \
      "$usage" >&2
    exit 2
  fi
  sbatch_args+=("$1")
  shift
done
# A missing or empty argument (CONFIG_ARG may be ''): one line naming it (and the usage), exit 2.
for i in "${!names[@]}"; do
  if [[ $# -le $i ]]; then
    echo "slurm.sh: error: missing ${names[*]:i}; $usage" >&2
    exit 2
  elif [[ -z "${*:i+1:1}" && ${names[i]} != CONFIG_ARG ]]; then
    echo "slurm.sh: error: ${names[i]}=''; allowed: a non-empty value; $usage" >&2
    exit 2
  fi
done
experiment=$1; config_arg=$2; workdir=$3; shift 3
# sbatch runs a copy of this script; SLURM_SUBMIT_DIR is where it was submitted from.
cd "${SLURM_SUBMIT_DIR:-$(pwd)}"
checked=$(python3 -m hypernet_attention.runs.preflight \
  "$experiment" "$config_arg" "$workdir" "$@") || exit 2
if [[ -z "${SLURM_JOB_ID:-}" ]]; then  # On the login node: submit this script.
  exec sbatch "${sbatch_args[@]}" "$0" "$experiment" "$config_arg" "$workdir" "$@"
fi
read -r script config_file <<< "$checked"
srun --ntasks-per-node=1 python3 "$script" --config="$config_file:$config_arg" \
  --workdir="$workdir" "$@"
