"""A restart of `pld serve --prefix-cache-dir`, timed as a user meets it: a long prompt sent cold,
the server killed, started again over the same directory, and the same prompt sent again. Prints
(and writes with --out) each request's prompt and cached tokens, time to first token and output,
and checks that the warm output equals the cold one.

    python3 tools/prefix_cache/restart.py --pld target/release/pld --model qwen-coder-1.5b \
        --tokens 16000 --threads 2 --out docs/bench/agents/restart-16k.json
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(a, cache_dir, log):
    port = free_port()
    cmd = [a.pld, "serve", "--model", a.model, "--port", str(port), "--threads", str(a.threads),
           "--prefix-cache-dir", cache_dir]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(log, "w"), env=dict(os.environ, RUST_LOG="info"))
    base = f"http://127.0.0.1:{port}"
    t0 = time.time()
    while True:
        try:
            urllib.request.urlopen(base + "/health", timeout=1).read()
            # The engine thread times its passes once before its first request: wait for that
            # with a one-token request, so that the timed request meets a ready server.
            complete(base, "Hi", 1)
            return p, base, time.time() - t0
        except OSError:
            if p.poll() is not None or time.time() - t0 > 600:
                sys.exit(f"the server did not start; see {log}")
            time.sleep(0.2)


def tokens_of(base, text):
    req = urllib.request.Request(base + "/tokenize", data=json.dumps({"prompt": text}).encode(),
                                 headers={"Content-Type": "application/json"})
    return len(json.loads(urllib.request.urlopen(req).read())["tokens"])


def complete(base, prompt, max_tokens):
    """Streams a greedy completion: (time to first token, total time, text, usage)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    first, text, usage = None, "", None
    with urllib.request.urlopen(req, timeout=3600) as r:
        for line in r:
            line = line.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            if ev.get("usage"):
                usage = ev["usage"]
            for c in ev.get("choices", []):
                if c.get("text"):
                    first = first or time.time() - t0
                    text += c["text"]
    return first, time.time() - t0, text, usage


def document(n_tokens, base):
    """Source files of this repository, whole, until about n_tokens, and a question."""
    parts, files = [], []
    for d in ["crates/engine/src", "crates/server/src", "crates/drafting/src", "crates/cli/src"]:
        for dirpath, _, names in sorted(os.walk(os.path.join(ROOT, d))):
            files += [os.path.join(dirpath, n) for n in sorted(names) if n.endswith(".rs")]
    text = ""
    for f in files:
        body = open(f).read()
        piece = f"// File: {os.path.relpath(f, ROOT)}\n{body}\n"
        if len(text) + len(piece) > n_tokens * 3.4 and tokens_of(base, text + piece) > n_tokens:
            continue
        text += piece
    text += "\n// Question: which of the files above defines the prefix cache's disk tier? Answer:"
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pld", default=os.path.join(ROOT, "target/release/pld"))
    ap.add_argument("--model", default="qwen-coder-1.5b")
    ap.add_argument("--tokens", type=int, default=16000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--out")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="pld-restart-")
    cache = os.path.join(work, "cache")
    rows = []
    try:
        p, base, up = start(a, cache, os.path.join(work, "cold.log"))
        prompt = document(a.tokens, base)
        n = tokens_of(base, prompt)
        ttft, total, cold_text, usage = complete(base, prompt, a.max_tokens)
        rows.append({"run": "cold", "prompt_tokens": usage["prompt_tokens"],
                     "cached_tokens": usage.get("prompt_tokens_details", {}).get("cached_tokens", 0),
                     "ttft_s": round(ttft, 3), "total_s": round(total, 3), "server_start_s": round(up, 2)})
        time.sleep(2)  # the writer thread finishes the last blocks
        p.send_signal(signal.SIGKILL)
        p.wait()
        files = sum(len(fs) for _, _, fs in os.walk(cache))
        disk_bytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(cache) for f in fs)
        p, base, up = start(a, cache, os.path.join(work, "warm.log"))
        ttft, total, warm_text, usage = complete(base, prompt, a.max_tokens)
        rows.append({"run": "after restart", "prompt_tokens": usage["prompt_tokens"],
                     "cached_tokens": usage.get("prompt_tokens_details", {}).get("cached_tokens", 0),
                     "ttft_s": round(ttft, 3), "total_s": round(total, 3), "server_start_s": round(up, 2)})
        p.send_signal(signal.SIGKILL)
        p.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result = {"model": a.model, "threads": a.threads, "prompt_tokens": n, "files": files,
              "disk_bytes": disk_bytes, "bytes_per_token": round(disk_bytes / max(1, rows[0]["prompt_tokens"])),
              "identical_output": warm_text == cold_text, "rows": rows,
              "ttft_ratio": round(rows[1]["ttft_s"] / rows[0]["ttft_s"], 4)}
    print(json.dumps(result, indent=1))
    if a.out:
        json.dump(result, open(a.out, "w"), indent=1)
    if warm_text != cold_text:
        sys.exit("the output after the restart differs from the cold one")


if __name__ == "__main__":
    main()
