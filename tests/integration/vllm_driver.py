"""One real vLLM engine in its own process, driven over stdin/stdout (JSON, one line each way).

Run with the vLLM environment's Python (`.venv-vllm/bin/python tests/integration/vllm_driver.py`)
by `vllm_procs.VllmDriver`; the tests themselves run in the main environment, which has no vLLM,
and compare what this process returns with the learner's own computations there. One engine at
a time: `start` closes the previous one first. Requests:

- `{"op": "start", "model": DIR, "settings": {...VllmEngineConfig...}, "version": 0}`
- `{"op": "generate", "prompts": [[ids]], "n": G, "sampling": {...SamplingSettings...}}`
- `{"op": "load_checkpoint", "path": DIR, "version": null}`
- `{"op": "load_tensors", "path": DIR}`: reads the checkpoint here and streams it as tensors
- `{"op": "close"}`

Answers: `{"ok": true, ...}` or `{"ok": false, "error": TYPE, "message": ...}`. vLLM's own
output goes to stderr; the answers use the original stdout only.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any


def main() -> None:
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything printed (vLLM, tqdm) goes to stderr, never into the answers
    sys.stdout = sys.stderr

    from cascade.config import VllmEngineConfig
    from cascade.engine.base import SamplingSettings
    from cascade.engine.vllm import VLLMEngine
    from cascade.engine.weights import read_checkpoint

    engine: VLLMEngine | None = None

    def handle(req: dict[str, Any]) -> dict[str, Any]:
        nonlocal engine
        op = req["op"]
        if op == "start":
            if engine is not None:
                engine.close()
                engine = None
            settings = VllmEngineConfig(**req.get("settings", {}))
            start = time.perf_counter()
            engine = VLLMEngine(req["model"], settings=settings, version=req.get("version", 0))
            return {
                "version": engine.version,
                "info": engine.info.__dict__,
                "settings": engine.settings.__dict__,
                "seconds": time.perf_counter() - start,
            }
        if op == "close":
            if engine is not None:
                engine.close()
                engine = None
            return {}
        assert engine is not None, "no engine: send start first"
        if op == "generate":
            start = time.perf_counter()
            out = engine.generate(req["prompts"], req["n"], SamplingSettings(**req["sampling"]))
            g = out.generation
            return {
                "seconds": time.perf_counter() - start,
                "version": out.version,
                "completion_ids": g.completion_ids,
                "logprobs": g.logprobs,
                "finish_reasons": g.finish_reasons,
            }
        if op == "load_checkpoint":
            update = engine.load_checkpoint(req["path"], version=req.get("version"))
            return {"version": update.version, "bytes": update.bytes, "seconds": update.seconds}
        if op == "load_tensors":
            update = engine.load_tensors(read_checkpoint(req["path"]), version=req.get("version"))
            return {"version": update.version, "bytes": update.bytes, "seconds": update.seconds}
        raise ValueError(f"unknown op {op!r}")

    for line in sys.stdin:
        if not line.strip():
            continue
        req = json.loads(line)
        try:
            answer = {"ok": True, **handle(req)}
        except Exception as err:
            traceback.print_exc()
            answer = {"ok": False, "error": type(err).__name__, "message": str(err)}
        answers.write(json.dumps(answer) + "\n")
    if engine is not None:
        engine.close()


if __name__ == "__main__":  # vLLM spawns processes that re-import the main module
    main()
