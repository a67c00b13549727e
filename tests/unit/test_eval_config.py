"""Eval config per stage (metrics, samples, sampling) and the advance rule's watched metric:
valid forms parse, and every bad one fails with the field path and the reason."""

from __future__ import annotations

from typing import Any

import pytest

from cascade.config import ConfigError, parse_cascade_config, parse_watched_metric
from cascade.eval.results import DomainEval, MetricValue


def _cfg(
    eval_: dict[str, Any] | None = None, advance: dict[str, Any] | None = None, second: dict | None = None
) -> dict[str, Any]:
    """if -> math; `eval_` for both stages unless `second` (the math stage's) is given."""
    return {
        "name": "unit",
        "model": {"path": "/nonexistent/model"},
        "domains": [{"name": "if"}, {"name": "math"}],
        "stages": [
            {"domain": "if", "eval": eval_ or {}, "advance": advance or {}},
            {"domain": "math", "eval": (eval_ or {}) if second is None else second},
        ],
    }


def _error(data: Any) -> str:
    with pytest.raises(ConfigError) as err:
        parse_cascade_config(data, "bad.yaml")
    return str(err.value)


def test_defaults_are_greedy_only() -> None:
    stage = parse_cascade_config(_cfg()).stages[0]
    assert (stage.eval.metrics, stage.eval.samples, stage.eval.primary) == (["greedy"], 1, "greedy")
    assert stage.advance.metric == "eval/{domain}"


def test_sampled_metrics_and_watched_metric_parse() -> None:
    cfg = parse_cascade_config(
        _cfg(
            {"samples": 8, "temperature": 0.6, "top_p": 0.95, "metrics": ["greedy", "avg@8", "pass@4"]},
            {"metric": "eval/{domain}/pass@4", "threshold": 0.5},
        )
    )
    assert cfg.stages[0].eval.metrics == ["greedy", "avg@8", "pass@4"]
    assert parse_watched_metric(cfg.stages[0].advance.metric) == ("{domain}", "pass@4")
    assert parse_watched_metric("eval/math") == ("math", None)


@pytest.mark.parametrize(
    ("eval_", "advance", "second", "expected"),
    [
        ({"metrics": ["best@4"], "samples": 4}, None, None, "unknown eval metric 'best@4'"),
        ({"metrics": ["pass@0"]}, None, None, "unknown eval metric 'pass@0'"),
        ({"metrics": ["pass@4"], "samples": 2}, None, None, "k=4 samples but eval.samples is 2"),
        ({"metrics": ["greedy", "greedy"]}, None, None, "listed twice"),
        ({"metrics": []}, None, None, "stages.0.eval.metrics"),
        ({"temperature": 0}, None, None, "stages.0.eval.temperature"),
        (None, {"metric": "reward/if"}, None, "not of the form eval/<domain>[/<metric>]"),
        (None, {"metric": "eval/{domain}/top@3"}, None, "'top@3' is not greedy, avg@k or pass@k"),
        (None, {"metric": "eval/code"}, None, "stages.0.advance.metric: domain 'code' is not in domains"),
        (None, {"metric": "eval/{domain}/pass@2"}, None, "'pass@2' is not in stages.0.eval.metrics"),
        ({"metrics": ["avg@2"], "samples": 2}, None, {}, "stages.1.eval.metrics starts with 'greedy'"),
    ],
)
def test_bad_eval_configs_name_the_field(eval_: Any, advance: Any, second: Any, expected: str) -> None:
    assert expected in _error(_cfg(eval_, advance, second))


def test_domain_eval_metric_lookup() -> None:
    m = {
        "greedy": MetricValue(0.25, 0.1, 0.4, 16, "wilson"),
        "pass@2": MetricValue(0.5, 0.3, 0.7, 16, "bootstrap"),
    }
    result = DomainEval("math", 0.25, 16, {}, m, "greedy")
    assert (result.metric(None), result.metric("greedy"), result.metric("pass@2")) == (0.25, 0.25, 0.5)
    with pytest.raises(KeyError, match="no metric 'avg@4'"):
        result.metric("avg@4")


def test_runner_feeds_the_watched_metric_to_the_advance_rule() -> None:
    """`CascadeRunner._watched_value` reads `advance.metric` from the latest evals."""
    from types import SimpleNamespace

    from cascade.runner.loop import CascadeRunner

    def result(domain: str, greedy: float, p2: float) -> DomainEval:
        metrics = {
            "greedy": MetricValue(greedy, 0.0, 1.0, 16, "wilson"),
            "pass@2": MetricValue(p2, 0.0, 1.0, 16, "bootstrap"),
        }
        return DomainEval(domain, greedy, 16, {}, metrics, "greedy")

    cfg = parse_cascade_config(
        _cfg({"samples": 2, "metrics": ["greedy", "pass@2"]}, {"metric": "eval/{domain}/pass@2"})
    )
    runner = SimpleNamespace(_last_evals={"if": result("if", 0.25, 0.5), "math": result("math", 0.75, 0.9)})
    watched = CascadeRunner._watched_value
    assert watched(runner, cfg.stages[0]) == 0.5  # type: ignore[arg-type]
    assert watched(runner, cfg.stages[1]) == 0.75  # type: ignore[arg-type]  # default: primary score
    advance = cfg.stages[0].advance.model_copy(update={"metric": "eval/math"})
    other = cfg.stages[0].model_copy(update={"advance": advance})
    assert watched(runner, other) == 0.75  # type: ignore[arg-type]
    assert watched(SimpleNamespace(_last_evals={}), cfg.stages[0]) == 0.0  # type: ignore[arg-type]
