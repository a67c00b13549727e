"""schemathesis against the served OpenAPI document: no 5xx, and every response as documented.

Bounded for `make test`: a few examples per operation (derandomized, so a failure reproduces),
positive and negative, against a real server subprocess on its own fresh Postgres schema seeded
with one run, with a write token so the mutating routes are explored past auth. (The loop runs
hypothesis per operation itself: schemathesis' pytest plugin does not load under pytest 9.)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from api_procs import WRITE_TOKEN, fresh_schema, running_api
from api_seed import seed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import positive_data_acceptance

pytestmark = pytest.mark.postgres
MAX_EXAMPLES = 15
CREATE = "POST /api/cascades"
"""A config can match the JSON schema and still be refused by the models' cross-field rules (a
stage's domain must be listed, names unique, teachers earlier...): 422 is right there, so the
"schema-valid data must be accepted" check is off for this one operation."""


@pytest.fixture(scope="module")
def seeded_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, int]]:
    """The server's URL, a seeded cascade's id and its running stage's id."""
    with fresh_schema() as db_url, running_api(db_url, tmp_path_factory.mktemp("fuzz")) as server:
        cascade_id = seed(db_url, running_steps=5, name="fuzz")
        _, detail = server.call("GET", f"/api/cascades/{cascade_id}")
        yield server.url, cascade_id, detail["stages"][-1]["id"]


def test_api_conforms_to_its_openapi(seeded_api: tuple[str, int, int]) -> None:
    api_url, cascade_id, stage_id = seeded_api
    known_ids = {"cascade_id": cascade_id, "stage_id": stage_id}
    schema = schemathesis.openapi.from_url(f"{api_url}/openapi.json")
    headers = {"Authorization": f"Bearer {WRITE_TOKEN}"}
    failures: dict[str, str] = {}
    labels = []
    for result in schema.get_all_operations():
        operation = result.ok()
        labels.append(operation.label)

        strategies = [operation.as_strategy(mode) for mode in GenerationMode]
        known = {k: v for k, v in known_ids.items() if f"{{{k}}}" in operation.path}
        if known:  # also aim at rows that exist, not only at random ids (mostly 404s)
            strategies.append(operation.as_strategy(path_parameters=known))

        @given(case=st.one_of(strategies))
        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        def exercise(case: schemathesis.Case) -> None:
            excluded = [positive_data_acceptance] if case.operation.label == CREATE else None
            case.call_and_validate(base_url=api_url, headers=headers, excluded_checks=excluded)

        try:
            exercise()
        except Exception as err:  # noqa: BLE001 - collect every operation's failure, then report
            failures[operation.label] = str(err)[:2000]
    assert len(labels) == 26, labels  # 23 paths; GET and POST on /api/cascades, GET and DELETE on one
    assert not failures, "\n\n".join(f"{label}:\n{msg}" for label, msg in failures.items())
