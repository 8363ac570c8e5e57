#!/usr/bin/env bash
# The training loop as users run it: tools/train.py with the shipped DINO configs
# (fp16 AMP, 48 images a GPU, 2 x 224 + 8 x 96 crops) on synthetic ImageNet-layout
# JPEGs, one epoch of ITERS iterations; prints s/iter from mmengine's log (the mean
# of the logged 10-iteration windows after the first, which holds the warm-up).
# The DinoVim configs replay their blocks from CUDA graphs (CUDAGraphBlocksHook).
usage() {
  cat <<'TXT'
usage: benchmarks/time_training_loop.sh [MODEL ...]

MODEL: a backbone name of mmdinomamba.zoo (dinovim-tiny, dinovim-small,
dinovim-base, dinomamba-reg-base, linearvit-base, vit-base) or its alias
(dinovim-t, reg-b, ...); MODEL+compile takes the -compile variant of its DINO
config (both backbones under torch.compile with CUDA graphs). Default:
vit-base dinovim-base dinovim-small dinovim-tiny.
Environment: ITERS (30), ROOT (work_dirs/synthetic_imagenet; made when missing),
WORK_DIR (work_dirs/time_training_loop), WORKERS (14), PYTHON.
TXT
}
case "${1:-}" in -h|--help) usage; exit 0 ;; esac
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
ITERS=${ITERS:-30}
ROOT=${ROOT:-work_dirs/synthetic_imagenet}
WORK_DIR=${WORK_DIR:-work_dirs/time_training_loop}
MODELS=${*:-vit-base dinovim-base dinovim-small dinovim-tiny}
# the DINO config of MODEL (an alias is resolved by mmdinomamba.zoo.canonical_name)
config_of() {
  local base=${1%+compile} name cfg
  name=$base
  [ -f "configs/dino/dino_${name}-p16_4xb48-amp-100e_in1k.py" ] || name=$("$PYTHON" -c \
    'import sys; from mmdinomamba.zoo import canonical_name; print(canonical_name(sys.argv[1]))' \
    "$base") || return 1
  cfg=configs/dino/dino_${name}-p16_4xb48-amp-100e_in1k.py
  [ "$1" = "$base" ] || cfg=configs/dino/dino_${name}-p16_4xb48-amp-compile-100e_in1k.py
  [ -f "$cfg" ] || { echo "time_training_loop.sh: no config $cfg for $1" >&2; return 1; }
  echo "$cfg"
}
declare -A CONFIGS
for m in $MODELS; do
  CONFIGS[$m]=$(config_of "$m") || { usage >&2; exit 2; }
done
[ -f "$ROOT/meta/train.txt" ] || "$PYTHON" benchmarks/make_synthetic_imagenet.py "$ROOT" $((48 * ITERS)) || exit 1
for m in $MODELS; do
  cfg=${CONFIGS[$m]}
  log=$WORK_DIR/${m/+/_}.log
  mkdir -p "$(dirname "$log")"
  "$PYTHON" tools/train.py "$cfg" \
    --work-dir "$WORK_DIR/${m/+/_}" --cfg-options \
    train_dataloader.dataset.data_root="$ROOT" train_dataloader.num_workers=${WORKERS:-14} \
    train_cfg.max_epochs=1 default_hooks.logger.interval=10 \
    default_hooks.checkpoint.interval=100 default_hooks.checkpoint.save_last=False > "$log" 2>&1
  "$PYTHON" - "$m" "$log" <<'PY'
import re, sys
name, log = sys.argv[1:]
txt = open(log).read()
t = [float(x) for x in re.findall(r'\btime: ([0-9.]+)', txt)]
d = re.findall(r'data_time: ([0-9.]+)', txt)
mem = re.findall(r'memory: ([0-9]+)', txt)
if len(t) < 2:
    sys.exit(f'{name}: fewer than two logged windows; see {log}')
print(f'{name:16s} s/iter {sum(t[1:]) / len(t[1:]):.3f}  (windows {t})  '
      f'data_time {d[-1]}  memory {mem[-1] if mem else "-"} MB')
PY
done
