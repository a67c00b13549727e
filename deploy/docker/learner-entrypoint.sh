#!/bin/sh
# The learner image's entry point. LEARNER_RANKS unset or 1: `cascade-learner ARGS`, one process.
# LEARNER_RANKS=N > 1: the sharded learner on this host, N ranks (one per GPU) under
#   torchrun --standalone --nproc-per-node=N -m services.learner.main ARGS
# (the learner picks nccl on GPUs, gloo on CPU). Across hosts, Kubernetes runs torchrun itself
# with a c10d rendezvous (deploy/helm/cascade/templates/learner.yaml) and bypasses this script.
set -eu
ranks="${LEARNER_RANKS:-1}"
case "$ranks" in
    '' | *[!0-9]*) ranks=0 ;;
esac
if [ "$ranks" -lt 1 ]; then
    echo "learner-entrypoint: LEARNER_RANKS must be a whole number >= 1, got '${LEARNER_RANKS:-}'" >&2
    exit 64
fi
if [ "$ranks" -eq 1 ]; then
    exec cascade-learner "$@"
fi
exec torchrun --standalone --nproc-per-node="$ranks" -m services.learner.main "$@"
