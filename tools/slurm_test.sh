#!/usr/bin/env bash
# Evaluate a checkpoint on a Slurm cluster: one task per GPU, started by srun.
# shellcheck source=tools/_launch_common.sh
. "$(dirname "$0")/_launch_common.sh"
usage() {
  cat <<'TXT'
usage: tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py args...]

Runs tools/test.py CONFIG CHECKPOINT --launcher slurm in GPUS tasks through srun,
as mmpretrain's script of the same name does.
TXT
  srun_environment
}
check_arguments slurm_test.sh 4 "PARTITION, JOB_NAME, CONFIG and CHECKPOINT" "$@"
launch_srun "$1" "$2" test.py "$3" "$4" --launcher=slurm "${@:5}"
