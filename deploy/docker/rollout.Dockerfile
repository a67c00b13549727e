# cascade-rollout: generation + weight updates behind gRPC (:50052, /metrics :9101), on a GPU.
# Engines: `--engine hf` or `--engine vllm` (vLLM is installed here unless VLLM_VERSION is empty).
# The rollout workers (`cascade-rollout-worker`, Redis streams -> Generate -> Score) use this
# image too, with their own entry point.
#
#   docker build -f deploy/docker/rollout.Dockerfile -t cascade-rollout .                 (GPU, vLLM)
#   docker build -f deploy/docker/rollout.Dockerfile -t cascade-rollout:cpu \
#       --build-arg TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" \
#       --build-arg VLLM_VERSION= --build-arg RUNTIME_APT_PACKAGES= .                    (CPU, HF engine)
#
# GPU: torch 2.13.0 and vllm 0.32.0 from PyPI are CUDA 13.0 builds carrying the CUDA runtime as
# wheels (see learner.Dockerfile); hosts need an NVIDIA driver >= 580 and the NVIDIA Container
# Toolkit. build-essential is in the run-time image because vLLM compiles kernels at run time
# (Triton needs a C compiler).
# Build arguments: PYTHON_IMAGE, PIP_INDEX_URL, TORCH_PIP_ARGS as in learner.Dockerfile, plus
#   VLLM_VERSION          the vLLM release ("" = none: the HF engine only, the CPU variant)
#   UV_VERSION            uv from PyPI, for vLLM's install with rollout-vllm-overrides.txt
#   RUNTIME_APT_PACKAGES  Debian packages of the run-time image ("" for the CPU variant)
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG TORCH_PIP_ARGS=""

FROM ${PYTHON_IMAGE} AS build
# This stage is the same text in every service image (tests/deploy checks it): one daemon
# builds its layers (torch, the dependencies, the project) once for all of them when their build
# arguments agree, as the CPU variants' do. vLLM comes last, in a layer of its own.
ARG PIP_INDEX_URL=https://pypi.org/simple
ARG TORCH_PIP_ARGS
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
COPY deploy/wheels /wheels
# torch first: pyproject's `torch==2.13.0` is then satisfied by the build TORCH_PIP_ARGS chose.
# hadolint ignore=DL3013
RUN pip install ${TORCH_PIP_ARGS} torch==2.13.0
WORKDIR /src
# The dependencies in a layer of their own, keyed on pyproject.toml: a source change reuses it.
COPY pyproject.toml ./
COPY deploy/docker/pyproject-requirements.py /tmp/pyproject-requirements.py
RUN python /tmp/pyproject-requirements.py pyproject.toml postgres > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt
COPY README.md ./
COPY proto proto
COPY scripts/gen-proto.sh scripts/gen-proto.sh
COPY cascade_proto/__init__.py cascade_proto/__init__.py
COPY cascade cascade
COPY services services
# The gRPC stubs are generated at install (never committed), then packaged with the project.
# hadolint ignore=DL3013
RUN PY=python bash scripts/gen-proto.sh \
    && pip install --no-deps --no-build-isolation '.[postgres]'
ARG VLLM_VERSION=0.32.0
ARG UV_VERSION=0.13.8
COPY deploy/docker/rollout-vllm-overrides.txt /tmp/overrides.txt
# vLLM 0.32.0 pins older transformers, numpy and FastAPI than pyproject: uv installs it with the
# overrides over the dependencies already installed (the project itself is --no-deps).
# hadolint ignore=DL3013
RUN if [ -n "$VLLM_VERSION" ]; then \
        pip install "uv==${UV_VERSION}" \
        && UV_NO_CACHE=1 UV_LINK_MODE=copy uv pip install --python /opt/venv/bin/python --index-url "$PIP_INDEX_URL" \
            --override /tmp/overrides.txt -r /tmp/requirements.txt "vllm==${VLLM_VERSION}" \
        && pip uninstall -y uv; \
    fi

FROM ${PYTHON_IMAGE} AS runtime
# The venv first, on the bare base: the same layer in every image that shares the build stage.
COPY --from=build /opt/venv /opt/venv
ARG RUNTIME_APT_PACKAGES="build-essential"
RUN if [ -n "$RUNTIME_APT_PACKAGES" ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends $RUNTIME_APT_PACKAGES \
        && rm -rf /var/lib/apt/lists/*; \
    fi \
    && groupadd --system --gid 10001 cascade \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/cascade cascade \
    && mkdir -p /models /checkpoints && chown 10001:10001 /checkpoints
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
