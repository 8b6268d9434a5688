"""docs/metrics.md documents every `unitgate_*` family a live gateway exports, and no family
that is gone.

A real gateway (probers and breakers on, as in production) runs in front of simulated units;
streamed and non-streamed requests give the labelled families their samples; the operator
listener's /metrics is scraped. The page's convention, stated at its top: a family is
documented by a table row whose first cell names it in backticks (counters with `_total`,
histograms by their base name); rows under the heading "Only in some setups" need not appear in
every scrape.
"""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp

from gateway.server import running
from tests.support import SimProcess, chat_body, gateway_config, until_routable

PAGE = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
OPTIONAL_HEADING = "## Only in some setups"
TYPE_LINE = re.compile(r"^# TYPE (unitgate_\w+) (\w+)\s*$", re.MULTILINE)
FIRST_CELL = re.compile(r"^\|([^|]*)\|")
NAME = re.compile(r"`(unitgate_\w+)`")
SUFFIX = {"counter": "_total", "info": "_info"}


def exported_families(exposition: str) -> set[str]:
    """The `unitgate_*` families of a text or OpenMetrics exposition, counters as
    `<name>_total` and infos as `<name>_info`, without the `<name>_created` companions
    prometheus_client adds to its counters in the text format."""
    names = set()
    for name, kind in TYPE_LINE.findall(exposition):
        suffix = SUFFIX.get(kind, "")  # OpenMetrics names a family without its sample suffix
        names.add(name if name.endswith(suffix) else name + suffix)
    return {n for n in names if not (n.endswith("_created") and f"{n[:-8]}_total" in names)}


def documented_families(markdown: str) -> tuple[set[str], set[str]]:
    """(families every scrape must have, families only some setups export) from the tables."""
    required: set[str] = set()
    optional: set[str] = set()
    target = required
    for line in markdown.splitlines():
        if line.startswith("#"):
            target = optional if line.strip() == OPTIONAL_HEADING else required
        elif cell := FIRST_CELL.match(line):
            target.update(NAME.findall(cell[1]))
    return required, optional


def problems(exposition: str, markdown: str) -> list[str]:
    exported = exported_families(exposition)
    required, optional = documented_families(markdown)
    found = []
    for name in sorted(exported - required - optional):
        found.append(f"{name} is exported but not documented in docs/metrics.md")
    for name in sorted(required - exported):
        found.append(
            f"{name} is documented in docs/metrics.md but not exported "
            f'(gone, or list it under "{OPTIONAL_HEADING[3:]}")'
        )
    return found


async def scrape(sim: SimProcess) -> str:
    config = gateway_config(
        sim.units, health={"enabled": True}, breaker={"enabled": True}, resume={"enabled": True}
    )
    timeout = aiohttp.ClientTimeout(total=20)
    async with running(config) as gw, aiohttp.ClientSession(timeout=timeout) as http:
        await until_routable(gw)
        for stream in (True, False, True):
            body = chat_body(
                stream=stream, stream_options={"include_usage": True} if stream else None
            )
            body = {k: v for k, v in body.items() if v is not None}
            async with http.post(gw.public_url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 200, await resp.text()
                await resp.read()
        async with http.get(gw.metrics_url + "/metrics") as resp:
            assert resp.status == 200
            return await resp.text()


async def test_every_exported_family_is_documented_and_every_documented_one_exported(
    sim: SimProcess,
) -> None:
    exposition = await scrape(sim)
    assert len(exported_families(exposition)) > 20, exposition[:2000]
    found = problems(exposition, PAGE.read_text(encoding="utf-8"))
    assert not found, "\n".join(found)


def test_the_check_sees_a_missing_row_a_stale_row_and_the_optional_section() -> None:
    page = PAGE.read_text(encoding="utf-8")
    required, _ = documented_families(page)
    assert {"unitgate_requests_total", "unitgate_node_engine_pending"} <= required
    exposition = "".join(
        f"# TYPE {n.removesuffix('_total')} counter\n"
        if n.endswith("_total")
        else f"# TYPE {n} gauge\n"
        for n in sorted(required)
    )
    assert problems(exposition, page) == []
    cut = "\n".join(line for line in page.splitlines() if "`unitgate_queue_depth`" not in line)
    assert problems(exposition, cut) == [
        "unitgate_queue_depth is exported but not documented in docs/metrics.md"
    ]
    extra = page.replace("## Requests\n", "## Requests\n\n| `unitgate_gone_total` | counter | |\n")
    assert problems(exposition, extra)[0].startswith("unitgate_gone_total is documented")
    optional = page + f"\n{OPTIONAL_HEADING}\n\n| `unitgate_sometimes` | gauge | |\n"
    assert problems(exposition, optional) == []
    created = exposition + "# TYPE unitgate_requests_created gauge\n"
    assert problems(created, page) == []


def test_family_names_read_alike_from_text_and_openmetrics() -> None:
    text = "# TYPE unitgate_requests_total counter\n# TYPE unitgate_requests_created gauge\n"
    openmetrics = "# TYPE unitgate_requests counter\n# TYPE unitgate_build info\n# EOF\n"
    assert exported_families(text) == {"unitgate_requests_total"}
    assert exported_families(openmetrics) == {"unitgate_requests_total", "unitgate_build_info"}
