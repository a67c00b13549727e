"""Agent domain: generation, the reference traces, the config, the episode stats, and the python
tool through the code sandbox. (Hostile transcripts: tests/security/hacking/test_agent_hacks.py;
function-call rows: test_function_calls.py.)"""

from __future__ import annotations

import shutil

import pytest

from cascade.config import AgentReward, ConfigError, DomainConfig, parse_domain_config
from cascade.domains import load_problems, make_domain
from cascade.domains.agent import AgentDomain, default_format, make_store, render_trace
from cascade.domains.base import INFRA_ERROR, OK, WRONG_ANSWER
from cascade.sandbox.jobs import BwrapSettings, SandboxLimits
from cascade.sandbox.pool import SandboxUnavailable
from cascade.tools.builtin import PythonTool, ToolUnavailable
from cascade.tools.environment import BAD_JSON, episode_metrics
from cascade.tools.template import ToolCallText

FMT = default_format()


def _call(name: str, **arguments: object) -> str:
    return FMT.render_calls([ToolCallText(name, dict(arguments))])


def test_problems_deterministic_disjoint_and_need_the_store() -> None:
    d = AgentDomain()
    train = d.make_problems("train", 300, seed=1)
    assert train == d.make_problems("train", 300, seed=1)
    assert train != d.make_problems("train", 300, seed=2)
    evals, sft = d.make_problems("eval", 100, seed=1), d.make_problems("sft", 100, seed=1)
    prompts = [{p.prompt for p in ps} for ps in (train, evals, sft)]
    assert [len(s) for s in prompts] == [300, 100, 100]
    assert not (prompts[0] & prompts[1]) and not (prompts[0] & prompts[2]) and not (prompts[1] & prompts[2])
    kinds = {("answer" if "answer" in p.meta["check"] else "state") for p in train}
    assert kinds == {"answer", "state"}
    for p in train[:50]:
        assert p.meta["store"] == make_store(p.meta["seed"])
        assert p.prompt.startswith(f"[store {p.meta['seed']}] ")
        values = {str(v) for v in p.meta["store"].values()}
        assert not any(
            key in p.prompt and value in p.prompt.split("]")[1] for key in p.meta["store"] for value in values
        )
        assert set(p.meta["reads"]) <= set(p.meta["store"])


def test_reference_traces_earn_one_in_both_thinking_modes() -> None:
    d = AgentDomain()
    problems = d.make_problems("sft", 200, seed=3)
    assert [v.reason for v in d.score_batch(problems, [p.answer for p in problems])] == [OK] * 200
    thinking = [render_trace(p.meta["trace"], FMT, thinking=True) for p in problems]
    assert [v.reason for v in d.score_batch(problems, thinking)] == [OK] * 200
    calls = [len(p.meta["trace"]) for p in problems]
    assert min(calls) >= 3  # at least one call, its response and the answer


def test_episode_stats_per_completion() -> None:
    d = AgentDomain()
    p = next(
        p
        for p in d.make_problems("train", 50, seed=0)
        if "answer" in p.meta["check"] and len(p.meta["reads"]) == 2
    )
    a, b = p.meta["reads"]
    env = d.environment(p)
    turns = [
        "<tool_call>\nnot json\n</tool_call>",
        _call("kv_get", key=a) + _call("kv_get", key=b),
        p.meta["check"]["answer"],
    ]
    text = ""
    for n, turn in enumerate(turns):
        step = env.step(turn)
        text += turn + (FMT.env_text(step.responses) if n < len(turns) - 1 else "")
    verdict, episodes = d.score_with_stats([p, p], [text, "0"])
    assert [v.reason for v in verdict] == [OK, WRONG_ANSWER]
    stats = episodes[0].as_metrics()
    assert stats["turns"] == 3 and stats["calls"] == 2 and stats["calls_ok"] == 2
    assert stats["malformed_calls"] == 1 and stats[f"malformed_{BAD_JSON}"] == 1
    assert episodes[1].as_metrics()["calls"] == 0


def test_config_and_registry() -> None:
    domain = make_domain(DomainConfig(name="agent"))
    assert domain.name == "agent"
    cfg = parse_domain_config({"name": "agent", "reward": {"kind": "agent", "max_calls_per_episode": 6}})
    assert isinstance(cfg.reward, AgentReward) and cfg.reward.max_calls_per_episode == 6
    assert len(load_problems(cfg, "eval")) == cfg.prompts.n_eval  # type: ignore[union-attr]
    with pytest.raises(ConfigError, match="max_calls_per_turn"):
        parse_domain_config({"name": "agent", "reward": {"kind": "agent", "max_calls_per_turn": 0}})
    with pytest.raises(ConfigError, match="does not match verifier"):
        parse_domain_config({"name": "math", "reward": {"kind": "agent"}})


needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


@needs_bwrap
@pytest.mark.timeout(120)
def test_python_tool_runs_in_the_sandbox() -> None:
    d = AgentDomain(AgentReward(python_tool=True, time_limit_s=2.0))
    p = next(
        p
        for p in d.make_problems("train", 50, seed=0)
        if "answer" in p.meta["check"] and len(p.meta["reads"]) == 2
    )
    env = d.environment(p)
    assert "python" in env.tools
    programs = {
        "print(6 * 7)": "42",
        "x = 1": "",
        "print('a' * 100)": "a" * 50 + "...",
        "import os\nprint(open('/etc/hostname').read() if os.path.exists('/etc/hostname') else 'none')": None,
        "1/0": "error: runtime_error",
        "while True: pass": "error: timeout",
        "import socket\nsocket.create_connection(('127.0.0.1', 5432))\nprint('up')": "error: runtime_error",
    }
    for code, want in programs.items():
        [outcome] = env.step(_call("python", code=code)).outcomes
        if want is None:
            continue
        assert outcome.response.startswith(want), (code, outcome.response)
    # The verifier replays python calls through the sandbox too: a transcript using it is paid.
    a, b = p.meta["reads"]
    fresh = d.environment(p)
    turns = [
        _call("kv_get", key=a) + _call("kv_get", key=b),
        _call("python", code="print(2 + 2)"),
        p.meta["check"]["answer"],
    ]
    text = ""
    for n, turn in enumerate(turns):
        step = fresh.step(turn)
        text += turn + (FMT.env_text(step.responses) if n < len(turns) - 1 else "")
    assert "\n4\n" in text
    assert d.score_batch([p], [text])[0].reason == OK


def test_episode_metrics_over_a_batch() -> None:
    d = AgentDomain()
    problems = d.make_problems("sft", 4, seed=5)
    completions = [p.answer for p in problems[:3]] + ["<tool_call>\nnope\n</tool_call>"]
    metrics = episode_metrics(d.score_with_stats(problems, completions)[1])
    calls = sum(sum(len(m.get("tool_calls", [])) for m in p.meta["trace"]) for p in problems[:3])
    assert metrics["calls_per_episode"] == calls / 4
    assert metrics["malformed_calls_per_episode"] == 1 / 4
    assert metrics["malformed_call_rate"] == 1 / (calls + 1)
    assert episode_metrics([]) == {}


def test_a_sandbox_that_cannot_run_is_infra_error_not_a_response() -> None:
    d = AgentDomain(AgentReward(python_tool=True))
    d.python = PythonTool(SandboxLimits(), "bwrap", BwrapSettings(bwrap="/nonexistent/bwrap"))
    p = d.make_problems("train", 1, seed=0)[0]
    env = d.environment(p)
    with pytest.raises(ToolUnavailable, match="python"):
        env.step(_call("python", code="print(1)"))
    verdict = d.score_batch([p], [_call("python", code="print(1)") + FMT.env_text(["1"]) + "1"])[0]
    assert verdict.reason == INFRA_ERROR
    with pytest.raises(SandboxUnavailable):
        d.prepare()


def test_reward_service_sends_the_python_tool_to_its_workers() -> None:
    from services.reward.batch import Batch
    from services.reward.scoring import DispatchConfig, Dispatcher

    dispatcher = Dispatcher(DispatchConfig(), None, None)  # type: ignore[arg-type]
    p = AgentDomain().make_problems("train", 1, seed=0)[0]

    def heavy(reward: AgentReward | None) -> bool:
        return dispatcher._heavy(Batch(DomainConfig(name="agent", reward=reward), [p], [p.answer]))

    assert [heavy(None), heavy(AgentReward()), heavy(AgentReward(python_tool=True))] == [False, False, True]
