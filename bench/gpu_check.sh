#!/usr/bin/env bash
# GPU check for a lent GPU machine: runs the HF engine on the GPU with a tiny model and prints
# tokens/s, plus the rollout-vs-learner log-prob check on that device (bench/gpu_check.py); then
# the learner check (bench/gpu_learner_check.py): a few learner steps on the GPU (bfloat16
# autocast, float32 master weights) against the CPU's on the same weights and batch, the loss's
# forward (mean token NLL) and the GRPO loss within 2e-2 relative, the gradient norm within 5e-2.
# The learner check needs the cascade package's light dependencies (pydantic, pyyaml) too.
# With 2 or more GPUs, last the sharded learner check (bench/gpu_sharded_check.py) under
# `torchrun --standalone --nproc-per-node=<GPUs>`: FSDP2 over NCCL, one rank per GPU, bfloat16
# compute over float32 master weights, a few updates against one process's on the same batch, the
# first step's losses within 2e-2 relative and its gradient norm within 5e-2; skipped, with a
# line saying so, on fewer than 2 GPUs. (Here, without GPUs, the same script runs on 2 CPU ranks:
# `.venv/bin/python -m torch.distributed.run --standalone --nproc-per-node=2
# bench/gpu_sharded_check.py --device cpu`, gloo, float32, every step within 1e-5.)
# Last, the learner-memory check (bench/gpu_learner_memory.py): one update of a Qwen3-0.6B-shaped
# model (random weights) at the recipe's settings, 128 prompts x 8 completions of up to 8K tokens,
# bfloat16 autocast, activation checkpointing, micro_batch_tokens 65536; it prints the peak that
# cascade.runner.step_memory.estimate_step expects BEFORE the update, then
# torch.cuda.max_memory_allocated beside it (within 25%, or exit 6). LEARNER_MEMORY_ARGS (e.g.
# "--mbt 32768") changes its settings, SKIP_LEARNER_MEMORY=1 skips it. Here:
# `.venv/bin/python bench/gpu_learner_memory.py --device cpu --tiny` runs its plumbing on the CPU
# in seconds.
#
#   bash bench/gpu_check.sh                   # tiny model shape (hidden 128, 4 layers)
#   bash bench/gpu_check.sh --hidden 1024 --layers 16 --batch 256   # something a GPU notices
#
# It needs a Python with a CUDA build of torch and transformers 5.x; nothing is downloaded (GPU
# machines here reach no network). In order, it uses:
#   1. $PYTHON if set;
#   2. the first of .venv/bin/python, python3 whose torch sees a GPU and whose transformers is 5.x;
#   3. a Python whose torch sees a GPU, plus a venv (--system-site-packages, so it keeps that
#      torch) in $GPU_VENV (default /tmp/cascade-gpu-venv) with transformers installed offline
#      from the wheels in $GPU_WHEELS (default bench/.gpu-wheels). Make that folder on a machine
#      with network access (~15 MB, must be untracked-but-not-ignored or carried to travel):
#        pip download --only-binary=:all: --python-version 3.11 -d bench/.gpu-wheels \
#            transformers==5.24.0 tokenizers==0.23.3 safetensors==0.8.0
# The pinned torch (2.13.0 CPU here) is deliberately not installed: the machine's own CUDA
# torch is the one to measure. Exit codes: 0 ok, 1 log-prob mismatch, 2 no usable GPU Python,
# 3 learner loss mismatch against the CPU (4 when the learner check cannot import cascade),
# 5 sharded learner mismatch against one process (or the sharded check failing to run),
# 6 learner memory more than 25% off its estimate (or out of memory).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
WHEELS="${GPU_WHEELS:-bench/.gpu-wheels}"
VENV="${GPU_VENV:-/tmp/cascade-gpu-venv}"

has_cuda_torch() { "$1" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
has_transformers5() {
    "$1" -c 'import sys, transformers as t; sys.exit(0 if int(t.__version__.split(".")[0]) >= 5 else 1)' 2>/dev/null
}

pick() {
    if [[ -n "${PYTHON:-}" ]]; then echo "$PYTHON"; return; fi
    local candidates=(.venv/bin/python python3 python)
    for py in "${candidates[@]}"; do
        command -v "$py" >/dev/null 2>&1 || continue
        if has_cuda_torch "$py" && has_transformers5 "$py"; then echo "$py"; return; fi
    done
    for py in "${candidates[@]}"; do
        command -v "$py" >/dev/null 2>&1 || continue
        has_cuda_torch "$py" || continue
        if [[ ! -x "$VENV/bin/python" ]]; then
            "$py" -m venv --system-site-packages "$VENV" >&2
        fi
        if ! has_transformers5 "$VENV/bin/python"; then
            if ! ls "$WHEELS"/transformers-*.whl >/dev/null 2>&1; then
                echo "gpu_check: $py has a CUDA torch but no transformers 5.x, and $WHEELS holds no wheels" >&2
                echo "gpu_check: see the header of bench/gpu_check.sh for how to make them" >&2
                return 1
            fi
            "$VENV/bin/python" -m pip install --quiet --no-index --find-links "$WHEELS" \
                transformers tokenizers safetensors >&2
        fi
        echo "$VENV/bin/python"
        return
    done
    echo "gpu_check: no Python here has a torch that sees a GPU (nvidia-smi: $(nvidia-smi -L 2>&1 | head -1))" >&2
    return 1
}

PY="$(pick)" || exit 2
echo "gpu_check: using $PY ($("$PY" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))" >&2
status=0
"$PY" bench/gpu_check.py "$@" || status=$?
if ! "$PY" -c 'import cascade.accel, cascade.runner.optimizer_step' 2>/dev/null; then
    echo "gpu_check: $PY cannot import cascade.runner.optimizer_step (pydantic/pyyaml missing?): learner check skipped" >&2
    exit $(( status != 0 ? status : 4 ))
fi
learner=0
"$PY" bench/gpu_learner_check.py --device cuda || learner=$?
sharded=0
gpus="$("$PY" -c 'import torch; print(torch.cuda.device_count())')"
if (( gpus >= 2 )); then
    echo "gpu_check: sharded learner check on $gpus GPUs (torchrun, NCCL)" >&2
    "$PY" -m torch.distributed.run --standalone --nproc-per-node="$gpus" \
        bench/gpu_sharded_check.py --device cuda || sharded=$?
else
    echo "gpu_check: sharded learner check skipped: $gpus GPU(s) here, it needs 2 or more (one rank per GPU)" >&2
fi
memory=0
if [[ -z "${SKIP_LEARNER_MEMORY:-}" ]]; then
    echo "gpu_check: learner memory, Qwen3-0.6B shape, 128 x 8 at 8K tokens (estimate first, then the update)" >&2
    # shellcheck disable=SC2086  # LEARNER_MEMORY_ARGS is a list of flags
    "$PY" bench/gpu_learner_memory.py --device cuda ${LEARNER_MEMORY_ARGS:-} || memory=$?
else
    echo "gpu_check: learner memory check skipped (SKIP_LEARNER_MEMORY set)" >&2
fi
if (( status != 0 )); then exit "$status"; fi
if (( learner == 1 )); then exit 3; fi
if (( learner != 0 )); then exit "$learner"; fi
if (( sharded != 0 )); then exit 5; fi
if (( memory != 0 )); then exit 6; fi
exit 0
