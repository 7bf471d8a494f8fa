#!/usr/bin/env python3
"""Closed-loop load on any OpenAI-compatible chat server, so that `pld serve` and another server
(llama-server, vLLM) are measured by the same client: N clients each send their next request as
soon as the last is answered, greedy, not streamed. The prompts are the first turns of workloads
in Spec-Bench's JSONL format (one or more, `--categories` to pick), the categories taken in turn
as `pld bench serve` takes them, each request's prompt starting with its own number so that no
two share a cached prefix, the same for every server. A row with a `schema` asks for its answer
under it (OpenAI's `response_format` of type `json_schema`, which llama-server and vLLM take too),
and the answers are checked against it where the `jsonschema` package is installed. Prints one
line per concurrency level (requests/s, completion tokens/s from the server's `usage`, mean, p50
and p95 latency, schema-valid answers) and, with --out, writes them as JSON. Standard library
only, but for `jsonschema`.

    python3 tools/serve_load/load.py --url http://127.0.0.1:8080 \
        --workload workloads/grounded-dev.jsonl --clients 1,8 --requests 8 --max-tokens 96
"""

import argparse
import json
import sys
import threading
import time
import urllib.request


def first_turns(paths: list, categories: list) -> list:
    """(prompt, schema or None) of every row with turns, the categories taken in turn."""
    by_category = {}
    for path in paths:
        for line in open(path):
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("turns") and (not categories or r["category"] in categories):
                by_category.setdefault(r["category"], []).append((r["turns"][0], r.get("schema")))
    lists = list(by_category.values())
    return [rows[i] for i in range(max(map(len, lists), default=0)) for rows in lists if i < len(rows)]


def valid(schema, text: str):
    """Whether `text` is JSON meeting `schema`; None where jsonschema is not installed."""
    try:
        import jsonschema
    except ImportError:
        return None
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def ask(url: str, model, prompt: str, schema, max_tokens: int) -> tuple:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if schema is not None:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    if model:
        body["model"] = model
    req = urllib.request.Request(
        url.rstrip("/") + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=3600) as resp:
        reply = json.load(resp)
    latency = time.perf_counter() - t0
    text = reply["choices"][0]["message"].get("content") or ""
    checked = None if schema is None else valid(schema, text)
    return latency, reply["usage"]["completion_tokens"], checked


def level(url: str, model, prompts: list, clients: int, requests: int, max_tokens: int) -> dict:
    """`requests` requests (prompts in order, wrapping) over `clients` closed-loop clients."""
    lock = threading.Lock()
    queue = list(range(requests))
    results = []
    errors = []

    def client():
        while True:
            with lock:
                if not queue:
                    return
                i = queue.pop(0)
            prompt, schema = prompts[i % len(prompts)]
            try:
                latency, tokens, checked = ask(url, model, f"[request {i}]\n{prompt}", schema, max_tokens)
            except Exception as e:  # a failed request is reported, not retried
                with lock:
                    errors.append(f"request {i}: {e}")
                continue
            with lock:
                results.append((latency, tokens, checked))

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = sorted(r[0] for r in results)
    tokens = sum(r[1] for r in results)
    checked = [r[2] for r in results if r[2] is not None]
    return {
        "clients": clients,
        "requests": len(results),
        "errors": errors,
        "wall_s": wall,
        "requests_per_s": len(results) / wall,
        "completion_tokens": tokens,
        "tokens_per_s": tokens / wall,
        "mean_latency_s": sum(lat) / max(len(lat), 1),
        "p50_latency_s": lat[max(0, -(-len(lat) // 2) - 1)] if lat else None,
        "p95_latency_s": lat[min(len(lat) - 1, int(0.95 * len(lat)))] if lat else None,
        "schema_answers": len(checked),
        "schema_valid_share": sum(checked) / len(checked) if checked else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--model", default=None, help="the request's model field, if the server wants one")
    ap.add_argument("--workload", required=True, action="append", help="repeatable")
    ap.add_argument("--categories", default="", help="only these categories, comma-separated")
    ap.add_argument("--clients", default="1,8", help="concurrency levels, comma-separated")
    ap.add_argument("--requests", type=int, default=8, help="requests per level")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--out", help="write the levels as JSON here")
    args = ap.parse_args()
    prompts = first_turns(args.workload, [c for c in args.categories.split(",") if c])
    if not prompts:
        print(f"{args.workload}: no rows with turns of the categories asked", file=sys.stderr)
        return 2
    levels = []
    for c in [int(x) for x in args.clients.split(",")]:
        r = level(args.url, args.model, prompts, c, args.requests, args.max_tokens)
        levels.append(r)
        p95 = "-" if r["p95_latency_s"] is None else f"{r['p95_latency_s']:.2f}"
        print(
            f"clients {c}: {r['requests_per_s']:.2f} req/s, {r['tokens_per_s']:.1f} tok/s, "
            f"mean {r['mean_latency_s']:.2f} s, p50 {r['p50_latency_s'] or 0:.2f} s, p95 {p95} s, "
            f"{r['completion_tokens']} tokens, schema-valid {r['schema_valid_share']} of "
            f"{r['schema_answers']}, {len(r['errors'])} errors",
            flush=True,
        )
        for e in r["errors"][:3]:
            print("  " + e, file=sys.stderr)
    if args.out:
        json.dump({"url": args.url, "workload": args.workload, "levels": levels}, open(args.out, "w"), indent=1)
    return 1 if any(r["errors"] for r in levels) else 0


if __name__ == "__main__":
    sys.exit(main())
