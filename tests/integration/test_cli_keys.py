"""`unitgate admin keys create|list|revoke` against a real gateway: the secret printed once,
a list without secrets, a revocation the data plane honours, and a bad flag's clear refusal."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from gateway.server import Gateway, running
from tests.integration.test_cli_admin import admin, finished
from tests.support import SimProcess, gateway_config

pytestmark = pytest.mark.usefixtures("admin_tokens")


@pytest.fixture
async def gateway(clean_sim: SimProcess, tmp_path: Path) -> AsyncIterator[Gateway]:
    config = gateway_config(
        clean_sim.units,
        admin={"enabled": True, "state_file": str(tmp_path / "admin.sqlite3")},
        auth={"required": True},
    )
    async with running(config) as gw:
        yield gw


async def keys(gw: Gateway, *args: str) -> tuple[int, str, str]:
    flags = ("--url", gw.metrics_url, "--token-env", "MY_TOKEN")
    return await finished(await admin("keys", *args, *flags))


async def models_status(gw: Gateway, secret: str) -> int:
    headers = {"Authorization": f"Bearer {secret}"}
    async with (
        aiohttp.ClientSession() as http,
        http.get(gw.public_url + "/v1/models", headers=headers) as resp,
    ):
        return resp.status


async def test_create_list_revoke(gateway: Gateway) -> None:
    code, out, err = await keys(gateway, "create", "--tenant", "acme", "--rpm", "60")
    assert code == 0, err
    first, secret, note = out.strip().splitlines()
    key_id = first.split(":")[0]
    assert first == f"{key_id}: tenant acme, active" and secret.startswith("ug-")
    assert "shown this once" in note
    assert await models_status(gateway, secret) == 200
    code, out, err = await keys(gateway, "list")
    assert code == 0, err
    assert key_id in out and "acme" in out and secret not in out
    code, out, err = await keys(gateway, "revoke", key_id)
    assert (code, out.strip()) == (0, f"{key_id}: tenant acme, revoked"), err
    assert await models_status(gateway, secret) == 401
    code, out, err = await keys(gateway, "list", "--json")
    assert [k["state"] for k in json.loads(out)["keys"]] == ["revoked"]


async def test_a_refused_key_is_exit_1_with_the_gateways_message(gateway: Gateway) -> None:
    code, out, err = await keys(gateway, "create", "--tenant", "acme", "--rpm", "-3")
    assert code == 1 and out == ""
    assert "400" in err and "[body].rpm must be a positive integer" in err
    code, _, err = await keys(gateway, "revoke", "key_nope")
    assert code == 1 and "unknown key 'key_nope'" in err
