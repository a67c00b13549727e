"""Fixtures shared by the test tree: database URLs for the store tests.

Nothing here connects or imports a driver at import time; a Postgres test connects only when it
asks for `postgres_url`, and gets its own schema, dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
"""The local server CI starts (trust auth). Override with CASCADE_TEST_POSTGRES_URL."""


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cascade.db'}"


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A URL whose search_path is a fresh schema on the local Postgres (dropped after the test).

    Skips when the server is unreachable, unless CASCADE_REQUIRE_POSTGRES=1 (then it fails).
    """
    import psycopg

    base = os.environ.get("CASCADE_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL)
    dsn = base.replace("postgresql+psycopg://", "postgresql://", 1)
    try:
        admin = psycopg.connect(dsn, connect_timeout=3, autocommit=True)
    except psycopg.OperationalError as err:
        reason = f"PostgreSQL unreachable at {dsn}: {str(err).strip().splitlines()[0]}"
        if os.environ.get("CASCADE_REQUIRE_POSTGRES") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    schema = f"test_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            sep = "&" if "?" in base else "?"
            yield f"{base}{sep}options=-csearch_path%3D{schema}"
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture(scope="session")
def random_tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A RANDOM (untrained) tiny Qwen3 model + trained tokenizer: the fast plumbing fixture.

    Built once per session in a couple of seconds; tests must not write into it.
    """
    from cascade.model.build import TinyModelSpec, save_untrained_model

    return save_untrained_model(tmp_path_factory.mktemp("random-tiny-model"), TinyModelSpec(seed=0))


@pytest.fixture(scope="module")
def torch_one_thread() -> Iterator[None]:
    """Run torch on one intra-op thread for this module, then restore the previous setting.

    The tiny model is far too small to gain from threads, and on a small shared machine
    two spinning threads competing with another process make each forward many times slower.
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
