#!/usr/bin/env bash
# Train on several GPUs (or CPU processes) of one or more machines with torchrun.
# shellcheck source=tools/_launch_common.sh
. "$(dirname "$0")/_launch_common.sh"
usage() {
  cat <<'TXT'
usage: tools/dist_train.sh CONFIG GPUS [train.py args...]

Runs tools/train.py CONFIG --launcher pytorch in GPUS processes on this machine.
Several machines: run it on each with the same CONFIG and GPUS and
TXT
  torchrun_environment
}
check_arguments dist_train.sh 2 "CONFIG and GPUS" "$@"
launch_torchrun "$2" train.py "$1" --launcher pytorch "${@:3}"
