#!/usr/bin/env bash
# Train on a Slurm cluster: one task per GPU, srun starts them, mmengine's slurm
# launcher sets up the process group.
# shellcheck source=tools/_launch_common.sh
. "$(dirname "$0")/_launch_common.sh"
usage() {
  cat <<'TXT'
usage: tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py args...]

Runs tools/train.py CONFIG --work-dir WORK_DIR --launcher slurm in GPUS tasks
through srun, as mmpretrain's script of the same name does.
TXT
  srun_environment ', e.g. "--quotatype=auto"'
}
check_arguments slurm_train.sh 4 "PARTITION, JOB_NAME, CONFIG and WORK_DIR" "$@"
launch_srun "$1" "$2" train.py "$3" --work-dir="$4" --launcher=slurm "${@:5}"
