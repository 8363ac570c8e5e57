#!/usr/bin/env bash
# Installs mmdinomamba and the OpenMMLab stack into a virtual environment.
#
# Idempotent: a second run with unchanged inputs only checks a stamp and returns in seconds.
# Facts it handles (measured on x86_64 Linux with Python 3.11):
#   * torch 2.14.1 + torchvision 0.29.1 (mmpretrain imports torchvision at registration);
#   * mmcv 2.1.0 (the newest that mmdet 3.3.0 / mmseg 1.2.2 accept) has no wheel for this torch,
#     so it is built from source with ops, under C++20 (tools/setup/gxx_cpp20), with
#     setuptools<70 and --no-build-isolation;
#   * pip's wheel cache keys mmcv by its sdist name only, so we keep our own wheel cache keyed
#     by the torch version and python tag, and never let pip reuse a foreign build.
case "${1:-}" in
  -h|--help)
    cat <<'TXT'
usage: tools/setup/install.sh   (make install runs it)

Installs torch, mmcv (built once, cached), the OpenMMLab packages and mmdinomamba
(editable, with the test extras) into a virtual environment; a second run with
unchanged inputs returns in seconds.
Environment: VENV (the repository's .venv), PYTHON (python3, makes the venv),
MMDINOMAMBA_WHEEL_CACHE (where the mmcv wheel is kept), MAX_JOBS (2).
TXT
    exit 0 ;;
  "") ;;
  *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
esac
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}
TORCH_VERSION=2.14.1
TORCHVISION_VERSION=0.29.1
MMCV_VERSION=2.1.0
OPENMMLAB=(mmengine==0.10.7 mmpretrain==1.2.0 mmsegmentation==1.2.2 mmdet==3.3.0)

log() { printf '[install] %s\n' "$*"; }

# The stamp covers everything that decides what gets installed.
stamp_inputs() {
  cat "$ROOT/tools/setup/install.sh" "$ROOT/setup.py" "$ROOT/tools/setup/gxx_cpp20"
  "$PYTHON" --version 2>&1
}
STAMP_HASH=$(stamp_inputs | sha256sum | cut -d' ' -f1)
STAMP=$VENV/.mmdinomamba-install-stamp

if [[ -f $STAMP && $(cat "$STAMP") == "$STAMP_HASH" ]]; then
  log "environment up to date ($VENV)"
  exit 0
fi

if [[ ! -x $VENV/bin/python ]]; then
  log "creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY=$VENV/bin/python
PIP=("$PY" -m pip install --disable-pip-version-check -q)

log "torch $TORCH_VERSION, torchvision $TORCHVISION_VERSION"
"${PIP[@]}" "torch==$TORCH_VERSION" "torchvision==$TORCHVISION_VERSION"
log "mmengine and mmcv's run-time requirements (mmcv itself is installed without deps)"
"${PIP[@]}" mmengine==0.10.7 addict yapf packaging pyyaml opencv-python Pillow numpy

if "$PY" -c "import mmcv, mmcv.ops, sys; sys.exit(mmcv.__version__ != '$MMCV_VERSION')" 2>/dev/null; then
  log "mmcv $MMCV_VERSION with ops already installed"
else
  PYTAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
  CACHE=${MMDINOMAMBA_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mmdinomamba/wheels}/torch-$TORCH_VERSION-$PYTAG
  mkdir -p "$CACHE"
  WHEEL=$(ls "$CACHE"/mmcv-"$MMCV_VERSION"-*.whl 2>/dev/null | head -n1 || true)
  if [[ -z $WHEEL ]]; then
    log "building mmcv $MMCV_VERSION with CPU ops (about 8 minutes on 2 idle cores)"
    # setuptools<70 keeps pkg_resources, which mmcv's setup.py imports (pip warns
    # that torch wants a newer setuptools: harmless, it is only used to build)
    "${PIP[@]}" "setuptools<70" wheel ninja
    TMP=$(mktemp -d)
    trap 'rm -rf "$TMP"' EXIT
    MMCV_WITH_OPS=1 FORCE_CUDA=0 MAX_JOBS=${MAX_JOBS:-2} CXX="$ROOT/tools/setup/gxx_cpp20" \
      "$PY" -m pip wheel -q --no-build-isolation --no-deps --no-cache-dir \
      "mmcv==$MMCV_VERSION" -w "$TMP"
    # Move into the cache only once complete, so an interrupted build leaves nothing behind.
    mv "$TMP"/mmcv-*.whl "$CACHE"/
    WHEEL=$(ls "$CACHE"/mmcv-"$MMCV_VERSION"-*.whl | head -n1)
  fi
  log "installing $WHEEL"
  # mmcv-lite (no compiled ops) owns the same import name: remove it first
  "$PY" -m pip uninstall -y -q mmcv-lite >/dev/null 2>&1 || true
  "${PIP[@]}" --no-deps --force-reinstall "$WHEEL"
  "$PY" -c "import mmcv.ops" || { log "mmcv.ops does not import"; exit 1; }
fi

log "OpenMMLab packages and mmdinomamba (editable, with test extras)"
"${PIP[@]}" "${OPENMMLAB[@]}" ftfy regex -e "$ROOT[tests]"
# mmengine 0.10 imports pkg_resources (to find `mmpretrain::` configs), which
# setuptools >= 81 no longer ships, while torch asks for setuptools >= 77.
log "setuptools>=77,<81 (torch's floor; mmengine needs pkg_resources)"
"${PIP[@]}" "setuptools>=77,<81"
"$PY" -c "import pkg_resources, mmdinomamba, mmpretrain, mmseg, mmdet, mmcv.ops" \
  || { log "import check failed"; exit 1; }

echo "$STAMP_HASH" > "$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
log "done: $VENV"
