# syntax=docker/dockerfile:1.7
# cascade-rollout: generation + weight updates behind gRPC (:50052, /metrics :9101), on a GPU.
# Engines: `--engine hf` (tested) or `--engine vllm` (vLLM is installed here; the engine is written
# against vLLM's documented API and has not run on a GPU in this repository's CI).
# The rollout workers (`cascade-rollout-worker`, Redis streams -> Generate -> Score) use this
# image too, with their own entry point.
#
#   docker build -f deploy/docker/rollout.Dockerfile -t cascade-rollout .
#
# CUDA: torch 2.13.0 from PyPI carries the CUDA 13.0 runtime (hosts need an NVIDIA driver >= 580
# and the NVIDIA Container Toolkit). The run-time base is the -devel image because vLLM compiles
# kernels at run time (Triton needs a C compiler; FlashInfer's JIT needs nvcc).
ARG CUDA_DEVEL_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.8

FROM ${UV_IMAGE} AS uv

FROM ${CUDA_DEVEL_IMAGE} AS build
ARG VLLM_VERSION=0.32.0
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=uv /uv /usr/local/bin/uv
# Python 3.11 (the project's `requires-python`) as a uv-managed interpreter under /opt/python:
# Ubuntu 24.04 ships 3.12 only.
ENV UV_PYTHON_INSTALL_DIR=/opt/python UV_NO_CACHE=1 UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy
RUN uv python install 3.11 && uv venv --python 3.11 /opt/venv
ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto proto
COPY scripts/gen-proto.sh scripts/gen-proto.sh
COPY cascade_proto/__init__.py cascade_proto/__init__.py
COPY cascade cascade
COPY services services
COPY deploy/docker/rollout-vllm-overrides.txt /tmp/overrides.txt
RUN uv pip install grpcio-tools==1.85.1 \
    && PY=python bash scripts/gen-proto.sh \
    && uv pip install --override /tmp/overrides.txt . "vllm==${VLLM_VERSION}"

FROM ${CUDA_DEVEL_IMAGE} AS runtime
RUN apt-get update && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 cascade \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/cascade cascade \
    && mkdir -p /models /checkpoints && chown 10001:10001 /checkpoints
COPY --from=build /opt/python /opt/python
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/healthcheck.py /opt/cascade/healthcheck.py
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    HF_HOME=/home/cascade/.cache/huggingface HF_HUB_OFFLINE=1
USER 10001:10001
WORKDIR /home/cascade
EXPOSE 50052 9101
# The model loads before the service reports SERVING: allow for it in the start period.
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "/opt/cascade/healthcheck.py", "grpc", "127.0.0.1:50052", "cascade.v1.RolloutService"]
ENTRYPOINT ["cascade-rollout"]
CMD ["--model", "/models/policy", "--device", "cuda", "--dtype", "bfloat16", "--port", "50052", "--metrics-port", "9101"]
