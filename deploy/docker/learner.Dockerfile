# syntax=docker/dockerfile:1.7
# cascade-learner: the distributed mode's learner (services/learner, issue 6). It publishes prompt
# batches to Redis streams, trains on the scored groups, pushes weights to the rollout service,
# asks the teacher service for log-probs, checkpoints to the shared volume and writes stage state
# and metrics to Postgres. One per cascade: one process on a GPU, or sharded over several GPUs
# (and nodes) under torchrun, where rank 0 does the talking and every rank writes its shards.
#
#   docker build -f deploy/docker/learner.Dockerfile -t cascade-learner .
#
# torch 2.13.0 from PyPI is the CUDA 13.0 build: hosts need an NVIDIA driver >= 580 and the
# NVIDIA Container Toolkit.
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.8

FROM ${UV_IMAGE} AS uv

FROM ${CUDA_RUNTIME_IMAGE} AS build
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=uv /uv /usr/local/bin/uv
# Python 3.11 (the project's `requires-python`): Ubuntu 24.04 ships 3.12 only.
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
RUN uv pip install grpcio-tools==1.85.1 \
    && PY=python bash scripts/gen-proto.sh \
    && uv pip install '.[postgres]'

FROM ${CUDA_RUNTIME_IMAGE} AS runtime
RUN groupadd --system --gid 10001 cascade \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/cascade cascade \
    && mkdir -p /models /checkpoints && chown 10001:10001 /checkpoints
COPY --from=build /opt/python /opt/python
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/healthcheck.py /opt/cascade/healthcheck.py
COPY --chmod=0755 deploy/docker/learner-entrypoint.sh /opt/cascade/learner-entrypoint.sh
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    HF_HOME=/home/cascade/.cache/huggingface HF_HUB_OFFLINE=1
USER 10001:10001
WORKDIR /home/cascade
# /metrics and /health on 9400; /health is SERVING while the learner trains (the model load
# before the first step can take minutes on a large checkpoint).
EXPOSE 9400
HEALTHCHECK --interval=30s --timeout=5s --start-period=900s --retries=3 \
    CMD ["python", "/opt/cascade/healthcheck.py", "http", "http://127.0.0.1:9400/health"]
# One rank: cascade-learner. LEARNER_RANKS=N > 1: torchrun --standalone with N ranks on this host
# (learner-entrypoint.sh). Kubernetes' multi-node learner runs torchrun as its command instead.
ENTRYPOINT ["/opt/cascade/learner-entrypoint.sh"]
CMD ["/etc/cascade/cascade.yaml"]
