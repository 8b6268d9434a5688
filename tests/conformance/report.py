"""The conformance result: the table printed at the end, and the same as JSON and markdown.

The comparison that matters is per test: passed directly but not through the gateway is a
difference the gateway makes, unless `known_differences.txt` names it with the reason (the
docs name the same ones). Tests that fail both ways, or pass only through the gateway, are
counted and listed in the files, not judged.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

KNOWN = Path(__file__).with_name("known_differences.txt")


def known_differences() -> dict[str, str]:
    """`nodeid -- reason` lines (`#` comments and blank lines ignored)."""
    known = {}
    for line in KNOWN.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            nodeid, _, reason = line.partition(" -- ")
            known[nodeid.strip()] = reason.strip()
    return known


def summarize(
    discovered: list[dict[str, Any]],
    results: dict[str, dict[str, dict[str, Any]]],
    meta: dict[str, Any],
) -> dict[str, Any]:
    known = known_differences()
    direct, gateway = results["direct"], results["gateway"]
    ran = sorted(direct)
    passed = {
        mode: {n for n, r in results[mode].items() if r["outcome"] == "passed"} for mode in results
    }
    differences: list[dict[str, Any]] = []
    flaky: list[dict[str, Any]] = []
    for nodeid in ran:
        if nodeid in passed["direct"] and nodeid not in passed["gateway"]:
            outcome = gateway.get(nodeid, {"outcome": "missing", "message": ""})
            entry = {
                "test": nodeid,
                "gateway": outcome["outcome"],
                "first_error_line": outcome["message"],
                "reruns": outcome.get("reruns", []),
                "known": known.get(nodeid, ""),
            }
            (flaky if outcome.get("passed_on_rerun") else differences).append(entry)
    na = [r for r in discovered if r["status"] == "na" and not r["reason"].startswith("not run:")]
    budget = [r for r in discovered if r["status"] == "na" and r["reason"].startswith("not run:")]
    return {
        **meta,
        "counts": {
            "tests_run": len(ran),
            "passed_directly": len(passed["direct"]),
            "passed_through_gateway": len(passed["gateway"]),
            "passed_both_ways": len(passed["direct"] & passed["gateway"]),
            "pass_directly_fail_through_gateway": len(differences),
            "flaky_through_gateway_passed_on_rerun": len(flaky),
            "unexplained_differences": sum(1 for d in differences if not d["known"]),
            "pass_only_through_gateway": len(passed["gateway"] - passed["direct"]),
            "not_applicable": len(na),
            "not_run_time_budget": len(budget),
            "offline_unit_tests_not_run": sum(1 for r in discovered if r["status"] == "offline"),
        },
        "outcomes": {
            mode: dict(Counter(r["outcome"] for r in results[mode].values())) for mode in results
        },
        "differences": differences,
        "flaky_through_gateway": flaky,
        "pass_only_through_gateway": sorted(passed["gateway"] - passed["direct"]),
        "not_applicable": dict(Counter(r["reason"] for r in na).most_common()),
        "not_run_time_budget": sorted(r["nodeid"] for r in budget),
        "tests": {
            n: {"direct": direct[n], "gateway": gateway.get(n, {"outcome": "missing"})} for n in ran
        },
    }


def table(summary: dict[str, Any]) -> str:
    counts = summary["counts"]
    rows = [
        ("tests run both ways", counts["tests_run"]),
        ("passed directly (stock vLLM)", counts["passed_directly"]),
        ("passed through the gateway", counts["passed_through_gateway"]),
        ("passed both ways", counts["passed_both_ways"]),
        ("pass directly, fail through the gateway", counts["pass_directly_fail_through_gateway"]),
        ("  of which not named in known_differences.txt", counts["unexplained_differences"]),
        (
            "failed through the gateway, passed on a rerun",
            counts["flaky_through_gateway_passed_on_rerun"],
        ),
        ("pass only through the gateway", counts["pass_only_through_gateway"]),
        ("not applicable here (not run)", counts["not_applicable"]),
        ("left out: the time budget ran out", counts["not_run_time_budget"]),
        ("offline unit tests (no server; not run)", counts["offline_unit_tests_not_run"]),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"vLLM {summary['vllm']} OpenAI-server tests, directly and through unitgate"]
    lines += [f"  {label:<{width}}  {value:>5}" for label, value in rows]
    for mode, outcomes in summary["outcomes"].items():
        lines.append(
            f"  {mode} outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))
        )
    if summary["differences"]:
        lines.append("\nPass directly, fail through the gateway (first error line):")
        for diff in summary["differences"]:
            known = f"  [known: {diff['known']}]" if diff["known"] else ""
            lines.append(
                f"  {diff['test']}{known}\n      {diff['gateway']}: {diff['first_error_line']}"
            )
    return "\n".join(lines)


def markdown(summary: dict[str, Any]) -> str:
    counts = summary["counts"]
    out = [
        f"# vLLM {summary['vllm']} conformance through unitgate",
        "",
        f"{summary['date']}, unitgate {summary['unitgate']}, {summary['took_s'] / 60:.0f} min "
        f"on {summary['cpus']} CPUs. Model ids rewritten to {summary['model']}.",
        "",
        "| | tests |",
        "|---|---:|",
    ]
    out += [f"| {k.replace('_', ' ')} | {v} |" for k, v in counts.items()]
    out += ["", "## Pass directly, fail through the gateway", ""]
    out += [
        f"- `{d['test']}`: {d['gateway']}: `{d['first_error_line']}`"
        + (f" (known: {d['known']})" if d["known"] else "")
        for d in summary["differences"]
    ] or ["None."]
    out += ["", "## Failed through the gateway, passed on a rerun (flaky)", ""]
    out += [
        f"- `{d['test']}`: first {d['gateway']}: `{d['first_error_line']}`; reruns {d['reruns']}"
        for d in summary["flaky_through_gateway"]
    ] or ["None."]
    out += ["", "## Pass only through the gateway", ""]
    out += [f"- `{t}`" for t in summary["pass_only_through_gateway"]] or ["None."]
    out += ["", "## Not applicable here", ""]
    out += [f"- {n} x {reason}" for reason, n in summary["not_applicable"].items()]
    return "\n".join(out) + "\n"


def write(summary: dict[str, Any], out: Path) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / "result.json", out / "result.md"
    json_path.write_text(json.dumps(summary, indent=1) + "\n")
    md_path.write_text(markdown(summary))
    return json_path, md_path
