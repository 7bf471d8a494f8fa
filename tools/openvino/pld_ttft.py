#!/usr/bin/env python3
"""pld's side of the OpenVINO comparison: the same prompts as `ttft.py` times, run through
`pld generate --chat --json` (so pld's own tokenizer and chat template make the ids, which are
checked against the ids file OpenVINO was given), greedy, `--threads` threads. Per prompt: the
time to the first token (pld's prefill time: the prompt's pass, whose last row gives the first
token), decode tokens/s and the generated ids, after one untimed run. JSON to stdout, a table
to stderr.

    python3 tools/openvino/pld_ttft.py --prompts tools/openvino/prompts-qwen-coder.json \
        --model qwen-coder-1.5b --threads 2 --max-new-tokens 64 --repeats 2 > pld.json

Run it alternately with `ttft.py`, alone on the machine, and compare medians of one sitting.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def prompt_texts(meta_path, workloads):
    """Each prompt's user text and system message, rebuilt as prompt_ids.py built them."""
    meta = json.load(open(meta_path))
    rows = {}
    for w in workloads:
        for line in open(w):
            r = json.loads(line)
            rows[r["question_id"]] = r
    out = []
    for p in meta["prompts"]:
        text = "\n\n".join(rows[i]["turns"][0] for i in p["rows"])
        out.append((p["rows"], text, meta.get("system")))
    return out


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pld", default=os.path.join(REPO, "target", "release", "pld"))
    ap.add_argument("--model", default="qwen-coder-1.5b")
    ap.add_argument("--prompts", required=True, help="the ids file given to ttft.py (its .meta.json beside it)")
    ap.add_argument("--workload", action="append", help="workload JSONL the rows come from")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--extra", default="", help="more pld generate flags, e.g. '--no-spec'")
    args = ap.parse_args()
    ids = json.load(open(args.prompts))
    meta = args.prompts[: -len(".json")] + ".meta.json"
    workloads = args.workload or [os.path.join(REPO, "workloads", "grounded-dev.jsonl")]
    results = []
    for (rows, text, system), want in zip(prompt_texts(meta, workloads), ids):
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
            f.write(text)
        cmd = [args.pld, "generate", "--model", args.model, "--chat", "--json",
               "--prompt-file", f.name, "--max-tokens", str(args.max_new_tokens),
               "--threads", str(args.threads)] + args.extra.split()
        if system:
            cmd += ["--system", system]
        # One untimed run first, as ttft.py warms OpenVINO up: the first process after another
        # engine ran may find the model's pages out of the page cache.
        subprocess.run(cmd, check=True, capture_output=True)
        runs = []
        for _ in range(args.repeats):
            out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            if out["prompt_token_ids"] != want:
                sys.exit(f"rows {rows}: pld's prompt ids differ from the ids file")
            runs.append(out)
        os.unlink(f.name)
        ttft = [r["timing"]["prefill_ms"] / 1e3 for r in runs]
        decode = [r["timing"]["decode_tokens_per_s"] for r in runs]
        results.append({
            "rows": rows,
            "prompt_tokens": len(want),
            "ttft_s": statistics.median(ttft),
            "ttft_runs_s": ttft,
            "decode_tokens_per_s": statistics.median(decode),
            "generated_ids": runs[-1]["token_ids"],
            "speculation": runs[-1]["speculation"],
        })
        print(f"rows {rows}: {len(want)} tokens, TTFT {statistics.median(ttft):.3f} s, "
              f"decode {statistics.median(decode):.1f} tok/s", file=sys.stderr)
    json.dump({"engine": "pld", "model": args.model, "threads": args.threads, "cpu": cpu_name(),
               "command": " ".join(cmd[:1] + cmd[1:]), "prompts": results}, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
