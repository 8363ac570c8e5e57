#!/usr/bin/env bash
# Train on several GPUs (or CPU processes) of one or more machines with torchrun.
usage() {
  cat <<'TXT'
usage: tools/dist_train.sh CONFIG GPUS [train.py args...]

Runs tools/train.py CONFIG --launcher pytorch in GPUS processes on this machine.
Several machines: run it on each with the same CONFIG and GPUS and
  NNODES=N NODE_RANK=0..N-1 MASTER_ADDR=<host of rank 0> PORT=<free port>
Environment: NNODES (1), NODE_RANK (0), MASTER_ADDR (127.0.0.1), PORT (29500),
PYTHON (the repository's .venv/bin/python if present, else python).
TXT
}
case "${1:-}" in -h|--help) usage; exit 0 ;; esac
if [ $# -lt 2 ]; then
  echo "dist_train.sh: CONFIG and GPUS are required" >&2
  usage >&2
  exit 2
fi
set -euo pipefail
CONFIG=$1
GPUS=$2
shift 2
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
# the interpreter: $PYTHON if set, else the repository's .venv (make install), else python
VENV_PYTHON="$(dirname "$0")/../.venv/bin/python"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$VENV_PYTHON" ]; then PYTHON=$VENV_PYTHON; else PYTHON=python; fi
fi
exec "$PYTHON" -m torch.distributed.run --nnodes="$NNODES" --node_rank="$NODE_RANK" \
  --master_addr="$MASTER_ADDR" --nproc_per_node="$GPUS" --master_port="$PORT" \
  "$(dirname "$0")/train.py" "$CONFIG" --launcher pytorch "$@"
