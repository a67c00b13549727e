# cascade-teacher: the finished domains' best checkpoints scoring the student's tokens
# (sampled / top-k / full log-probs) behind gRPC (:50053, /metrics :9102), on a GPU.
#
#   docker build -f deploy/docker/teacher.Dockerfile -t cascade-teacher .                 (GPU)
#   docker build -f deploy/docker/teacher.Dockerfile -t cascade-teacher:cpu \
#       --build-arg TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu" .   (CPU)
#
# GPU: torch 2.13.0 from PyPI is the CUDA 13.0 build with the CUDA runtime as wheels (see
# learner.Dockerfile); hosts need an NVIDIA driver >= 580 and the NVIDIA Container Toolkit.
# Build arguments as in learner.Dockerfile.
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
RUN groupadd --system --gid 10001 cascade \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/cascade cascade \
    && mkdir -p /models /checkpoints && chown 10001:10001 /checkpoints
COPY deploy/docker/healthcheck.py /opt/cascade/healthcheck.py
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
    HF_HOME=/home/cascade/.cache/huggingface HF_HUB_OFFLINE=1
USER 10001:10001
WORKDIR /home/cascade
EXPOSE 50053 9102
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "/opt/cascade/healthcheck.py", "grpc", "127.0.0.1:50053", "cascade.v1.TeacherService"]
ENTRYPOINT ["cascade-teacher"]
CMD ["--device", "cuda", "--dtype", "bfloat16", "--port", "50053", "--metrics-port", "9102"]
