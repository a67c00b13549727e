"""Request dependencies: the engine built once at start-up, units of work, and bearer auth.

Handlers open their own `unit_of_work` so a mutation is committed before the response is
written (and a refused one rolled back). Writers are identified by their token's name, which
becomes the actor of every event they cause.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from cascade.store.db import session_scope
from services.api.settings import ApiLimits, Principal, TokenTable

_bearer = HTTPBearer(auto_error=False, description="A token from the API's settings (role write)")


def get_engine(request: Request) -> Engine:
    return request.app.state.engine  # type: ignore[no-any-return]


def get_limits(request: Request) -> ApiLimits:
    return request.app.state.limits  # type: ignore[no-any-return]


@contextmanager
def unit_of_work(engine: Engine) -> Iterator[Session]:
    with session_scope(engine) as session:
        yield session


def require_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """401 without a valid bearer token (of any role)."""
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "a bearer token is required", headers=challenge)
    tokens: TokenTable = request.app.state.tokens
    principal = tokens.lookup(credentials.credentials)
    if principal is None:
        raise HTTPException(status.HTTP_401_UNAUTHORIZED, "invalid token", headers=challenge)
    return principal


def require_writer(principal: Annotated[Principal, Depends(require_token)]) -> Principal:
    """401 without a valid bearer token, 403 for a read-only one."""
    if principal.role != "write":
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"token {principal.name!r} is read-only")
    return principal


EngineDep = Annotated[Engine, Depends(get_engine)]
WriterDep = Annotated[Principal, Depends(require_writer)]
TokenDep = Annotated[Principal, Depends(require_token)]
LimitsDep = Annotated[ApiLimits, Depends(get_limits)]
