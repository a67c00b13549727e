#!/usr/bin/env bash
# Build every service image's CPU variant from deploy/docker/*.Dockerfile, on this host's Docker:
#   cascade-api, cascade-reward (front), cascade-reward-worker, cascade-rollout (HF engine),
#   cascade-teacher, cascade-learner, all tagged :$CASCADE_TAG (default cpu).
# Where no registry can be pulled from (BASE_IMAGE unset and python:3.11-slim-bookworm absent),
# the base is the local one scripts/docker-base.sh imports; where the host's pip has a local CPU
# torch wheel (TORCH_WHEEL_DIR, default: pip's find-links), it is offered to the builds through
# deploy/wheels/ and torch comes from nothing else. Builds use --network host (no bridge here).
# Each image's build time and size go to $TIMINGS (TSV), for bench/results/images.md.
# The GPU variants are the Dockerfiles' defaults: `docker build -f deploy/docker/X.Dockerfile .`.
# Arguments: the images to build (default: all), e.g. `scripts/build-images.sh cascade-learner`.
set -euo pipefail
cd "$(dirname "$0")/.."

TAG="${CASCADE_TAG:-cpu}"
TIMINGS="${TIMINGS:-build/images-timings.tsv}"
LABEL="${CASCADE_IMAGE_LABEL:-io.cascade.image=cpu}"

if [ -z "${BASE_IMAGE:-}" ]; then
    if docker image inspect python:3.11-slim-bookworm >/dev/null 2>&1; then
        BASE_IMAGE=python:3.11-slim-bookworm
    else
        bash scripts/docker-base.sh
        BASE_IMAGE=cascade-base/python:3.11-bookworm
    fi
fi

wheel_dir="${TORCH_WHEEL_DIR:-$(pip config get global.find-links 2>/dev/null || true)}"
torch_args="--index-url https://download.pytorch.org/whl/cpu"
for whl in "$wheel_dir"/torch-2.13.0+cpu-*.whl; do
    if [ -f "$whl" ]; then
        # A hard link when on the same file system (no copy of ~190 MB), else a copy.
        [ -f "deploy/wheels/$(basename "$whl")" ] || ln "$whl" deploy/wheels/ 2>/dev/null || cp "$whl" deploy/wheels/
        torch_args="--no-index --find-links /wheels --no-deps"  # its deps: with the project's, next layer
    fi
done
index="${PIP_INDEX_URL_BUILD:-https://pypi.org/simple}"

mkdir -p "$(dirname "$TIMINGS")"
: > "$TIMINGS"
only=("$@")  # image names to build (default: all six), e.g. cascade-learner cascade-reward-worker
build() {  # build NAME DOCKERFILE [docker build args...]
    local name="$1" file="$2"
    shift 2
    if [ "${#only[@]}" -gt 0 ] && [[ " ${only[*]} " != *" $name "* ]]; then
        return 0
    fi
    local start
    start=$(date +%s)
    echo "building $name:$TAG ($file)"
    DOCKER_BUILDKIT=0 docker build --network host --force-rm -q -f "deploy/docker/$file" -t "$name:$TAG" \
        --label "$LABEL" \
        --build-arg PYTHON_IMAGE="$BASE_IMAGE" \
        --build-arg PIP_INDEX_URL="$index" \
        --build-arg TORCH_PIP_ARGS="$torch_args" \
        "$@" . >/dev/null
    local secs=$(( $(date +%s) - start ))
    local size
    size=$(docker image inspect -f '{{.Size}}' "$name:$TAG")
    printf '%s\t%s\t%s\n' "$name" "$secs" "$size" >> "$TIMINGS"
    echo "  $name:$TAG built in ${secs} s, $(( size / 1000000 )) MB"
}

build cascade-api api.Dockerfile
build cascade-reward reward.Dockerfile --target front
build cascade-reward-worker reward.Dockerfile --target worker
build cascade-teacher teacher.Dockerfile
build cascade-learner learner.Dockerfile
build cascade-rollout rollout.Dockerfile --build-arg VLLM_VERSION= --build-arg RUNTIME_APT_PACKAGES=
