# cascade-api: the control plane (FastAPI + dashboard over Postgres). CPU only, non-root.
# Start-up waits for the database and applies the Alembic migrations (`alembic upgrade head`,
# under an advisory lock) before it serves, so no separate migration step is needed.
#
#   docker build -f deploy/docker/api.Dockerfile -t cascade-api .      (from the repository root)
#
# Builds with the classic builder and BuildKit alike (no syntax directive, no COPY --chmod).
# Build arguments (public defaults; `make images` swaps in local ones where nothing can be pulled):
#   PYTHON_IMAGE    the base (any Debian-based Python 3.11 image)
#   PIP_INDEX_URL   the package index
#   TORCH_PIP_ARGS  where torch's CPU build comes from (PyPI's default torch is the CUDA one);
#                   "--no-index --find-links /wheels --no-deps" takes it from deploy/wheels/
#                   (its own dependencies then come with the project's, in the next layer)
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
ARG TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"

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
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/cascade cascade
COPY deploy/docker/healthcheck.py /opt/cascade/healthcheck.py
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /home/cascade
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/opt/cascade/healthcheck.py", "http", "http://127.0.0.1:8000/health"]
ENTRYPOINT ["cascade-api"]
CMD ["--host", "0.0.0.0", "--port", "8000"]
