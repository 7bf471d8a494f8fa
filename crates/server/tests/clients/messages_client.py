"""The Messages API through the official `anthropic` client: `messages.create`, `messages.stream`
(every raw event checked against the SDK's type for it), stop sequences, `count_tokens`, errors
in Anthropic's shape and `x-api-key`; with `tools`, a `tool_use` / `tool_result` round trip.
Usage: messages_client.py BASE_URL MODEL text|tools API_KEY"""

import json
import sys

import anthropic
from anthropic.types import Message, RawMessageStreamEvent

from shapes import check_events, sse_events

base, model, mode, key = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
c = anthropic.Anthropic(base_url=base, api_key=key)


def check_stream(body):
    events = sse_events(f"{base}/v1/messages", dict(body, stream=True), {"x-api-key": key, "anthropic-version": "2023-06-01"})
    kinds = check_events(events, RawMessageStreamEvent)
    assert kinds[:2] == ["message_start", "ping"] and kinds[-2:] == ["message_delta", "message_stop"], kinds
    starts = [d["index"] for _, d in events if d["type"] == "content_block_start"]
    stops = [d["index"] for _, d in events if d["type"] == "content_block_stop"]
    assert starts == stops == list(range(len(starts))), kinds
    return kinds, events


def text_mode():
    ask = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    m = c.messages.create(model=model, max_tokens=16, messages=ask, extra_body={"temperature": 0})
    Message.model_validate(m.model_dump())
    text = m.content[0].text
    assert "Paris" in text and m.stop_reason in ("end_turn", "max_tokens"), m
    assert m.usage.output_tokens > 0, m.usage

    with c.messages.stream(model=model, max_tokens=16, messages=ask, extra_body={"temperature": 0}) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == text and final.content[0].text == text, (streamed, text)
    assert final.stop_reason == m.stop_reason, final
    # Both reads of the same prompt count the same tokens; the second read it from the cache.
    total = lambda u: u.input_tokens + (u.cache_read_input_tokens or 0)
    assert total(final.usage) == total(m.usage) and final.usage.cache_read_input_tokens > 0, (final.usage, m.usage)
    kinds, events = check_stream({"model": model, "max_tokens": 16, "messages": ask, "temperature": 0})
    assert "content_block_delta" in kinds, kinds

    n = c.messages.count_tokens(model=model, messages=ask)
    assert n.input_tokens == total(m.usage), (n, m.usage)
    sys_n = c.messages.count_tokens(model=model, messages=ask, system=[{"type": "text", "text": "Be brief. " * 40, "cache_control": {"type": "ephemeral"}}])
    assert sys_n.input_tokens > n.input_tokens, (sys_n, n)

    stop = c.messages.create(model=model, max_tokens=40, extra_body={"temperature": 0}, stop_sequences=["Paris"],
                             messages=ask)
    assert stop.stop_reason == "stop_sequence" and stop.stop_sequence == "Paris", stop
    assert "Paris" not in stop.content[0].text, stop
    cap = c.messages.create(model=model, max_tokens=2, messages=ask)
    assert cap.stop_reason == "max_tokens" and cap.usage.output_tokens == 2, cap

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
              "required": ["city"], "additionalProperties": False}
    j = c.messages.create(model=model, max_tokens=40, messages=ask, extra_body={"temperature": 0},
                          output_config={"format": {"type": "json_schema", "schema": schema}})
    assert j.stop_reason == "end_turn", j
    assert isinstance(json.loads(j.content[0].text)["city"], str), j

    # Extended thinking is accepted; a model without reasoning levels answers as it would anyway.
    plain = c.messages.create(model=model, max_tokens=2, messages=ask, extra_body={"temperature": 0})
    for thinking in [{"type": "enabled", "budget_tokens": 1024}, {"type": "disabled"}]:
        t = c.messages.create(model=model, max_tokens=2, messages=ask, thinking=thinking, extra_body={"temperature": 0})
        assert [b.type for b in t.content] == ["text"] and t.content[0].text == plain.content[0].text, (t, plain)

    # A conversation with a system prompt as blocks and an assistant turn.
    m2 = c.messages.create(model=model, max_tokens=8, extra_body={"temperature": 0}, system=[{"type": "text", "text": "You are terse."}],
                           messages=ask + [{"role": "assistant", "content": [{"type": "text", "text": text}]},
                                           {"role": "user", "content": [{"type": "text", "text": "And Italy?", "cache_control": {"type": "ephemeral"}}]}])
    assert m2.content[0].text, m2

    for body, needle in [({"messages": ask}, "max_tokens"),
                         ({"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "image"),
                         ({"max_tokens": 5, "messages": ask, "thinking": {"type": "enabled", "budget_tokens": 100}}, "budget_tokens"),
                         ({"max_tokens": 5, "messages": ask, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]")]:
        try:
            c.post("/v1/messages", cast_to=Message, body=dict(body, model=model))
            raise SystemExit(f"accepted {body}")
        except anthropic.BadRequestError as e:
            assert e.body["type"] == "error" and e.body["error"]["type"] == "invalid_request_error", e.body
            assert needle in e.body["error"]["message"], (needle, e.body)
    try:
        c.messages.create(model="no-such-model", max_tokens=4, messages=ask)
        raise SystemExit("an unknown model was accepted")
    except anthropic.NotFoundError as e:
        assert e.body["error"]["type"] == "not_found_error", e.body
    try:
        anthropic.Anthropic(base_url=base, api_key="wrong").messages.create(model=model, max_tokens=4, messages=ask)
        raise SystemExit("a wrong key was accepted")
    except anthropic.AuthenticationError as e:
        assert e.body["error"]["type"] == "authentication_error", e.body


def tools_mode():
    tools = [{"name": "get_weather", "description": "Current weather in a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                               "required": ["city"], "additionalProperties": False}},
             {"name": "get_time", "input_schema": {"type": "object", "properties": {}}}]
    ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    for choice in [{"type": "any"}, {"type": "tool", "name": "get_weather"}]:
        m = c.messages.create(model=model, max_tokens=60, messages=ask, tools=tools, tool_choice=choice, extra_body={"temperature": 0})
        uses = [b for b in m.content if b.type == "tool_use"]
        assert m.stop_reason == "tool_use" and uses and uses[0].name == "get_weather", m
        assert isinstance(uses[0].input["city"], str) and uses[0].id.startswith("toolu_"), m
    kinds, events = check_stream({"model": model, "max_tokens": 60, "messages": ask, "tools": tools,
                                  "tool_choice": {"type": "any"}, "temperature": 0})
    partial = "".join(d["delta"]["partial_json"] for _, d in events
                      if d["type"] == "content_block_delta" and d["delta"]["type"] == "input_json_delta")
    assert json.loads(partial) == uses[0].input, (partial, uses[0])
    delta = [d for _, d in events if d["type"] == "message_delta"][0]
    assert delta["delta"]["stop_reason"] == "tool_use", delta
    with c.messages.stream(model=model, max_tokens=60, messages=ask, tools=tools, tool_choice={"type": "any"}, extra_body={"temperature": 0}) as s:
        final = s.get_final_message()
    assert [b.input for b in final.content if b.type == "tool_use"] == [uses[0].input], final
    back = ask + [{"role": "assistant", "content": [b.model_dump() for b in m.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id,
                                                "content": [{"type": "text", "text": json.dumps({"temperature_c": 18})}]}]}]
    m2 = c.messages.create(model=model, max_tokens=24, messages=back, tools=tools, tool_choice={"type": "none"}, extra_body={"temperature": 0})
    assert m2.content[0].type == "text" and m2.content[0].text, m2
    n = c.messages.count_tokens(model=model, messages=back, tools=tools)
    assert n.input_tokens > c.messages.count_tokens(model=model, messages=back).input_tokens, n


text_mode() if mode == "text" else tools_mode()
print("ok")
