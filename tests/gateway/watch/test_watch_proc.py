"""`unitgate watch` without processes: /proc text parsed and judged (on strings), the tracker
following a process through a /proc tree written by the test, the unit and rank from flags or
LeaderWorkerSet's variables, and the answer read back by the gateway's own probe parser and
verdict."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from gateway.health.kinds.unitgate import parse_health
from gateway.health.verdict import GangVerdict
from gateway.watch.app import answer, failed
from gateway.watch.locate import CmdlineMatch, FixedPid, PidFile, Tracker, lineage
from gateway.watch.placement import Identity, identify
from gateway.watch.proc import Condition, Stat, cmdline_text, judge, parse_stat

# A real line (`cat /proc/self/stat`), with utime 7, stime 5 and starttime 31878.
REAL = (
    "8359 (cat) R 8357 8357 2198 0 -1 4194304 100 0 0 0 7 5 0 0 20 0 1 0 31878 3133440 405 "
    "18446744073709551615 94762499833856 94762499853737 140723154806816 0 0 0 0 0 0 0 0 0 17 "
    "0 0 0 0 0 0 94762499869744 94762499871360 94763276288000 140723154815714 "
    "140723154815734 140723154815734 140723154817003 0\n"
)


def stat_line(
    pid: int, comm: str = "vllm", state: str = "S", ppid: int = 1, start: int = 100
) -> str:
    """A /proc/PID/stat line: `pid (comm) state ppid`, then fields 5-21 and 22 = start."""
    middle = " ".join(["0"] * 9 + ["3", "4"] + ["0"] * 6)  # fields 5-21: utime 3, stime 4
    return f"{pid} ({comm}) {state} {ppid} {middle} {start} 0 0\n"


# ---- parsing


def test_a_real_line() -> None:
    assert parse_stat(REAL) == Stat(8359, "cat", "R", 8357, cpu_ticks=12, start_ticks=31878)


@pytest.mark.parametrize("comm", ["a b", "x) R 1 (y", ")", "((", "tmux: server)"])
def test_a_command_name_holding_spaces_or_parentheses(comm: str) -> None:
    stat = parse_stat(stat_line(42, comm, "T", ppid=7, start=555))
    assert (stat.pid, stat.comm, stat.state, stat.ppid, stat.start_ticks) == (42, comm, "T", 7, 555)
    assert stat.cpu_ticks == 7


@pytest.mark.parametrize(
    "text", ["", "42", "42 (vllm) S 1", "x (vllm) S " + "0 " * 30, "42 vllm) S " + "0 " * 30]
)
def test_what_is_not_a_stat_line(text: str) -> None:
    with pytest.raises(ValueError, match="not /proc/PID/stat"):
        parse_stat(text)


def test_the_command_line_is_its_arguments_joined() -> None:
    raw = b"python3\0-m\0vllm serve\0--headless\0"
    assert cmdline_text(raw) == "python3 -m vllm serve --headless"
    assert cmdline_text(b"") == ""  # a zombie's, or a kernel thread's


# ---- judging


def stat(state: str = "S", start: int = 100) -> Stat:
    return parse_stat(stat_line(42, "vllm", state, start=start))


@pytest.mark.parametrize("state", ["R", "S", "D", "I", "W"])
def test_running_sleeping_or_waiting_is_ok(state: str) -> None:
    assert judge(42, stat(state), 100) == Condition("ok")


@pytest.mark.parametrize(
    ("state", "status", "says"),
    [
        ("Z", "zombie", "has exited and is not reaped yet (state Z)"),
        ("T", "stopped", "is stopped by a signal (SIGSTOP, SIGTSTP), state T"),
        ("t", "stopped", "is stopped by a tracer, state t"),
        ("X", "gone", "is dead (state X)"),
    ],
)
def test_states_that_are_not_ok(state: str, status: str, says: str) -> None:
    condition = judge(42, stat(state), 100)
    assert condition == Condition(status, f"process 42 (vllm) {says}")
    assert not condition.ok
    assert condition.dead is (status in ("gone", "zombie"))


def test_no_such_pid_is_gone() -> None:
    assert judge(42, None, 100) == Condition("gone", "process 42 has exited")


def test_a_reused_pid_is_gone_whatever_runs_under_it_now() -> None:
    condition = judge(42, parse_stat(stat_line(42, "bash", "R", start=900)), 100)
    assert condition == Condition(
        "gone", "process 42 has exited; its pid now belongs to another ('bash')"
    )


def test_a_process_not_seen_before_is_judged_by_its_state_alone() -> None:
    assert judge(42, stat("R", start=900), None).ok


# ---- following a process through /proc (a tree the test writes)


class FakeProc:
    """A /proc of the test's own: `<pid>/stat` and `<pid>/cmdline` files."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir()

    def run(
        self, pid: int, cmdline: str, state: str = "S", start: int = 100, ppid: int = 1
    ) -> None:
        where = self.root / str(pid)
        where.mkdir(exist_ok=True)
        comm = cmdline.split(maxsplit=1)[0]
        where.joinpath("stat").write_text(stat_line(pid, comm, state, ppid, start))
        args = cmdline.replace(" ", "\0").encode() + b"\0"
        where.joinpath("cmdline").write_bytes(b"" if state == "Z" else args)  # a zombie's: empty

    def end(self, pid: int) -> None:
        for name in ("stat", "cmdline"):
            (self.root / str(pid) / name).unlink()
        (self.root / str(pid)).rmdir()


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


def test_a_fixed_pid_is_followed_until_it_is_gone_and_stays_gone(proc: FakeProc) -> None:
    proc.run(42, "vllm serve", start=100)
    tracker = Tracker(FixedPid(42), proc.root)
    first = tracker.look()
    assert (first.pid, first.condition) == (42, Condition("ok"))
    assert first.stat is not None and first.stat.cpu_ticks == 7
    proc.run(42, "vllm serve", "T", start=100)
    assert tracker.look().condition.status == "stopped"
    proc.run(42, "bash", "S", start=500)  # the pid reused by another process
    assert tracker.look().condition.status == "gone"
    proc.end(42)
    assert tracker.look().condition == Condition("gone", "process 42 has exited")


def test_a_fixed_pid_that_is_a_zombie_from_the_start_is_watched_as_one(proc: FakeProc) -> None:
    proc.run(42, "vllm serve", "Z", start=100)
    seen = Tracker(FixedPid(42), proc.root).look()
    assert (seen.pid, seen.condition.status) == (42, "zombie")


def test_nothing_found_yet_says_by_what(proc: FakeProc) -> None:
    tracker = Tracker(PidFile(proc.root / "nowhere.pid"), proc.root)
    assert tracker.look().condition == Condition(
        "gone", f"no process found by --pidfile {proc.root / 'nowhere.pid'}"
    )


def test_a_pidfile_is_reread_when_the_process_is_gone(proc: FakeProc, tmp_path: Path) -> None:
    pidfile = tmp_path / "node.pid"
    pidfile.write_text("42\n")
    proc.run(42, "vllm serve", start=100)
    tracker = Tracker(PidFile(pidfile), proc.root)
    assert (tracker.look().pid, tracker.look().condition.ok) == (42, True)
    proc.run(42, "vllm serve", "Z", start=100)
    assert tracker.look().condition.status == "zombie"
    proc.end(42)
    proc.run(42, "bash", start=700)  # the file still names 42, now another process's pid
    assert tracker.look().condition.status == "gone"
    pidfile.write_text("57\n")
    proc.run(57, "vllm serve", start=800)
    seen = tracker.look()
    assert (seen.pid, seen.condition.ok) == (57, True)


@pytest.mark.parametrize("text", ["", "abc", "-3", "0", "4 2"])
def test_a_pidfile_without_a_pid_names_none(tmp_path: Path, text: str) -> None:
    (tmp_path / "p").write_text(text)
    assert PidFile(tmp_path / "p").find() is None


def test_a_match_takes_the_oldest_live_process_and_finds_a_restarted_one(proc: FakeProc) -> None:
    proc.run(30, "vllm serve --headless", start=300)
    proc.run(31, "python -c vllm worker", start=310)  # a child: younger
    proc.run(20, "vllm serve --headless", "Z", start=100)  # an unreaped earlier run
    proc.run(10, "bash", start=50)
    tracker = Tracker(CmdlineMatch(re.compile(r"vllm"), proc.root), proc.root)
    assert tracker.look().pid == 30
    proc.end(30)
    proc.end(31)
    assert tracker.look().condition.status == "gone"
    proc.run(44, "vllm serve --headless", start=900)
    seen = tracker.look()
    assert (seen.pid, seen.condition.ok) == (44, True)


def test_a_match_leaves_out_its_own_process_and_ancestors(proc: FakeProc) -> None:
    import os

    me = os.getpid()
    proc.run(1, "init", start=1)
    proc.run(5, "sh -c unitgate watch --match vllm", start=10)  # older than the target
    proc.run(me, "unitgate watch --match vllm", start=20, ppid=5)
    proc.run(9, "vllm serve", start=30)
    proc.root.joinpath("5", "stat").write_text(stat_line(5, "sh", "S", 1, 10))
    assert lineage(me, proc.root) == {me, 5, 1}
    assert CmdlineMatch(re.compile("vllm"), proc.root).find() == 9


# ---- which unit and rank

LWS = {
    "LWS_LEADER_ADDRESS": "llama-stock-3.llama-stock.unitgate",
    "LWS_GROUP_SIZE": "2",
    "LWS_WORKER_INDEX": "1",
}


def test_unit_and_rank_from_flags() -> None:
    assert identify("u0", 1, None, {}) == Identity("u0", 1)
    assert Identity("u0", 0).role == "leader" and Identity("u0", 1).role == "follower"


def test_unit_and_rank_from_leaderworkerset() -> None:
    assert identify(None, None, "lws", LWS) == Identity("llama-stock-3", 1)
    assert identify("mine", 1, "lws", LWS) == Identity("mine", 1)  # --unit wins; --rank agrees


@pytest.mark.parametrize(
    ("unit", "rank", "from_env", "env", "says"),
    [
        (None, 1, None, {}, "--unit: required, unless --from-env lws gives it"),
        ("u0", None, None, {}, "--rank: required, unless --from-env lws gives it"),
        ("u0", -1, None, {}, "--rank: must be >= 0, got -1"),
        (" ", 1, None, {}, "--unit: must not be empty"),
        (None, 0, "lws", LWS, "--rank 0 conflicts with LWS_WORKER_INDEX=1"),
        (None, None, "lws", {**LWS, "LWS_WORKER_INDEX": "2"}, "LWS_WORKER_INDEX: must be below"),
        (None, None, "lws", {"LWS_GROUP_SIZE": "2"}, "LWS_LEADER_ADDRESS: not set"),
        (None, None, "lws", {**LWS, "LWS_LEADER_ADDRESS": "10.0.0.7"}, "--unit: required here"),
    ],
)
def test_bad_placement_names_the_flag_or_variable(
    unit: str | None, rank: int | None, from_env: str | None, env: dict[str, str], says: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        identify(unit, rank, from_env, env)


# ---- the answer, read by the gateway's own parser and verdict


def verdict_problem(rank: int, status: int, body: dict[str, object]) -> str | None:
    report = parse_health(status, orjson.dumps(body), 1.0)
    verdict = GangVerdict("u0", ["http://a", "http://b"], fall=2, rise=2, stall_timeout=5.0)
    return verdict._node_problem(rank, report)


def test_an_ok_answer_meets_the_node_contract(proc: FakeProc) -> None:
    proc.run(42, "vllm serve", start=100)
    status, body = answer(Identity("u0", 1), "--pid 42", Tracker(FixedPid(42), proc.root).look())
    assert status == 200
    assert body == {
        "status": "ok",
        "unit": "u0",
        "rank": 1,
        "role": "follower",
        "pid": 42,
        "watched": "--pid 42",
        "comm": "vllm",
        "state": "S",
        "cpu_ticks": 7,
    }
    assert verdict_problem(1, status, body) is None
    assert verdict_problem(0, status, body) == "reports rank 1, expected 0"


def test_a_stopped_process_is_a_503_the_verdict_counts_as_bad(proc: FakeProc) -> None:
    proc.run(42, "vllm serve", "T", start=100)
    status, body = answer(Identity("u0", 1), "--pid 42", Tracker(FixedPid(42), proc.root).look())
    assert (status, body["status"]) == (503, "stopped")
    assert "stopped by a signal" in str(body["error"])
    assert verdict_problem(1, status, body) == "HTTP 503 (status stopped)"


def test_a_gone_process_answers_without_its_stat(proc: FakeProc) -> None:
    proc.run(42, "vllm serve", start=100)
    tracker = Tracker(FixedPid(42), proc.root)
    tracker.look()
    proc.end(42)
    status, body = answer(Identity("u0", 2), "--pid 42", tracker.look())
    assert (status, body["status"], body["pid"], body["rank"]) == (503, "gone", 42, 2)
    assert "cpu_ticks" not in body and body["error"] == "process 42 has exited"


def test_never_found_answers_no_pid(proc: FakeProc) -> None:
    status, body = answer(Identity("u0", 1), "--pid 42", Tracker(FixedPid(42), proc.root).look())
    assert (status, body["status"], body["pid"]) == (503, "gone", None)
    assert body["error"] == "no process found by --pid 42"


def test_a_look_that_raised_is_a_503_naming_the_error() -> None:
    status, body = failed(Identity("u0", 1), "--pid 42", PermissionError(13, "Permission denied"))
    assert (status, body["status"], body["rank"], body["role"]) == (503, "error", 1, "follower")
    assert "Permission denied" in body["error"]
    assert verdict_problem(1, status, body) == "HTTP 503 (status error)"
