"""Typed errors, so the server can map each to a status code without parsing messages."""

from __future__ import annotations


class SchedulerError(Exception):
    """Base for everything the scheduler raises on purpose."""


class FieldError(SchedulerError, ValueError):
    """A value is out of range; carries the field's name so messages point at the culprit."""

    def __init__(self, field: str, value: object, problem: str) -> None:
        super().__init__(f"{field}={value!r}: {problem}")
        self.field, self.value, self.problem = field, value, problem


class InvalidConfig(FieldError):
    """The operator's scheduler configuration is wrong: fail at start-up."""


class InvalidParams(FieldError):
    """The client's sampling parameters are wrong: a 400, not an engine fault."""


class RequestRejected(SchedulerError, ValueError):
    """`add()` refused a request; nothing was queued."""

    def __init__(self, seq_id: int, problem: str) -> None:
        super().__init__(f"sequence {seq_id}: {problem}")
        self.seq_id, self.problem = seq_id, problem


class EmptyPrompt(RequestRejected):
    """The model needs at least one token to condition on."""

    def __init__(self, seq_id: int) -> None:
        super().__init__(seq_id, "prompt is empty")


class PromptTooLong(RequestRejected):
    """The prompt leaves no room in a KV slot for even one generated token."""

    def __init__(self, seq_id: int, prompt_len: int, limit: int) -> None:
        super().__init__(seq_id, f"prompt has {prompt_len} tokens, at most {limit} fit")
        self.prompt_len, self.limit = prompt_len, limit


class DuplicateSequence(RequestRejected):
    """Two live requests with one id would share state: a bug in the caller."""

    def __init__(self, seq_id: int) -> None:
        super().__init__(seq_id, "id is already waiting or running")


class UnknownSequence(SchedulerError, LookupError):
    """The id is not in the state the operation needs (e.g. preempting a waiting sequence)."""

    def __init__(self, seq_id: int, wanted: str) -> None:
        super().__init__(f"sequence {seq_id} is not {wanted}")
        self.seq_id = seq_id


class GroupTooLarge(RequestRejected):
    """A request's n choices run at once, one KV slot each: more than the unit holds never run."""

    def __init__(self, seq_id: int, n: int, limit: int, what: str) -> None:
        super().__init__(seq_id, f"n={n} needs {n} {what}, this unit has {limit}")
        self.n, self.limit = n, limit
