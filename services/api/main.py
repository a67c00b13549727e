"""`cascade-api` / `python -m services.api.main` / `cascade api serve`: the control plane.

Arguments and settings are parsed before FastAPI, uvicorn and the database driver are
imported, so `--help` and a bad settings file answer at once. Then: wait for the database,
migrate it to the models' schema (Alembic `upgrade head`), and serve REST + the dashboard.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

log = logging.getLogger("cascade.api")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    env = os.environ
    p = argparse.ArgumentParser(prog="cascade-api", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    p.add_argument(
        "--config",
        default=env.get("CASCADE_API_CONFIG"),
        help="settings YAML: database_url, tokens (env CASCADE_API_CONFIG); see docs/control-plane.md",
    )
    p.add_argument(
        "--db",
        default=env.get("CASCADE_API_DB_URL"),
        help="database URL, overrides the settings' database_url (env CASCADE_API_DB_URL)",
    )
    p.add_argument("--no-migrate", action="store_true", help="do not run Alembic at start-up")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    args = p.parse_args(argv)
    if not 0 < args.port < 65536:
        p.error("--port must be in 1..65535")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from services.api.paths import PathRoots
    from services.api.settings import SettingsError, TokenTable, load_settings, with_environment

    try:
        settings = with_environment(load_settings(args.config))
        tokens = TokenTable.from_settings(settings)
        roots = PathRoots.from_settings(settings.paths)
    except SettingsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    url = args.db or settings.database_url
    if not url:
        print("error: no database: pass --db or set database_url in --config", file=sys.stderr)
        return 2

    import uvicorn

    from cascade.store import migrate
    from cascade.store.db import make_engine
    from services.api.app import create_app

    engine = make_engine(url, **_connect_args(url))
    shown = engine.url.render_as_string(hide_password=True)
    try:
        migrate.wait_for_database(engine, timeout_s=settings.db_wait_s)
        if not args.no_migrate:
            migrate.upgrade(engine)
    except migrate.DatabaseUnavailable as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    log.info("database %s at schema revision %s", shown, migrate.current_revision(engine))
    log.info("write/read tokens: %s", tokens.describe())
    log.info("created cascades' paths: %s", roots.describe())
    app = create_app(engine, tokens, settings.limits, roots)
    # uvicorn bounds an idle keep-alive connection (timeout_keep_alive); the body's arrival is
    # bounded by the app (limits.body_timeout_s, services/api/middleware.py)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower(), timeout_keep_alive=5)
    engine.dispose()
    return 0


CONNECT_TIMEOUT_S = 5
"""How long a new connection to Postgres may take (a readiness probe on an unreachable host
answers 503 in that time instead of hanging on the operating system's TCP timeout)."""


def _connect_args(url: str) -> dict[str, object]:
    """`connect_timeout` for a PostgreSQL URL that does not set its own."""
    from cascade.store.db import normalize_url

    parsed = normalize_url(url)
    if parsed.get_backend_name() != "postgresql" or "connect_timeout" in parsed.query:
        return {}
    return {"connect_args": {"connect_timeout": CONNECT_TIMEOUT_S}}


if __name__ == "__main__":
    raise SystemExit(main())
