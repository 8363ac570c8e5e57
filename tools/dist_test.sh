#!/usr/bin/env bash
# Evaluate a checkpoint on several GPUs (or CPU processes) with torchrun.
# shellcheck source=tools/_launch_common.sh
. "$(dirname "$0")/_launch_common.sh"
usage() {
  cat <<'TXT'
usage: tools/dist_test.sh CONFIG CHECKPOINT GPUS [test.py args...]

Runs tools/test.py CONFIG CHECKPOINT --launcher pytorch in GPUS processes on this
machine. Several machines: run it on each with
TXT
  torchrun_environment
}
check_arguments dist_test.sh 3 "CONFIG, CHECKPOINT and GPUS" "$@"
launch_torchrun "$3" test.py "$1" "$2" --launcher pytorch "${@:4}"
