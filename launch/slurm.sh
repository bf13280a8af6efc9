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
# hypernet_attention.train.check_config: the experiment, the config with its overrides, the
# workdir; one line and exit 2 if bad), then submits itself with `sbatch [SBATCH OPTIONS]`
# (the options are the leading arguments that start with '-'). Inside the job it checks
# again and starts `srun`. (`sbatch [OPTIONS] launch/slurm.sh ...` works too; then the check
# runs at the start of the job.) EXPERIMENT is a name of hypernet_attention/train/registry.py.
# Submit from the repository root with its Python environment active; WORKDIR must be on
# storage all nodes see. Rerunning the same command resumes from the newest checkpoint.
#SBATCH --job-name=hypernet-attention
#SBATCH --ntasks-per-node=1
#SBATCH --output=slurm-%j.out
set -euo pipefail
sbatch_args=()
while [[ $# -gt 0 && "$1" == -* ]]; do
  sbatch_args+=("$1")
  shift
done
if [[ $# -lt 3 ]]; then
  sed -n '2,19p' "$0" >&2
  exit 2
fi
experiment=$1; config_arg=$2; workdir=$3; shift 3
# sbatch runs a copy of this script; SLURM_SUBMIT_DIR is where it was submitted from.
cd "${SLURM_SUBMIT_DIR:-$(pwd)}"
checked=$(python3 -m hypernet_attention.train.check_config \
  "$experiment" "$config_arg" "$workdir" "$@") || exit 2
if [[ -z "${SLURM_JOB_ID:-}" ]]; then  # On the login node: submit this script.
  exec sbatch "${sbatch_args[@]}" "$0" "$experiment" "$config_arg" "$workdir" "$@"
fi
read -r script config_file <<< "$checked"
srun --ntasks-per-node=1 python3 "$script" --config="$config_file:$config_arg" \
  --workdir="$workdir" "$@"
