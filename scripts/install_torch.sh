#!/usr/bin/env bash
# Install PyTorch into a virtual environment without a multi-GB surprise (make calls this).
#
#   scripts/install_torch.sh <python of the venv> [version]
#
# TORCH="<pip arguments>" chooses for you, e.g. TORCH="torch==2.13.0 --index-url
# https://download.pytorch.org/whl/cu126". Otherwise, in this order:
#   1. a torch wheel already on this machine (pip's find-links, e.g. a local CPU build): no
#      download at all;
#   2. a GPU here (nvidia-smi lists one): PyPI's default build, which is CUDA's;
#   3. no GPU: the CPU build from PyTorch's CPU wheel index (about 200 MB), with a short timeout.
# A plain `pip install torch` on a CPU-only machine would pull the multi-GB CUDA build: that is
# never the fallback. If nothing works it says why and what to give as TORCH=, and fails.
set -euo pipefail

python="$1"
version="${2:-2.13.0}"
pip=("$python" -m pip install --disable-pip-version-check)

if [ -n "${TORCH:-}" ]; then
    echo "install_torch: TORCH=$TORCH"
    # shellcheck disable=SC2086 # TORCH holds pip arguments
    exec "${pip[@]}" $TORCH
fi
if "${pip[@]}" --no-index --no-deps "torch==$version" >/dev/null 2>&1; then
    echo "install_torch: torch $version from a wheel on this machine"
    exit 0
fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "install_torch: a GPU is present: torch $version from PyPI (the CUDA build)"
    exec "${pip[@]}" "torch==$version"
fi
echo "install_torch: no GPU: torch $version, CPU build, from download.pytorch.org/whl/cpu"
# that index alone (it holds torch's dependencies too): with PyPI beside it, an unreachable CPU
# index would quietly give PyPI's CUDA build
if "${pip[@]}" --timeout 15 --retries 1 --index-url https://download.pytorch.org/whl/cpu \
        "torch==$version"; then
    exit 0
fi
cat >&2 <<EOF
install_torch: could not install torch $version: no wheel on this machine, and PyTorch's CPU
wheel index (https://download.pytorch.org/whl/cpu) cannot be reached. Give the pip arguments
that work here, e.g. make test TORCH="torch==$version" (from PyPI: on Linux the CUDA build, a few
GB) or TORCH="/path/to/torch-$version-<platform>.whl".
EOF
exit 1
