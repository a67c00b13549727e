"""The math answer regression table: golds in the styles of real answer keys (MATH, AIME,
Olympiad, GSM8K), completions the way a policy writes them, each with the verdict it must get.

tests/data/math_answer_table.jsonl, one row a line: `style`, `gold`, `completion`, `expect`
(`ok`, `wrong_answer` or `no_answer`), an optional `note`, and `xfail` with the reason for the
few known-wrong verdicts that are genuinely ambiguous (strict: one that starts passing fails,
so the row gets promoted). Scored through `MathDomain.score_batch`, as training scores them.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cascade.config import MathReward
from cascade.domains.base import NO_ANSWER, OK, WRONG_ANSWER, Problem
from cascade.domains.math import MathDomain

TABLE = Path(__file__).parents[1] / "data" / "math_answer_table.jsonl"
ROWS: list[dict[str, Any]] = [json.loads(line) for line in TABLE.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def domain() -> Any:
    d = MathDomain(MathReward())
    yield d
    d.close()


def _params() -> list[Any]:
    params = []
    for i, row in enumerate(ROWS):
        marks = [pytest.mark.xfail(reason=row["xfail"], strict=True)] if row.get("xfail") else []
        params.append(pytest.param(row, id=f"{i:03d}-{row['style']}-{row['expect']}", marks=marks))
    return params


@pytest.mark.parametrize("row", _params())
def test_answer_table_row(domain: MathDomain, row: dict[str, Any]) -> None:
    problem = Problem(id="math-table", domain="math", prompt="(from the answer key)", answer=row["gold"])
    verdict = domain.score(problem, row["completion"])
    assert (verdict.reason, verdict.reward) == (row["expect"], 1.0 if row["expect"] == OK else 0.0), (
        f"gold {row['gold']!r}, completion {row['completion']!r}: got {verdict} ({row.get('note', '')})"
    )


def test_table_covers_the_answer_key_styles() -> None:
    assert len(ROWS) >= 150
    styles = Counter(row["style"] for row in ROWS)
    assert set(styles) == {"MATH", "AIME", "Olympiad", "GSM8K"}
    expects = Counter(row["expect"] for row in ROWS)
    assert set(expects) == {OK, WRONG_ANSWER, NO_ANSWER}
    assert expects[OK] >= 60 and expects[WRONG_ANSWER] >= 50
    assert sum(1 for row in ROWS if row.get("xfail")) <= 3, "known-wrong rows must stay few"
    assert all(set(row) <= {"style", "gold", "completion", "expect", "note", "xfail"} for row in ROWS)
