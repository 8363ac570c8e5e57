#!/usr/bin/env bash
# The training loop as users run it: tools/train.py with the shipped DINO configs
# (fp16 AMP, 48 images a GPU, 2 x 224 + 8 x 96 crops) on synthetic ImageNet-layout
# JPEGs, one epoch of ITERS iterations; prints s/iter from mmengine's log (the mean
# of the logged 10-iteration windows after the first, which holds the warm-up).
#   bash benchmarks/time_training_loop.sh [MODEL ...]   (default: vit-base dinovim-base dinovim-small dinovim-tiny)
# The DinoVim configs replay their blocks from CUDA graphs (CUDAGraphBlocksHook).
# MODEL+compile takes the -compile variant of a config (both backbones under
# torch.compile with CUDA graphs: CompileModulesHook), e.g. dinovim-base+compile.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
ITERS=${ITERS:-30}
ROOT=${ROOT:-work_dirs/synthetic_imagenet}
WORK_DIR=${WORK_DIR:-work_dirs/time_training_loop}
MODELS=${*:-vit-base dinovim-base dinovim-small dinovim-tiny}
[ -f "$ROOT/meta/train.txt" ] || "$PYTHON" benchmarks/make_synthetic_imagenet.py "$ROOT" $((48 * ITERS)) || exit 1
for m in $MODELS; do
  base=${m%+compile}
  cfg=configs/dino/dino_${base}-p16_4xb48-amp-100e_in1k.py
  [ "$m" = "$base" ] || cfg=configs/dino/dino_${base}-p16_4xb48-amp-compile-100e_in1k.py
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
