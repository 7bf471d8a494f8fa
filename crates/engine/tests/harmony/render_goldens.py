#!/usr/bin/env python3
"""Golden renderings of gpt-oss's chat template (openai-gpt-oss-120b.jinja, copied from
llama.cpp's models/templates; the same as gpt-oss-20b's), for `chat::harmony_tests`.

Renders each conversation of `cases.json` with Jinja2 set up as Hugging Face transformers sets it
up for `apply_chat_template` (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, `tojson` = `json.dumps(ensure_ascii=False)`, `raise_exception`, `strftime_now`),
with the date fixed to the placeholder the Rust test substitutes, and writes `<name>.txt`.
The messages are given as pld's `engine::Message` serializes them (`content` always present,
`tool_calls`, `thinking` only when set).

Run:  python3 crates/engine/tests/harmony/render_goldens.py   (needs jinja2)
"""

import json
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = Path(__file__).resolve().parent
DATE = "{DATE}"


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: DATE
    template = env.from_string((HERE / "openai-gpt-oss-120b.jinja").read_text())
    cases = json.loads((HERE / "cases.json").read_text())
    for case in cases:
        kwargs = dict(
            messages=case["messages"],
            tools=case.get("tools") or None,
            add_generation_prompt=case["add_generation_prompt"],
            bos_token="<|startoftext|>",
            eos_token="<|return|>",
        )
        if "reasoning_effort" in case:
            kwargs["reasoning_effort"] = case["reasoning_effort"]
        out = template.render(**kwargs)
        (HERE / f"{case['name']}.txt").write_text(out)
        print(case["name"], len(out))


if __name__ == "__main__":
    main()
