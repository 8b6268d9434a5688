"""Typed errors of the admin API, answered in the OpenAI error shape like the public API.

Operators script against the admin API with the same tooling they use for the public one, so
one error format (`{"error": {"message", "type", "code"}}`) serves both.
"""

from __future__ import annotations

from gateway.config import ConfigError
from gateway.errors import GatewayError


class AdminError(GatewayError):
    type = "invalid_request_error"

    def __init__(self, message: str, *, status: int, code: str, type_: str | None = None) -> None:
        super().__init__(message, code=code)
        self.status = status
        if type_ is not None:
            self.type = type_


class Unauthenticated(AdminError):
    """401: the client did not say who it is; the header tells it how to."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=401, code="missing_token", type_="authentication_error")

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="unitgate-admin"'}


def forbidden(message: str) -> AdminError:
    return AdminError(message, status=403, code="invalid_token", type_="permission_error")


def bad_request(message: str, code: str = "invalid_body") -> AdminError:
    return AdminError(message, status=400, code=code)


def unknown_unit(unit_id: str) -> AdminError:
    return AdminError(f"unknown unit {unit_id!r}", status=404, code="unit_not_found")


def conflict(message: str) -> AdminError:
    return AdminError(message, status=409, code="unit_exists")


class AdminStartError(ConfigError):
    """The admin API cannot start (no token, unreadable state file), so the gateway must not:
    serving with an admin API that silently lost its overrides or its lock is worse."""
