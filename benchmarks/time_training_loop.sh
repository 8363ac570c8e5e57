#!/usr/bin/env bash
# The DINO training loop as users run it: tools/train.py with the shipped DINO
# configs (fp16 AMP, 48 images a GPU, 2 x 224 + 8 x 96 crops) on synthetic
# ImageNet-layout JPEGs, one epoch of ITERS iterations, beside ViT-B's DINO config;
# s/iter, images/s and peak memory from mmengine's log. A shortcut for
#   python benchmarks/benchmark.py loop --task dino ...   (benchmarks/README.md)
# with its settings from the environment:
#   [ITERS=30] [ROOT=DIR] [WORK_DIR=DIR] [WORKERS=14] bash benchmarks/time_training_loop.sh [MODEL ...]
# (default: dinovim-base dinovim-small dinovim-tiny). The DinoVim configs replay
# their blocks from CUDA graphs (CUDAGraphBlocksHook). MODEL+compile compiles both
# backbones as the -compile configs do (CompileModulesHook, reduce-overhead), e.g.
# dinovim-base+compile.
usage() {
  cat <<'TXT'
usage: benchmarks/time_training_loop.sh [MODEL ...]

MODEL: a model name of mmdinomamba.zoo with a DINO config
(dinovim-tiny, dinovim-small, dinovim-base, dinomamba-reg-base, linearvit-base,
vit-base) or its short alias (dinovim-t, reg-b, ...); MODEL+compile compiles
both backbones (reduce-overhead). Default: dinovim-base dinovim-small dinovim-tiny.
Environment: ITERS (30), ROOT (work_dirs/synthetic_imagenet; made when missing),
WORK_DIR (work_dirs/time_training_loop), WORKERS (14), PYTHON.
TXT
}
case "${1:-}" in -h|--help) usage; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
# shellcheck disable=SC2086  # MODELS: one word a model
exec "$PYTHON" benchmarks/benchmark.py loop --task dino --compile-mode reduce-overhead \
  --train-iters "${ITERS:-30}" --root "${ROOT:-work_dirs/synthetic_imagenet}" \
  --work-dir "${WORK_DIR:-work_dirs/time_training_loop}" --workers "${WORKERS:-14}" \
  --models ${*:-dinovim-base dinovim-small dinovim-tiny}
