"""A harmony model's reasoning and calls (tests/harmony.rs) checked against the official SDKs:
every streamed event of the Responses and Messages APIs parses as the SDK's own type, the whole
answers too, and the SDK clients read the reasoning back.

Usage: harmony_client.py BASE_URL MODEL
"""

import sys

import anthropic
import openai
from anthropic.types import Message, RawMessageStreamEvent
from openai.types.responses import Response, ResponseStreamEvent

from shapes import check_events, sse_events

BASE, MODEL = sys.argv[1], sys.argv[2]
PARAMS = {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
          "required": ["city"], "additionalProperties": False}


def responses():
    tool = {"type": "function", "name": "get_weather", "description": "Weather of a city", "parameters": PARAMS}
    body = {"model": MODEL, "input": "Weather in Paris?", "tools": [tool], "tool_choice": "required",
            "max_output_tokens": 80, "temperature": 0, "reasoning": {"effort": "low"}}
    events = sse_events(f"{BASE}/v1/responses", dict(body, stream=True))
    kinds = check_events(events, ResponseStreamEvent)
    assert "response.reasoning_text.delta" in kinds, kinds
    final = Response.model_validate(events[-1][1]["response"])
    assert [o.type for o in final.output] == ["reasoning", "function_call"], final.output
    client = openai.OpenAI(base_url=f"{BASE}/v1", api_key="none")
    r = client.responses.create(**body)
    assert r.output[0].type == "reasoning" and r.output[0].content[0].text == " ex", r.output
    assert r.output[1].name == "get_weather", r.output


def messages():
    tool = {"name": "get_weather", "description": "Weather of a city", "input_schema": PARAMS}
    body = {"model": MODEL, "max_tokens": 80, "temperature": 0, "tools": [tool], "tool_choice": {"type": "any"},
            "messages": [{"role": "user", "content": "Weather in Paris?"}]}
    events = sse_events(f"{BASE}/v1/messages", dict(body, stream=True))
    kinds = check_events(events, RawMessageStreamEvent)
    assert kinds.count("content_block_start") == 2, kinds
    client = anthropic.Anthropic(base_url=BASE, api_key="none")
    sdk = {k: v for k, v in body.items() if k != "temperature"}
    with client.messages.stream(**sdk, extra_body={"temperature": 0}) as s:
        m = s.get_final_message()
    Message.model_validate(m.model_dump())
    assert [b.type for b in m.content] == ["thinking", "tool_use"], m.content
    assert m.content[0].thinking == " ex" and m.stop_reason == "tool_use", m


def chat():
    client = openai.OpenAI(base_url=f"{BASE}/v1", api_key="none")
    tool = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": PARAMS}}
    body = dict(model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[tool],
                tool_choice="required", max_tokens=80, temperature=0)
    c = client.chat.completions.create(**body)
    assert c.choices[0].message.reasoning_content == " ex", c
    assert c.choices[0].message.tool_calls[0].function.name == "get_weather", c
    reasoning = "".join(getattr(ch.choices[0].delta, "reasoning_content", None) or ""
                        for ch in client.chat.completions.create(stream=True, **body) if ch.choices)
    assert reasoning == " ex", reasoning


responses()
messages()
chat()
print("ok")
