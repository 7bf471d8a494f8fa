"""The Responses API through the official `openai` client: whole and streamed answers, every
streamed event checked against the SDK's type for it, `previous_response_id` (continuing the
stored conversation from the prefix cache), structured output, retrieve and delete, the output
cap, bad bodies in OpenAI's error shape; with `tools`, a function-call round trip through
`function_call_output`. Usage: responses_client.py BASE_URL MODEL text|tools"""

import json
import sys

import jsonschema
import openai
from openai.types.responses import Response, ResponseStreamEvent

from shapes import check_events, sse_events

base, model, mode = sys.argv[1], sys.argv[2], sys.argv[3]
c = openai.OpenAI(base_url=f"{base}/v1", api_key="none")


def check_stream(body):
    """Streams `body`, checks every event's shape and order, returns the final response."""
    events = sse_events(f"{base}/v1/responses", dict(body, stream=True))
    kinds = check_events(events, ResponseStreamEvent)
    numbers = [d["sequence_number"] for _, d in events]
    assert numbers == list(range(len(events))), numbers
    assert kinds[:2] == ["response.created", "response.in_progress"], kinds
    assert kinds[-1] in ("response.completed", "response.incomplete"), kinds
    final = Response.model_validate(events[-1][1]["response"])
    deltas = "".join(d["delta"] for _, d in events if d["type"] == "response.output_text.delta")
    assert deltas == final.output_text, (deltas, final.output_text)
    for k in ("response.output_item.added", "response.output_item.done"):
        assert kinds.count(k) == len(final.output), (k, kinds, final.output)
    return kinds, final


def text_mode():
    ask = "What is the capital of France? Answer in one sentence."
    r = c.responses.create(model=model, input=ask, max_output_tokens=16, temperature=0)
    assert r.status == "completed" and "Paris" in r.output_text, r
    assert r.output[0].type == "message" and r.output[0].content[0].type == "output_text", r
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0, r.usage
    Response.model_validate(r.model_dump())

    kinds, streamed = check_stream({"model": model, "input": ask, "max_output_tokens": 16, "temperature": 0})
    assert streamed.output_text == r.output_text, (streamed.output_text, r.output_text)
    for k in ["response.output_item.added", "response.content_part.added", "response.output_text.delta",
              "response.output_text.done", "response.content_part.done", "response.output_item.done"]:
        assert k in kinds, (k, kinds)
    assert kinds.index("response.output_text.done") > kinds.index("response.output_text.delta")

    # The SDK's own stream helper reads the same events.
    with c.responses.stream(model=model, input=ask, max_output_tokens=16, temperature=0) as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        assert text == r.output_text and s.get_final_response().output_text == r.output_text

    # A chained turn continues the stored conversation; its prompt starts from the cache.
    r2 = c.responses.create(model=model, previous_response_id=r.id, input="And of Italy?",
                            max_output_tokens=12, temperature=0)
    assert r2.previous_response_id == r.id and r2.status == "completed", r2
    assert r2.usage.input_tokens > r.usage.input_tokens, (r.usage, r2.usage)
    assert r2.usage.input_tokens_details.cached_tokens > 0, r2.usage
    assert c.responses.retrieve(r2.id).output_text == r2.output_text
    items = c.responses.input_items.list(r2.id)
    assert len(items.data) == 3, items  # the first question, its answer, the second question

    # store=False: answered, not kept.
    gone = c.responses.create(model=model, input="Hi", max_output_tokens=2, store=False)
    try:
        c.responses.retrieve(gone.id)
        raise SystemExit("a response with store=false was kept")
    except openai.NotFoundError:
        pass
    deleted = c.responses.delete(r.id)
    try:
        c.responses.retrieve(r.id)
        raise SystemExit("a deleted response was found")
    except openai.NotFoundError as e:
        assert e.body["message"].startswith("Response with id"), e.body
    try:
        c.responses.create(model=model, previous_response_id=r.id, input="again?", max_output_tokens=2)
        raise SystemExit("a deleted response was continued")
    except openai.NotFoundError as e:
        assert e.body["param"] == "previous_response_id", e.body

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 40},
              "age": {"type": "integer", "minimum": 0, "maximum": 150}},
              "required": ["name", "age"], "additionalProperties": False}
    s = c.responses.create(model=model, input="Ada Lovelace was 36. Give her name and age as JSON.",
                           max_output_tokens=60, temperature=0,
                           text={"format": {"type": "json_schema", "name": "person", "schema": schema, "strict": True}})
    assert s.status == "completed", s
    jsonschema.validate(json.loads(s.output_text), schema)

    short = c.responses.create(model=model, input="Count from one to twenty in words.", max_output_tokens=3)
    assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens", short
    kinds, _ = check_stream({"model": model, "input": "Count from one to twenty in words.", "max_output_tokens": 3})
    assert kinds[-1] == "response.incomplete", kinds

    for bad, param in [({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
                       ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]"),
                       ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
                       ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format"),
                       ({"input": "hi", "frobnicate": 1}, "frobnicate")]:
        try:
            c.responses.create(model=model, **{k: v for k, v in bad.items() if k in ("input", "tools", "max_output_tokens", "text")},
                               extra_body={k: v for k, v in bad.items() if k not in ("input", "tools", "max_output_tokens", "text")})
            raise SystemExit(f"accepted {bad}")
        except openai.BadRequestError as e:
            assert e.body["param"] == param and e.body["type"] == "invalid_request_error", (bad, e.body)


def tools_mode():
    tools = [{"type": "function", "name": "get_weather", "description": "Current weather in a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                             "required": ["city"], "additionalProperties": False}, "strict": True},
             {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}]
    ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    for choice in ["required", {"type": "function", "name": "get_weather"}]:
        r = c.responses.create(model=model, input=ask, tools=tools, tool_choice=choice, max_output_tokens=60, temperature=0)
        calls = [o for o in r.output if o.type == "function_call"]
        assert calls and calls[0].name == "get_weather", r
        assert isinstance(json.loads(calls[0].arguments)["city"], str), r
    kinds, streamed = check_stream({"model": model, "input": ask, "tools": tools, "tool_choice": "required",
                                    "max_output_tokens": 60, "temperature": 0})
    for k in ["response.function_call_arguments.delta", "response.function_call_arguments.done"]:
        assert k in kinds, kinds
    scall = [o for o in streamed.output if o.type == "function_call"][0]
    assert scall.arguments == calls[0].arguments, (scall, calls[0])
    back = ask + [{"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name, "arguments": calls[0].arguments},
                  {"type": "function_call_output", "call_id": calls[0].call_id, "output": json.dumps({"temperature_c": 18})}]
    r2 = c.responses.create(model=model, input=back, tools=tools, tool_choice="none", max_output_tokens=24, temperature=0)
    assert r2.output_text and r2.status in ("completed", "incomplete"), r2
    # The same round trip by chaining: the stored call, then only its output.
    r3 = c.responses.create(model=model, previous_response_id=r.id, tools=tools, tool_choice="none",
                            input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 C"}],
                            max_output_tokens=24, temperature=0)
    assert r3.output_text and r3.usage.input_tokens_details.cached_tokens > 0, r3


text_mode() if mode == "text" else tools_mode()
print("ok")
