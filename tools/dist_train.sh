#!/usr/bin/env bash
# Usage: tools/dist_train.sh CONFIG GPUS [train.py args...]
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
