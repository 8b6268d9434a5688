"""JSON Schemas of the admin API's rollouts (gateway/rollout/), in the style of schemas.py;
openapi.py puts them in the document with their paths."""

from __future__ import annotations

from typing import Any

from gateway.admin.schemas import CELL, Schema, obj, of, ref, strings

STATES = ["running", "paused", "succeeded", "rolled_back", "aborted"]
OUTCOMES = ["pass", "wait", "fail"]
NUMBERS = of("object", additionalProperties=of("number"))

GATE = obj(
    {
        "gate": of("string", examples=["errors", "breaks", "ttft", "tpot", "finish", "golden"]),
        "outcome": of(
            "string", "wait: too few samples yet (it never passes on none).", enum=OUTCOMES
        ),
        "figures": NUMBERS,
        "reason": of("string", "One sentence naming the figures."),
    },
    about="A gate's last verdict.",
)

PERCENTS = of("array", items=of("integer", minimum=1, maximum=100), minItems=1)

NEW_ROLLOUT = obj(
    {
        "to": of("string", "The revision to roll out.", maxLength=128),
        "from": of(
            "string", "The revision replaced (default: the one the cells serve).", maxLength=128
        ),
        "cells": of(
            "array",
            "Cells in order (default: every cell serving `from`, by name).",
            items=of("string", pattern=CELL),
            minItems=1,
        ),
        "steps": {**PERCENTS, "description": "Increasing percentages, ending at 100."},
        "step_seconds": of("number", exclusiveMinimum=0),
        "ready_timeout": of(
            "number", "Seconds to wait for a cell's new units.", exclusiveMinimum=0
        ),
        "gates": of(
            "object",
            "[rollout.gates] settings to change for this rollout.",
            additionalProperties=of("number"),
        ),
        "golden": of(
            "array", "Golden prompts (docs/rollouts.md).", items=of("object"), maxItems=20
        ),
        "hooks": strings("Names of [rollout.hooks] tables."),
        "resume_across": of(
            "boolean",
            "Whether a stream broken on a new unit may resume on an "
            "old one (false when the tokenizer changes).",
        ),
        "reason": of("string"),
    },
    "from",
    "cells",
    "steps",
    "step_seconds",
    "ready_timeout",
    "gates",
    "golden",
    "hooks",
    "resume_across",
    "reason",
)

SPEC: Schema = {
    **obj(
        {
            "to": of("string"),
            "from": of("string"),
            "cells": strings(),
            "steps": PERCENTS,
            "step_seconds": of("number"),
            "ready_timeout": of("number"),
            "gates": NUMBERS,
            "golden": of("array", items=of("object")),
            "hooks": strings(),
            "resume_across": of("boolean"),
            "reason": of("string"),
        }
    ),
    "description": "The ask, with every default filled in.",
}

ROLLOUT = obj(
    {
        "id": of("string"),
        "state": of("string", enum=STATES),
        "from": of("string"),
        "to": of("string"),
        "cells": strings("In order."),
        "cell": of(["string", "null"], "The cell being moved (null once it ended)."),
        "step": of(
            ["integer", "null"], "Index into `steps`; null while the cell's units are awaited."
        ),
        "steps": PERCENTS,
        "share": of(
            "number", "Of the cell's conversations on the new revision.", minimum=0, maximum=1
        ),
        "gates": of("array", items=ref("Gate")),
        "reason": of("string", "Why it is in its state: the failed gate and its figures, ..."),
        "who": of("string"),
        "started": of("number", "Unix time."),
        "since": of("number", "Unix time the current phase began."),
        "ended": of(["number", "null"]),
        "drained": strings("Old units it drained (enabled again on a rollback)."),
        "spec": ref("RolloutSpec"),
        "note": of("string", "Said on start: what a restart of the gateway would do to it."),
    },
    "note",
    about="A rollout: where it is, and each gate's last verdict.",
)

ROLLOUT_LIST = obj({"rollouts": of("array", "Newest first.", items=ref("Rollout"))})

VERDICT = obj(
    {
        "id": of("string"),
        "state": of("string", enum=STATES),
        "verdict": of(
            "string",
            "fail once a gate failed or it rolled back; pass once every gate "
            "of the last look passed or it succeeded.",
            enum=OUTCOMES,
        ),
        "gates": of("array", items=ref("Gate")),
        "reason": of("string"),
    },
    about="For another tool's analysis (Argo Rollouts' web metric, a Flagger webhook).",
)

SCHEMAS: dict[str, Schema] = {
    "Gate": GATE,
    "NewRollout": NEW_ROLLOUT,
    "RolloutSpec": SPEC,
    "Rollout": ROLLOUT,
    "RolloutList": ROLLOUT_LIST,
    "Verdict": VERDICT,
}


def rollout_paths(operation: Any, auth: tuple[str, ...], write: tuple[str, ...]) -> dict[str, Any]:
    """The rollouts' paths, built with openapi.py's `operation`."""
    current = "/admin/rollouts/current"
    steer = {
        "pause": "Hold at the current step; the hard guards still judge.",
        "resume": "Carry on; the step starts over on fresh samples.",
        "abort": "Roll back now.",
    }
    replicas = (
        " Through a replica that does not drive the rollout, the ask is passed to the one"
        " that does, and answered once it is done."
    )
    found: dict[str, Any] = {
        "/admin/rollouts": {
            "get": operation(
                "List the rollouts",
                ("200", "The current one and those before it.", ref("RolloutList")),
                auth,
                tag="rollouts",
                operationId="listRollouts",
            ),
            "post": operation(
                "Start a rollout",
                ("201", "The rollout, started.", ref("Rollout")),
                ("400", *write, "409"),
                about="One at a time: a second start is a 409 naming the running one.",
                tag="rollouts",
                operationId="startRollout",
                requestBody={
                    "required": True,
                    "content": {"application/json": {"schema": ref("NewRollout")}},
                },
            ),
        },
        current: {
            "get": operation(
                "Show the current rollout",
                ("200", "The running rollout, or the last one.", ref("Rollout")),
                (*auth, "404"),
                tag="rollouts",
                operationId="getRollout",
            )
        },
        f"{current}/verdict": {
            "get": operation(
                "The gates' verdict",
                ("200", "pass, wait or fail, with the gates' figures.", ref("Verdict")),
                (*auth, "404"),
                tag="rollouts",
                operationId="getRolloutVerdict",
            )
        },
    }
    for verb, about in steer.items():
        found[f"{current}/{verb}"] = {
            "post": operation(
                f"{verb.capitalize()} the rollout",
                ("200", "The rollout after it.", ref("Rollout")),
                (*write, "404"),
                about=about + replicas,
                tag="rollouts",
                operationId=f"{verb}Rollout",
            )
        }
    return found
