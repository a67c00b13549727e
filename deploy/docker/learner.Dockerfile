# cascade-learner: the distributed mode's learner (services/learner, issue 6). It publishes prompt
# batches to Redis streams, trains on the scored groups, pushes weights to the rollout service,
# asks the teacher service for log-probs, checkpoints to the shared volume and writes stage state
# and metrics to Postgres. One per cascade: one process on a GPU, or sharded over several GPUs
# (and nodes) under torchrun, where rank 0 does the talking and every rank writes its shards.
#
#   docker build -f deploy/docker/learner.Dockerfile -t cascade-learner .                 (GPU)
#   docker build -f deploy/docker/learner.Dockerfile -t cascade-learner:cpu \
#       --build-arg TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" .   (CPU)
#
# GPU: torch 2.13.0 from PyPI is the CUDA 13.0 build and carries the CUDA runtime as wheels
# (nvidia-*-cu13), so the base is a plain Python 3.11 image: no CUDA base image, no Python
# toolchain downloaded at build time. Hosts need an NVIDIA driver >= 580 and the NVIDIA Container
# Toolkit (which mounts the driver into the container).
# Build arguments: PYTHON_IMAGE, PIP_INDEX_URL and TORCH_PIP_ARGS as in api.Dockerfile, except
# that TORCH_PIP_ARGS is empty by default here (torch from PIP_INDEX_URL: the CUDA build).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG TORCH_PIP_ARGS=""

FROM ${PYTHON_IMAGE} AS build
# This stage is the same text in every service image (tests/deploy checks it): one daemon
# builds its layers (torch, the dependencies, the project) once for all of them when their build
# arguments agree, as the CPU variants' do (the rollout image adds vLLM after it).
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

FROM ${PYTHON_IMAGE} AS runtime
# The venv first, on the bare base: the same layer in every image that shares the build stage.
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/learner-entrypoint.sh /opt/cascade/learner-entrypoint.sh
RUN groupadd --system --gid 10001 cascade \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/cascade cascade \
    && mkdir -p /models /checkpoints && chown 10001:10001 /checkpoints \
    && chmod 0755 /opt/cascade/learner-entrypoint.sh
COPY deploy/docker/healthcheck.py /opt/cascade/healthcheck.py
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    HF_HOME=/home/cascade/.cache/huggingface HF_HUB_OFFLINE=1
USER 10001:10001
WORKDIR /home/cascade
VOLUME ["/checkpoints"]
# /metrics and /health on 9400; /health is SERVING while the learner trains (the model load
# before the first step can take minutes on a large checkpoint).
EXPOSE 9400
HEALTHCHECK --interval=30s --timeout=5s --start-period=900s --retries=3 \
    CMD ["python", "/opt/cascade/healthcheck.py", "http", "http://127.0.0.1:9400/health"]
# One rank: cascade-learner. LEARNER_RANKS=N > 1: torchrun --standalone with N ranks on this host
# (learner-entrypoint.sh). Kubernetes' multi-node learner runs torchrun as its command instead.
ENTRYPOINT ["/opt/cascade/learner-entrypoint.sh"]
CMD ["/etc/cascade/cascade.yaml"]
