"""A process's state from the text of /proc/PID/stat, and what that state means for a node.

Pure: the functions take the text (and what was remembered about the process) and return
values, so every state is tested on strings. Reading the files is `locate`'s job.

proc(5): `pid (comm) state ppid ...`, with `comm` in parentheses and free to hold spaces or
parentheses itself, so the fields after it are found from the *last* `)`. Counting fields from
1: 3 state, 4 ppid, 14 utime, 15 stime (clock ticks of CPU), 22 starttime (clock ticks after
boot). A pid alone does not name a process: the kernel reuses pids, so a process is its pid
and its start time.
"""

from __future__ import annotations

from dataclasses import dataclass

# Process states that are not a running (or sleeping, or waiting on I/O) process, and what each
# is called in the node's answer.
_ZOMBIE = "Z"
_DEAD = frozenset("Xx")
_STOPPED = {"T": "stopped by a signal (SIGSTOP, SIGTSTP)", "t": "stopped by a tracer"}


@dataclass(frozen=True, slots=True)
class Stat:
    """The fields of /proc/PID/stat the watch uses."""

    pid: int
    comm: str
    state: str
    ppid: int
    cpu_ticks: int  # utime + stime
    start_ticks: int  # when it started, in clock ticks after boot


@dataclass(frozen=True, slots=True)
class Condition:
    """What the node's answer says: `status` "ok", "gone", "zombie" or "stopped", and why."""

    status: str
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def dead(self) -> bool:
        """Exited (reaped or not): the process will not come back, a successor might."""
        return self.status in ("gone", "zombie")


def parse_stat(text: str) -> Stat:
    """The text of /proc/PID/stat; ValueError when it is not one."""
    head, sep, tail = text.rpartition(")")
    pid_text, open_paren, comm = head.partition(" (")
    fields = tail.split()
    if not sep or not open_paren or len(fields) < 20 or not pid_text.isdigit():
        raise ValueError(f"not /proc/PID/stat text: {text[:80]!r}")
    # fields[0] is field 3 (state): field N is fields[N - 3].
    try:
        utime, stime, start = int(fields[11]), int(fields[12]), int(fields[19])
        ppid = int(fields[1])
    except ValueError:
        raise ValueError(f"not /proc/PID/stat text: {text[:80]!r}") from None
    return Stat(int(pid_text), comm, fields[0], ppid, utime + stime, start)


def judge(pid: int, stat: Stat | None, started: int | None) -> Condition:
    """The condition of process `pid`, given its stat now (None: no such pid) and the start
    time remembered when it was first seen (None: not seen before)."""
    if stat is None:
        return Condition("gone", f"process {pid} has exited")
    if started is not None and stat.start_ticks != started:
        return Condition(
            "gone", f"process {pid} has exited; its pid now belongs to another ({stat.comm!r})"
        )
    name = f"process {pid} ({stat.comm})"
    if stat.state == _ZOMBIE:
        return Condition("zombie", f"{name} has exited and is not reaped yet (state Z)")
    if stat.state in _DEAD:
        return Condition("gone", f"{name} is dead (state {stat.state})")
    if stat.state in _STOPPED:
        return Condition("stopped", f"{name} is {_STOPPED[stat.state]}, state {stat.state}")
    return Condition("ok")


def cmdline_text(raw: bytes) -> str:
    """/proc/PID/cmdline (arguments each ended by NUL) as one line, arguments joined by spaces."""
    return raw.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace")
