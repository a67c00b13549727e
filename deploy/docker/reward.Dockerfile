# The reward service: two targets from one image, scaled separately.
#   --target front   `cascade-reward`: gRPC front (math/if/swe scored in-process), gRPC :50051, /metrics :9100
#   --target worker  `celery -A services.reward.tasks worker`: the Celery workers that run code in
#                    the bubblewrap sandbox (and the rlhf reward model); the scaling knob
#
#   docker build -f deploy/docker/reward.Dockerfile --target worker -t cascade-reward-worker .
#   docker build -f deploy/docker/reward.Dockerfile --target front  -t cascade-reward .
#
# The sandbox needs (cascade/sandbox/preflight.py, `cascade sandbox check`): bubblewrap in the
# image; Debian's /usr/bin/python3 as the interpreter inside the sandbox (stdlib only, a separate
# interpreter from the service's venv); a non-root uid (bwrap started as root is no sandbox: it
# runs as this uid); and from the runtime, user namespaces, mount and a fresh /proc:
#   docker: --security-opt seccomp=unconfined --security-opt apparmor=unconfined
#           --security-opt systempaths=unconfined   (see deploy/docker-compose.yml)
#   Kubernetes: see the reward-worker securityContext in deploy/helm/cascade.
# Build arguments as in api.Dockerfile (PYTHON_IMAGE, PIP_INDEX_URL, TORCH_PIP_ARGS).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# CPU torch (the rlhf reward model runs on the workers' CPUs); see api.Dockerfile.
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

FROM ${PYTHON_IMAGE} AS reward-base
# The venv first, on the bare base: the same layer in every image that shares the build stage.
COPY --from=build /opt/venv /opt/venv
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap python3 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 cascade \
    && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/cascade cascade
COPY deploy/docker/healthcheck.py /opt/cascade/healthcheck.py
ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
WORKDIR /home/cascade

FROM reward-base AS worker
# Healthy = the sandbox really runs a program here (the same check a worker makes before it
# takes tasks; a worker refuses to start without it, exit 78).
HEALTHCHECK --interval=60s --timeout=30s --start-period=20s --retries=2 \
    CMD ["cascade", "sandbox", "check"]
ENTRYPOINT ["celery", "-A", "services.reward.tasks", "worker"]
CMD ["--concurrency", "4", "--loglevel", "INFO"]

FROM reward-base AS front
EXPOSE 50051 9100
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "/opt/cascade/healthcheck.py", "grpc", "127.0.0.1:50051", "cascade.v1.RewardService"]
ENTRYPOINT ["cascade-reward"]
CMD ["--port", "50051", "--metrics-port", "9100"]
