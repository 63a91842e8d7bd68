#!/usr/bin/env bash
# The GPU run of issue 34; bench/gpu.py tells the whole story. On the GPU machine, in a copy of the
# working tree with .gpu/ carried (`python bench/gpu.py prepare` fills it here):
#     bash bench/gpu.sh                 # setup, CUDA tests, the plan, the recipe: into $OUT
#     bash bench/gpu.sh --dry-run       # here: every step on this CPU at toy size
# It runs the machine's python3, whose torch is the CUDA build, never a checkout's .venv (the torch
# pinned to the CPU wheel); only --dry-run, the CPU's own run, takes the .venv when there is one.
# CALM_GPU_PYTHON names another interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${CALM_GPU_PYTHON:-python3}
for arg in "$@"; do
    if [ "$arg" = --dry-run ] && [ -z "${CALM_GPU_PYTHON:-}" ] && [ -x .venv/bin/python ]; then
        python=.venv/bin/python
    fi
done
exec "$python" bench/gpu.py device "$@"
