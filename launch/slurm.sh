#!/usr/bin/env bash
# Run one experiment on a SLURM GPU cluster: one process per node, all joining one
# jax.distributed run (JAX reads SLURM's variables: SLURM_NTASKS, SLURM_PROCID,
# SLURM_STEP_NODELIST, ...; runtime.detect_cluster sees SLURM_NTASKS > 1).
#
#   sbatch --nodes=2 --gpus-per-node=8 launch/slurm.sh EXPERIMENT CONFIG_ARG WORKDIR \
#       [--config.key=value ...]
#   sbatch --nodes=2 --gpus-per-node=8 launch/slurm.sh sraven "model=hyla,size=paper" \
#       /shared/runs/sraven_hyla_seed0 --config.seed=0
#
# EXPERIMENT is a name of hypernet_attention/train/registry.py. Submit from the repository
# root with its Python environment active; WORKDIR must be on storage all nodes see.
# Rerunning the same command resumes from the newest checkpoint.
#SBATCH --job-name=hypernet-attention
#SBATCH --ntasks-per-node=1
#SBATCH --output=slurm-%j.out
set -euo pipefail
if [[ $# -lt 3 ]]; then
  sed -n '2,13p' "$0" >&2
  exit 2
fi
experiment=$1; config_arg=$2; workdir=$3; shift 3
# sbatch runs a copy of this script; SLURM_SUBMIT_DIR is where it was submitted from.
cd "${SLURM_SUBMIT_DIR:-$(pwd)}"
read -r script config_file < <(python3 -m hypernet_attention.train.registry "$experiment") \
  || exit 2
srun --ntasks-per-node=1 python3 "$script" --config="$config_file:$config_arg" \
  --workdir="$workdir" "$@"
