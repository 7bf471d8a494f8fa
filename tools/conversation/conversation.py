#!/usr/bin/env python3
"""A multi-turn conversation about a source file against any OpenAI-compatible server, as a chat
client holds one: every turn re-sends the whole history, streamed, greedy. Prints, per turn, the
time to the first token, the whole answer's time, the prompt tokens and those the server says it
served from its cache; writes the answers so two servers (or one with its cache off) can be
compared. Standard library only.

    python3 tools/conversation/conversation.py --url http://127.0.0.1:8000 --out a.json
"""

import argparse
import json
import pathlib
import sys
import textwrap
import time
import urllib.request

QUESTIONS = [
    "Here is a Python file.\n\n```python\n{code}\n```\n\nWhat does this module do? Answer briefly.",
    "Which function in it is the most complex, and why?",
    "Suggest one concrete improvement to that function.",
    "Write a one-line docstring for the first function in the file.",
]


def default_code(chars: int) -> str:
    """The first `chars` characters (whole lines) of the standard library's textwrap module."""
    text = pathlib.Path(textwrap.__file__).read_text()
    cut = text[:chars]
    return cut[: cut.rfind("\n")]


def turn(url: str, model, messages: list, max_tokens: int) -> dict:
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if model:
        body["model"] = model
    req = urllib.request.Request(
        url.rstrip("/") + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    started = time.perf_counter()
    first, text, usage, timings = None, [], None, None
    with urllib.request.urlopen(req, timeout=3600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            for choice in chunk.get("choices") or []:
                delta = (choice.get("delta") or {}).get("content")
                if delta:
                    if first is None:
                        first = time.perf_counter() - started
                    text.append(delta)
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
    total = time.perf_counter() - started
    usage = usage or {}
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    if cached is None and timings:
        cached = timings.get("cache_n")  # llama-server's own field
    return {
        "ttft_s": first if first is not None else total,
        "total_s": total,
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": cached,
        "completion_tokens": usage.get("completion_tokens"),
        "answer": "".join(text),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True, help="the server's base URL")
    ap.add_argument("--model", help="the model name to send (none by default)")
    ap.add_argument("--file", help="the source file to talk about (default: textwrap.py)")
    ap.add_argument("--chars", type=int, default=6000, help="characters of the file to send")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--out", help="write the turns as JSON here")
    a = ap.parse_args()
    code = pathlib.Path(a.file).read_text()[: a.chars] if a.file else default_code(a.chars)
    messages, turns = [], []
    for i, q in enumerate(QUESTIONS):
        messages.append({"role": "user", "content": q.format(code=code)})
        t = turn(a.url, a.model, messages, a.max_tokens)
        messages.append({"role": "assistant", "content": t["answer"]})
        turns.append(t)
        print(
            f"turn {i + 1}: time to first token {t['ttft_s']:.2f} s, whole answer {t['total_s']:.2f} s, "
            f"prompt {t['prompt_tokens']} tokens, cached {t['cached_tokens']}, "
            f"{t['completion_tokens']} new",
            flush=True,
        )
    total = sum(t["total_s"] for t in turns)
    print(f"conversation: {total:.1f} s; turns 2-4 time to first token over turn 1's: "
          + ", ".join(f"{t['ttft_s'] / turns[0]['ttft_s']:.1%}" for t in turns[1:]))
    if a.out:
        pathlib.Path(a.out).write_text(json.dumps({"code_chars": len(code), "turns": turns}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
