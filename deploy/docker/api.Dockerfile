# syntax=docker/dockerfile:1.7
# cascade-api: the control plane (FastAPI + dashboard over Postgres). CPU only, non-root.
# Start-up waits for the database and applies the Alembic migrations (`alembic upgrade head`,
# under an advisory lock) before it serves, so no separate migration step is needed.
#
#   docker build -f deploy/docker/api.Dockerfile -t cascade-api .      (from the repository root)
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch's CPU build first: PyPI's default torch wheel is the multi-GB CUDA one. pyproject's
# `torch==2.13.0` is then satisfied by the installed 2.13.0+cpu.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
WORKDIR /src
COPY pyproject.toml README.md ./
COPY proto proto
COPY scripts/gen-proto.sh scripts/gen-proto.sh
COPY cascade_proto/__init__.py cascade_proto/__init__.py
COPY cascade cascade
COPY services services
# The gRPC stubs are generated at install (never committed), then packaged with the project.
# (DL3013 takes '.[postgres]', the project itself, for an unpinned package: its pins are in pyproject.)
# hadolint ignore=DL3013
RUN pip install grpcio-tools==1.85.1 \
    && PY=python bash scripts/gen-proto.sh \
    && pip install '.[postgres]'

FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 cascade \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/cascade cascade
COPY --from=build /opt/venv /opt/venv
COPY deploy/docker/healthcheck.py /opt/cascade/healthcheck.py
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /home/cascade
EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "/opt/cascade/healthcheck.py", "http", "http://127.0.0.1:8000/health"]
ENTRYPOINT ["cascade-api"]
CMD ["--host", "0.0.0.0", "--port", "8000"]
