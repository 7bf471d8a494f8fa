#!/usr/bin/env python3
"""Replays an editing session against a fill-in-the-middle server, as llama.vim sends it.

    python3 tools/editing_session/replay.py --base-url http://127.0.0.1:8012 \\
        --file HELD_OUT.py --start 40 --lines 20 [--context OTHER.py ...] [--json out.json]

The lines [start, start + lines) of --file are typed one after the other into the file (the
lines above and below them are there already), and a request goes to `/infill` at the start of
each line and after each word typed, built as llama.vim (ggml-org/llama.vim a1c8e6e,
autoload/llama.vim, `s:fim_ctx_local` and `llama#fim`) builds it:

- the cursor's line holds what has been typed of it, the cursor at its end (the rest of the
  line is not written yet); a line typed so far only in whitespace sends an empty `prompt` and
  `n_indent` 0, as llama.vim does for a line full of whitespace;
- `input_prefix`: the `--n-prefix` lines above the cursor's line, each ending in a newline;
- `prompt`: the cursor's line up to the cursor;
- `input_suffix`: the rest of the line (empty), a newline, the `--n-suffix` lines below, a
  newline;
- `input_extra`: the ring of chunks, `--ring-chunks` at most, each `--chunk-lines` lines of the
  --context files in order (llama.vim picks them around the places you visit; here they are
  taken in order, so that runs are comparable), sent first alone with `n_predict: 0` as llama.vim's
  ring update does;
- `n_predict`, `n_indent` (the line's indentation), `top_k` 40, `top_p` 0.90, `samplers`,
  `t_max_prompt_ms`, `t_max_predict_ms` and the `response_fields` llama.vim asks for.

Requests go one at a time (llama.vim waits for one before it sends the next). Each request's
latency is measured at the client; the report has every request, their median, p95 and total,
and, against pld (its /metrics), the output tokens per forward pass. `--temperature 0` makes
runs repeatable (llama.vim leaves it to the server's default). Standard library only.
`pld bench infill` builds the same requests (crates/cli/src/bench/editing.rs).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
import urllib.request
from pathlib import Path

FIELDS = [
    "content",
    "timings/prompt_n",
    "timings/prompt_ms",
    "timings/prompt_per_token_ms",
    "timings/prompt_per_second",
    "timings/predicted_n",
    "timings/predicted_ms",
    "timings/predicted_per_token_ms",
    "timings/predicted_per_second",
    "truncated",
    "tokens_cached",
]


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def metrics(base: str) -> dict[str, float]:
    """pld's counters (empty against a server without /metrics)."""
    try:
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as r:
            text = r.read().decode()
    except Exception:
        return {}
    out = {}
    for line in text.splitlines():
        parts = line.split(" ")
        if len(parts) == 2 and not line.startswith("#"):
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return out


def chunks(files: list[Path], size: int, ring: int) -> list[dict]:
    """The ring: the last `ring` chunks of `size` lines of the files, in order."""
    out = []
    for f in files:
        lines = f.read_text().splitlines()
        for i in range(0, len(lines), size):
            text = "\n".join(lines[i : i + size]) + "\n"
            out.append({"text": text, "time": [0, 0], "filename": str(f)})
    return out[-ring:] if ring > 0 else []


def request(args, above: list[str], line: str, typed: int, below: list[str], extra) -> dict:
    # The editor's line holds the typed part only; whitespace alone counts as nothing typed.
    before = line[:typed]
    if before.strip() == "":
        before, indent = "", 0
    else:
        indent = len(before) - len(before.lstrip(" \t"))
    body = {
        "id_slot": 0,
        # The last n_prefix lines (none for 0, as llama.vim's getline over an empty range).
        "input_prefix": "".join(l + "\n" for l in above[max(0, len(above) - args.n_prefix) :]),
        # The rest of the cursor's line is not typed yet.
        "input_suffix": "\n" + "\n".join(below[: args.n_suffix]) + "\n",
        "input_extra": extra,
        "prompt": before,
        "n_predict": args.n_predict,
        "stop": [],
        "n_indent": indent,
        "top_k": 40,
        "top_p": 0.90,
        "samplers": ["top_k", "top_p", "infill"],
        "stream": False,
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": args.t_max_predict_ms,
        "response_fields": FIELDS,
    }
    if args.temperature is not None:
        body["temperature"] = args.temperature
    if args.model:
        body["model"] = args.model
    return body


def stops(line: str, how: str = "words") -> list[int]:
    """Where requests are sent on a line: its start and after each word ("words"), or halfway
    through each word of two characters or more ("mid-words")."""
    at = [0]
    for w in re.finditer(r"[^ ]+", line):
        if how == "words":
            at.append(w.end())
        elif len(w.group()) >= 2:
            at.append(w.start() + (len(w.group()) + 1) // 2)
    return sorted(set(at))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--file", required=True, type=Path)
    p.add_argument("--start", type=int, default=0, help="first line typed (0-based)")
    p.add_argument("--lines", type=int, default=10)
    p.add_argument("--context", type=Path, nargs="*", default=[])
    p.add_argument("--n-prefix", type=int, default=256)
    p.add_argument("--n-suffix", type=int, default=64)
    p.add_argument("--n-predict", type=int, default=128)
    p.add_argument("--ring-chunks", type=int, default=16)
    p.add_argument("--chunk-lines", type=int, default=64)
    # llama.vim's request at a keystroke sends 250 (its configured 1000 goes with the follow-up
    # request sent in the background once a completion is shown, not replayed here).
    p.add_argument("--t-max-predict-ms", type=int, default=250)
    p.add_argument("--stops", choices=["words", "mid-words"], default="words")
    p.add_argument("--temperature", type=float)
    p.add_argument("--model")
    p.add_argument("--json", type=Path)
    args = p.parse_args()

    base = args.base_url.rstrip("/")
    url = f"{base}/infill"
    lines = args.file.read_text().splitlines()
    typed_lines = lines[args.start : args.start + args.lines]
    tail = lines[args.start + args.lines :]
    extra = chunks(args.context, args.chunk_lines, args.ring_chunks)
    if extra:
        warm = {
            "id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": extra,
            "prompt": "", "n_predict": 0, "temperature": 0.0, "samplers": [], "stream": False,
            "cache_prompt": True, "t_max_prompt_ms": 1, "t_max_predict_ms": 1,
            "response_fields": [""],
        }
        post(url, warm)

    m0 = metrics(base)
    samples = []
    for k, line in enumerate(typed_lines):
        above = lines[: args.start + k]
        for typed in stops(line, args.stops):
            body = request(args, above, line, typed, tail, extra)
            t = time.perf_counter()
            v = post(url, body)
            s = time.perf_counter() - t
            samples.append({
                "line": args.start + k, "typed": typed, "seconds": s,
                "prompt_n": v.get("timings/prompt_n"), "predicted_n": v.get("timings/predicted_n"),
                "tokens_cached": v.get("tokens_cached"), "content": v.get("content"),
            })
            print(f"line {args.start + k:4d} col {typed:3d}: {s * 1e3:8.1f} ms, "
                  f"prefilled {v.get('timings/prompt_n')}, wrote {v.get('timings/predicted_n')}",
                  file=sys.stderr)
    m1 = metrics(base)

    secs = sorted(x["seconds"] for x in samples)
    report = {
        "requests": len(samples),
        "median_s": statistics.median(secs),
        "p95_s": secs[min(len(secs) - 1, int(round(0.95 * (len(secs) - 1))))],
        "total_s": sum(secs),
        "samples": samples,
    }
    steps = m1.get("pld_spec_decode_num_verification_steps_total", 0) - m0.get(
        "pld_spec_decode_num_verification_steps_total", 0)
    tokens = m1.get("pld_generation_tokens_total", 0) - m0.get("pld_generation_tokens_total", 0)
    if steps > 0:
        report["tokens_per_pass"] = tokens / steps
    summary = {k: v for k, v in report.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
