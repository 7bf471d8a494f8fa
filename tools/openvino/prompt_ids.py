#!/usr/bin/env python3
"""Turn workload rows into chat-templated token ids for tools/openvino/ttft.py.

pld has no `tokenize` subcommand, so this starts `pld serve` on a free loopback port, renders
each row's first turn through the model's own chat template with vLLM's `POST /tokenize`
(system message + user message + generation prompt), and writes a JSON list of prompts, each a
list of token ids. A sidecar `<out>.meta.json` records where every prompt came from.

    python3 tools/openvino/prompt_ids.py \
        --model ~/.cache/pld/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --rows 11008 11014 --out tools/openvino/prompts-qwen-coder.json

A row spec `A+B+C` joins the first turns of rows A, B and C with a blank line into one user
message (a synthetic long prompt: the workloads have no row near 4,000 tokens).

Standard library only; the server runs with one thread and is stopped at the end.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pld", default=os.path.join(REPO, "target", "release", "pld"))
    ap.add_argument("--model", required=True, help="GGUF path or pld alias (its chat template and tokenizer are used)")
    ap.add_argument("--workload", action="append", help="JSONL in Spec-Bench format (repeatable; default: workloads/grounded-dev.jsonl)")
    ap.add_argument("--rows", nargs="+", required=True, help="question_id per prompt; A+B joins rows into one prompt")
    ap.add_argument("--system", default=QWEN_SYSTEM, help="system message ('' for none; default: Qwen2.5's own default)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    workloads = args.workload or [os.path.join(REPO, "workloads", "grounded-dev.jsonl")]
    rows = {}
    for w in workloads:
        with open(w) as f:
            for line in f:
                if line.strip():
                    r = json.loads(line)
                    rows[str(r["question_id"])] = (os.path.relpath(w, REPO), r)

    port = free_port()
    server = subprocess.Popen(
        [args.pld, "serve", "--model", args.model, "--port", str(port), "--threads", "1", "--max-num-seqs", "1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        for _ in range(300):
            if server.poll() is not None:
                sys.exit(f"pld serve exited: {server.stderr.read().decode(errors='replace')}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            sys.exit("pld serve did not come up")

        prompts, meta = [], []
        for spec in args.rows:
            ids = spec.split("+")
            missing = [i for i in ids if i not in rows]
            if missing:
                sys.exit(f"no row with question_id {missing}")
            text = "\n\n".join(rows[i][1]["turns"][0] for i in ids)
            messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
                {"role": "user", "content": text}
            ]
            tok = post(port, "/tokenize", {"messages": messages, "add_generation_prompt": True})
            prompts.append(tok["tokens"])
            meta.append({
                "rows": [int(i) if i.isdigit() else i for i in ids],
                "workload": sorted({rows[i][0] for i in ids}),
                "category": sorted({rows[i][1]["category"] for i in ids}),
                "synthetic_join": len(ids) > 1,
                "user_chars": len(text),
                "tokens": tok["count"],
            })
            print(f"rows {spec}: {tok['count']} tokens", file=sys.stderr)
    finally:
        server.terminate()
        server.wait(timeout=30)

    with open(args.out, "w") as f:
        json.dump(prompts, f)
        f.write("\n")
    with open(os.path.splitext(args.out)[0] + ".meta.json", "w") as f:
        json.dump({
            "made_by": "tools/openvino/prompt_ids.py (pld serve POST /tokenize with chat messages)",
            "model": args.model,
            "system": args.system,
            "prompts": meta,
        }, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
