"""The progress line: rewritten in place on a terminal, whole lines in a log."""

from __future__ import annotations

import asyncio
import io

from loadtest.gen.report import show_progress
from loadtest.gen.shapes import RunState


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


async def run_for(stream: io.StringIO, ticks: int) -> str:
    state = RunState()
    task = asyncio.create_task(show_progress(state, stream, every=0.01, log_every=0.01))
    for _ in range(ticks):
        await asyncio.sleep(0.012)
        state.finished += 1
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    return stream.getvalue()


async def test_a_log_gets_whole_lines_not_carriage_returns() -> None:
    out = await run_for(io.StringIO(), 5)
    lines = out.splitlines()
    assert "\r" not in out and len(lines) >= 2
    assert all(line.startswith("[") and "done" in line for line in lines)
    assert "done 5 " in lines[-1]  # the last line is the final state


async def test_a_terminal_gets_one_line_rewritten() -> None:
    out = await run_for(Terminal(), 5)
    assert out.count("\n") == 1 and out.count("\r") >= 2 and "done 5 " in out.split("\r")[-1]
