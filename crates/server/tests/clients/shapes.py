"""Helpers for the client tests: raw Server-Sent Events read with the standard library and each
event checked against the official SDK's own type for it (pydantic, strict about the fields it
requires)."""

import json
import typing
import urllib.request

import pydantic


def sse_events(url, body, headers=None):
    """POSTs `body` and returns the stream's events as (event name, data object) pairs."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers=dict({"content-type": "application/json"}, **(headers or {})))
    events = []
    with urllib.request.urlopen(req, timeout=300) as r:
        assert r.status == 200, r.status
        assert r.headers["content-type"].startswith("text/event-stream"), r.headers
        name = None
        for raw in r:
            line = raw.decode().rstrip("\r\n")
            if line.startswith("event:"):
                name = line[len("event:"):].strip()
            elif line.startswith("data:"):
                events.append((name, json.loads(line[len("data:"):].strip())))
                name = None
    return events


def event_types(union_type):
    """The SDK's event classes by their `type` literal."""
    args = typing.get_args(union_type)
    if args and typing.get_origin(union_type) is typing.Annotated:
        args = typing.get_args(args[0])
    by_type = {}
    for cls in args:
        literal = cls.model_fields["type"].annotation
        for name in typing.get_args(literal):
            by_type[name] = cls
    assert by_type, union_type
    return by_type


def check_events(events, union_type):
    """Every event parses as the SDK's class for its `type`, and its SSE name is its `type`.
    Anthropic's `ping` (which the SDK skips) must be exactly `{"type": "ping"}`."""
    by_type = event_types(union_type)
    for name, data in events:
        assert name == data["type"], (name, data)
        if data["type"] == "ping" and "ping" not in by_type:
            assert data == {"type": "ping"}, data
            continue
        assert data["type"] in by_type, data
        by_type[data["type"]].model_validate(data)
    return [data["type"] for _, data in events]
