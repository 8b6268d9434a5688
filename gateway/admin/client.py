"""A synchronous client of the admin API for the command line (urllib: no event loop needed).

Every failure becomes one `ClientError` whose message an operator can act on, with the exit
code the CLI returns: the gateway's own error message for HTTP errors, the address and the
reason when it cannot be reached.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any

import orjson

ANSWERED_WITH_ERROR = 1
UNREACHABLE = 3


class ClientError(Exception):
    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class AdminClient:
    def __init__(self, base_url: str, token: str, timeout: float, token_env: str) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.token_env = token_env  # named in hints when the gateway refuses the token

    def get(self, path: str, timeout: float | None = None) -> Any:
        return self.request("GET", path, timeout=timeout)

    def post(self, path: str, body: object) -> Any:
        return self.request("POST", path, body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def request(
        self, method: str, path: str, body: object = None, timeout: float | None = None
    ) -> Any:
        """`timeout`: seconds for this request (default: the client's)."""
        data = None if body is None else orjson.dumps(body)
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                return orjson.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise self._http_error(exc) from None
        except urllib.error.URLError as exc:
            raise ClientError(f"cannot reach {self.base_url}: {exc.reason}", UNREACHABLE) from None
        except (TimeoutError, ConnectionError) as exc:
            raise ClientError(f"cannot reach {self.base_url}: {exc}", UNREACHABLE) from None
        except orjson.JSONDecodeError:
            message = f"{self.base_url}{path} did not answer JSON: is this the operator listener?"
            raise ClientError(message, ANSWERED_WITH_ERROR) from None

    def _http_error(self, exc: urllib.error.HTTPError) -> ClientError:
        message = _server_message(exc.read()) or str(exc.reason)
        hint = ""
        if exc.code == 401 and not self.token:
            hint = f" (set {self.token_env} to the admin token)"
        elif exc.code in (401, 403):
            hint = f" (check {self.token_env})"
        return ClientError(f"{exc.code} {exc.reason}: {message}{hint}", ANSWERED_WITH_ERROR)


def _server_message(raw: bytes) -> str:
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw.decode("utf-8", "replace").strip()[:200]
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        return str(payload["error"].get("message", ""))
    return str(payload)[:200]
