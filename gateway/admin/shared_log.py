"""The fleet's events log as a Redis stream: one entry per event, whichever replica saw it.

A stream rather than a list because it is ordered by the server (the entry id), trimmed to a
bound as it grows (`XADD ... MAXLEN ~ N`), and read newest-first without loading all of it.
An admin action's entry is written in the action's own transaction, so two operators acting
at once through two replicas appear in the order their writes took effect; a replica's own
events (health verdicts, breaker transitions, resumptions) are sent by its forwarder
(`gateway/admin/forwarder.py`) and name the replica that saw them.
"""

from __future__ import annotations

from gateway.observability.events import Event

FIELDS = ("time", "unit", "what", "reason", "who", "replica")


def entry(event: Event, replica: str) -> dict[str, str]:
    """The stream entry for `event`, recorded by `replica` unless the event names one."""
    return {
        "time": repr(event.time),
        "unit": event.unit,
        "what": event.what,
        "reason": event.reason,
        "who": event.who,
        "replica": event.replica or replica,
    }


def parse(fields: dict[bytes, bytes]) -> Event:
    """An entry read back; ValueError or KeyError if it is not one this gateway wrote."""
    text = {k.decode(): v.decode() for k, v in fields.items()}
    return Event(
        float(text["time"]), text["unit"], text["what"], text["reason"], text["who"],
        text.get("replica", ""),
    )  # fmt: skip
