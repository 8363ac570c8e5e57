#!/usr/bin/env bash
# Train on a Slurm cluster: one task per GPU, srun starts them, mmengine's slurm
# launcher sets up the process group.
usage() {
  cat <<'TXT'
usage: tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [train.py args...]

Runs tools/train.py CONFIG --work-dir WORK_DIR --launcher slurm in GPUS tasks
through srun, as mmpretrain's script of the same name does.
Environment: GPUS (8, all tasks), GPUS_PER_NODE (8), CPUS_PER_TASK (5),
SRUN_ARGS (extra srun arguments, e.g. "--quotatype=auto"),
PYTHON (the repository's .venv/bin/python if present, else python).
TXT
}
case "${1:-}" in -h|--help) usage; exit 0 ;; esac
if [ $# -lt 4 ]; then
  echo "slurm_train.sh: PARTITION, JOB_NAME, CONFIG and WORK_DIR are required" >&2
  usage >&2
  exit 2
fi
set -euo pipefail
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
shift 4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
SRUN_ARGS=${SRUN_ARGS:-}
VENV_PYTHON="$(dirname "$0")/../.venv/bin/python"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$VENV_PYTHON" ]; then PYTHON=$VENV_PYTHON; else PYTHON=python; fi
fi
# SRUN_ARGS is split into words on purpose (several srun options)
# shellcheck disable=SC2086
exec srun -p "$PARTITION" --job-name="$JOB_NAME" --gres=gpu:"$GPUS_PER_NODE" \
  --ntasks="$GPUS" --ntasks-per-node="$GPUS_PER_NODE" \
  --cpus-per-task="$CPUS_PER_TASK" --kill-on-bad-exit=1 $SRUN_ARGS \
  "$PYTHON" -u "$(dirname "$0")/train.py" "$CONFIG" --work-dir="$WORK_DIR" \
  --launcher=slurm "$@"
