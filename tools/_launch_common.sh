#!/usr/bin/env bash
# What tools/dist_{train,test}.sh and tools/slurm_{train,test}.sh share: --help and
# the required arguments, the interpreter, and the torchrun / srun command lines.
# The launchers source it first (it sets bash's strict mode for them), then define
# usage() and call check_arguments.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  echo "usage: tools/_launch_common.sh is sourced by tools/dist_train.sh, dist_test.sh,"
  echo "slurm_train.sh and slurm_test.sh (their --help tells how to run them)"
  case "${1:-}" in -h|--help) exit 0 ;; *) exit 2 ;; esac
fi
set -euo pipefail

# the usage lines on the environment that launch_python, launch_torchrun and
# launch_srun read (srun_environment's argument: an example of SRUN_ARGS, or nothing)
python_environment() {
  echo "PYTHON (the repository's .venv/bin/python if present, else python)."
}
torchrun_environment() {
  cat <<'TXT'
  NNODES=N NODE_RANK=0..N-1 MASTER_ADDR=<host of rank 0> PORT=<free port>
Environment: NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1), PORT (29500),
TXT
  python_environment
}
srun_environment() {
  echo "Environment: GPUS (8, all tasks), GPUS_PER_NODE (8), CPUS_PER_TASK (5),"
  echo "SRUN_ARGS (extra srun arguments${1:-}),"
  python_environment
}

# check_arguments SCRIPT COUNT WHAT ARGS...: after usage, exit 0 on -h/--help; name
# WHAT and exit 2 when ARGS are fewer than COUNT
check_arguments() {
  local script=$1 count=$2 what=$3
  shift 3
  case "${1:-}" in -h|--help) usage; exit 0 ;; esac
  if [ $# -lt "$count" ]; then
    echo "$script: $what are required" >&2
    usage >&2
    exit 2
  fi
}

# the interpreter: $PYTHON if set, else the repository's .venv (make install), else python
launch_python() {
  local venv_python
  venv_python="$(dirname "$0")/../.venv/bin/python"
  if [ -n "${PYTHON:-}" ]; then echo "$PYTHON"
  elif [ -x "$venv_python" ]; then echo "$venv_python"
  else echo python; fi
}

# launch_torchrun GPUS TOOL ARGS...: python -m torch.distributed.run tools/TOOL ARGS in
# GPUS processes of this machine (NNODES, NODE_RANK, MASTER_ADDR, PORT: several machines)
launch_torchrun() {
  local gpus=$1 tool=$2
  shift 2
  exec "$(launch_python)" -m torch.distributed.run --nnodes="${NNODES:-1}" \
    --node_rank="${NODE_RANK:-0}" --master_addr="${MASTER_ADDR:-127.0.0.1}" \
    --nproc_per_node="$gpus" --master_port="${PORT:-29500}" "$(dirname "$0")/$tool" "$@"
}

# launch_srun PARTITION JOB_NAME TOOL ARGS...: python -u tools/TOOL ARGS in GPUS tasks
# (GPUS_PER_NODE a node, CPUS_PER_TASK each) started by srun with SRUN_ARGS
launch_srun() {
  local partition=$1 job_name=$2 tool=$3 gpus_per_node=${GPUS_PER_NODE:-8}
  shift 3
  # SRUN_ARGS is split into words on purpose (several srun options)
  # shellcheck disable=SC2086
  exec srun -p "$partition" --job-name="$job_name" --gres=gpu:"$gpus_per_node" \
    --ntasks="${GPUS:-8}" --ntasks-per-node="$gpus_per_node" \
    --cpus-per-task="${CPUS_PER_TASK:-5}" --kill-on-bad-exit=1 ${SRUN_ARGS:-} \
    "$(launch_python)" -u "$(dirname "$0")/$tool" "$@"
}
