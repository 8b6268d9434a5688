"""Targets, verdicts, the printed tables and health.json.

Every verdict is decided here, once, so the table, the JSON and the exit code cannot
disagree about what was missed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import orjson

from loadtest.bench.health.detect import POLL_S, Trials
from loadtest.bench.health.real import RealTrials
from loadtest.bench.health.scale import SCRAPE_EFFECT_S, Scale
from loadtest.bench.machine import machine_facts
from loadtest.bench.processes import CLK_TCK, Pins

# "Well under one core": the probers of 1,000 units may use at most half of one.
TARGET_PROBER_CORES = 0.5
# Below this share of the expected rate the prober is falling behind, and looks cheap.
MIN_PROBE_RATE_SHARE = 0.9
TARGET_KILL_S = 1.0
TARGET_FREEZE_S = 2.0
TARGET_REAL_S = 1.0  # either fault, on make run's units with streams running
# CPU time of other people's processes on a core we measure on: above this, numbers skew.
OTHER_LOAD_WARN_CORES = 0.05
Row = tuple[str, str, str, str]
DETECT_HEADER = (
    "ms, fault -> seen on /metrics", "min", "median", "p90", "max", "target", "max/target",
    "verdict",
)  # fmt: skip


def machine(pins: Pins | None) -> dict[str, Any]:
    return machine_facts() | {
        "pinned": pins is not None,
        "simulator_and_harness_cpu": None if pins is None else pins.load,
        "gateway_cpu": None if pins is None else pins.relay,
    }


def _verdict(ok: bool, misses: list[str], what: str) -> str:
    if not ok:
        misses.append(what)
    return "ok" if ok else "MISS"


def scale_rows(s: Scale, misses: list[str]) -> list[Row]:
    d = s.derived()
    prober, expected = d["prober_cores"], d["expected_probes_per_s"]
    rate_share = d["probes_per_s"] / expected
    # CPU is counted in 1/CLK_TCK s ticks: an idle gateway may not use a single one.
    idle = (
        f"probing = {d['gateway_cores'] / d['idle_cores']:.1f}x idle"
        if d["idle_cores"]
        else f"not one {1000 / CLK_TCK:g} ms tick"
    )
    return [
        (
            "prober CPU (probing - idle gateway)",
            f"{prober:.3f} core ({prober / TARGET_PROBER_CORES:.2f}x target)",
            f"<= {TARGET_PROBER_CORES:g} core",
            _verdict(prober <= TARGET_PROBER_CORES, misses, "prober CPU"),
        ),
        ("gateway CPU, probing", f"{d['gateway_cores']:.3f} core", "", ""),
        (
            "gateway CPU, idle baseline (health off)",
            f"{d['idle_cores']:.3f} core ({idle})",
            "",
            "",
        ),
        (
            "probes/s (gateway bytes written / head)",
            f"{d['probes_per_s']:.0f} ({rate_share:.3f}x expected {expected:.0f})",
            f">= {MIN_PROBE_RATE_SHARE * expected:.0f}",
            _verdict(rate_share >= MIN_PROBE_RATE_SHARE, misses, "probe rate"),
        ),
        ("probes/s (simulator bytes read / head)", f"{d['sim_probes_per_s']:.0f}", "", ""),
        ("CPU us per probe, prober (net of idle)", f"{d['prober_cpu_us_per_probe']:.1f}", "", ""),
        ("CPU us per probe, gateway (gross)", f"{d['gateway_cpu_us_per_probe']:.1f}", "", ""),
        (
            "simulator CPU (answering the probes)",
            f"{d['sim_cores']:.3f} core, {d['sim_cpu_us_per_probe']:.1f} us/probe",
            "",
            "",
        ),
        (
            "health flips in window (gateway log)",
            f"{s.flips_window} (settling before it: {s.flips_settling})",
            "== 0",
            _verdict(s.flips_window == 0, misses, "health flips in window"),
        ),
        ("health flips since start (/metrics)", f"{s.flips_since_start:g}", "", ""),
        ("probe failures since start", f"{s.failures_since_start:g}", "", ""),
        (
            "nodes probed healthy / units unhealthy, after",
            f"{s.nodes_healthy} / {s.units_unhealthy}",
            f"{s.nodes} / 0",
            _verdict(
                s.nodes_healthy == s.nodes and s.units_unhealthy == 0, misses, "nodes healthy"
            ),
        ),
        (
            "all units healthy, probes at full rate",
            f"after {s.ready_after_s:.1f} s" if s.ready else f"NOT after {s.ready_after_s:.0f} s",
            "before window",
            _verdict(s.ready, misses, "not ready before the window"),
        ),
        (
            "one /metrics scrape: duration",
            f"{s.scrape_s * 1000:.0f} ms (probe timeout 200 ms)",
            "",
            "",
        ),
        (
            f"  then within {SCRAPE_EFFECT_S:g} s: flips, failures",
            f"{s.scrape_flips:g} flips, {s.scrape_failures:g} probe failures",
            "",
            "FINDING" if s.scrape_flips else "",
        ),
        (
            f"  units unhealthy {SCRAPE_EFFECT_S:g} s after it",
            f"{s.scrape_units_unhealthy}",
            "",
            "",
        ),
        *_load_rows(s.cores),
        (
            "other load, busiest second of the window",
            " / ".join(f"{cpu} {peak:.2f}" for cpu, peak in _peaks(s).items()) + " core",
            "",
            "",
        ),
    ]


def _peaks(s: Scale) -> dict[str, float]:
    cpus = s.other_load_timeline[0].keys() if s.other_load_timeline else ()
    return {cpu: max(second[cpu] for second in s.other_load_timeline) for cpu in cpus}


def start_up(s: Scale) -> str:
    """The start-up's flips, and whose CPU was busy meanwhile: the gateway's first connects to
    every node land on one simulator process, whose core can be full for a second or two."""
    busiest = {
        who: max((second[who] for second in s.start_up_cores), default=0.0)
        for who in ("sim", "probing")
    }
    return (
        f"start-up ({s.ready_after_s:.1f} s until every unit was healthy, probes at the full"
        f" rate): {s.flips_start_up} health flips, not counted; busiest second: simulator"
        f" {busiest['sim']:.2f} core, probing gateway {busiest['probing']:.2f} core"
        + (f"; reasons {s.start_up_reasons}" if s.flips_start_up else "")
    )


def flip_onset(s: Scale) -> str:
    """The others' load just before the window's first flip: was the gateway's core taken?"""
    inside = [int(k) for k in s.flip_timeline if 0 <= int(k) < len(s.other_load_timeline)]
    if not inside:
        return ""
    first = min(inside)
    around = s.other_load_timeline[max(0, first - 2) : first + 1]
    return f"first flip {first} s into the window; other load in the seconds up to it: {around}"


def _load_rows(cores: dict[str, dict[str, float]]) -> list[Row]:
    return [
        (
            f"load on {cpu}: ours / other / irq / steal",
            f"{c['ours']:.2f} / {c['other']:.2f} / {c['irq']:.2f} / {c['steal']:.2f} core",
            f"other <= {OTHER_LOAD_WARN_CORES:g}",
            "ok" if c["other"] <= OTHER_LOAD_WARN_CORES else "BUSY",
        )
        for cpu, c in cores.items()
    ]


def busy(cores: dict[str, dict[str, float]]) -> list[str]:
    """Not a miss of the gateway's, but the numbers beside it were taken on a loaded machine."""
    return [
        f"{cpu}: {c['other']:.2f} core used by other processes"
        for cpu, c in cores.items()
        if c["other"] > OTHER_LOAD_WARN_CORES
    ]


def _ms(v: float) -> str:
    return f"{v * 1000:.0f}"


def detect_rows(t: Trials, misses: list[str]) -> list[tuple[str, ...]]:
    summary = t.summary()
    rows: list[tuple[str, ...]] = []
    for name, label, target in (
        ("kill", "SIGKILL follower -> not routable", TARGET_KILL_S),
        ("freeze", "SIGSTOP follower -> not routable", TARGET_FREEZE_S),
        ("recovery", "SIGCONT -> routable again", None),
        ("kill_readmitted", "restart after kill -> routable", None),
    ):
        q = summary[name]
        cells = tuple(_ms(q[k]) for k in ("min", "median", "p90", "max"))
        if target is None:
            rows.append((label, *cells, "", "", "info"))
            continue
        ok = q["max"] <= target
        ratio = f"{q['max'] / target:.2f}x"
        rows.append((label, *cells, f"<= {_ms(target)}", ratio, _verdict(ok, misses, name)))
    trials = len(t.kill) + len(t.freeze)
    down = t.u0_down_flips
    verdict = _verdict(down == trials, misses, "u0 flipped other than once per trial")
    label = "u0 flips to unhealthy (count)"
    rows.append((label, "", "", "", f"{down:g}", f"== {trials}", "", verdict))
    flips = t.bystander_flips
    verdict = _verdict(flips == 0, misses, "bystander u1 flipped")
    rows.append(
        ("u1 health flips (bystander, count)", "", "", "", f"{flips:g}", "== 0", "", verdict)
    )
    return rows


def _table(header: tuple[str, ...], rows: list[Any]) -> None:
    table = [header, *rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:
        cells = [line[0].ljust(widths[0])]
        cells += [c.rjust(w) for c, w in zip(line[1:], widths[1:], strict=True)]
        print("  ".join(cells).rstrip())


def print_scale(s: Scale, rows: list[Row]) -> None:
    print(
        f"\n== Prober scale: {s.units} units x {s.nodes // s.units} nodes, interval"
        f" {s.interval_s:g} s, no request traffic, window {s.window_s:.1f} s"
        f" (after {s.settle_s:g} s settling)"
    )
    _table(("measure", "value", "target", "verdict"), rows)
    print(
        f"probes = bytes the probing gateway wrote / mean probe head ({s.head_bytes:.1f} B);"
        " its only writes while no traffic flows. Prober = probing minus idle gateway. Nothing"
        " scrapes the probing gateway until the window has ended (the scrape after it checks"
        " that rendering, done in a worker thread, disturbs no probe): the gateway runs at"
        " --log-level info and its flip events are counted from its log. other ="
        " CPU time on that core not charged to this benchmark's processes."
    )


def print_detect(t: Trials, rows: list[tuple[str, ...]]) -> None:
    s = t.settings
    print(
        f"\n== Detection: 2 units x 2 nodes, every node its own simulator; interval"
        f" {s['interval']:g} s, timeout {s['timeout']:g} s, fall {s['fall']:g}, rise"
        f" {s['rise']:g}; {len(t.kill)} kill + {len(t.freeze)} freeze trials"
    )
    _table(DETECT_HEADER, rows)
    print(
        f"/metrics polled every {POLL_S * 1000:g} ms; times are when the first scrape showing the"
        " change returned (upper bounds); targets are judged on the max of all trials."
    )
    _table(("load during the trials", "value", "target", "verdict"), _load_rows(t.cores))


def real_rows(t: RealTrials, misses: list[str]) -> list[tuple[str, ...]]:
    """Each fault's spread on `make run`'s units, judged on the max against TARGET_REAL_S."""
    rows: list[tuple[str, ...]] = []
    for fault, label in (("kill", "SIGKILL follower"), ("freeze", "SIGSTOP follower")):
        if not t.times(fault):
            continue
        q = t.summary()[fault]
        cells = tuple(_ms(q[k]) for k in ("min", "median", "p90", "max"))
        ok = q["max"] <= TARGET_REAL_S
        verdict = _verdict(ok, misses, f"make run {fault}")
        ratio = f"{q['max'] / TARGET_REAL_S:.2f}x"
        aim = f"<= {_ms(TARGET_REAL_S)}"
        rows.append((f"{label} -> not routable", *cells, aim, ratio, verdict))
    return rows


def print_real(t: RealTrials, rows: list[tuple[str, ...]]) -> None:
    print(
        f"\n== Detection on make run's units ({t.config}: SmolLM2 gangs of 2 nodes), short"
        f" streams running; {len(t.times('kill'))} kill + {len(t.times('freeze'))} freeze runs,"
        f" {t.streams_completed} streams completed meanwhile"
    )
    _table(DETECT_HEADER, rows)
    for run in t.runs:
        print(f"  {run.fault:6}  {_ms(run.at_s):>5} ms  {run.reason}")


def loud(message: str) -> None:
    print(f"\n*** {message} ***", file=sys.stderr)


def write_json(out: Path, report: dict[str, Any]) -> Path:
    report["machine"]["loadavg_at_end"] = os.getloadavg()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "health.json"
    path.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    return path
