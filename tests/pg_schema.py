"""A fresh schema on the local Postgres for one test (or one module's server), dropped after.

Skips when the server is unreachable, unless CASCADE_REQUIRE_POSTGRES=1 (then it fails).
Override the server with CASCADE_TEST_POSTGRES_URL.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

DEFAULT_POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
"""The local server CI starts (trust auth)."""


@contextmanager
def fresh_schema(prefix: str = "test") -> Iterator[str]:
    """A URL whose search_path is a new, empty schema named `<prefix>_<random>`."""
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
    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            sep = "&" if "?" in base else "?"
            yield f"{base}{sep}options=-csearch_path%3D{schema}"
        finally:
            admin.execute(f'DROP SCHEMA "{schema}" CASCADE')
