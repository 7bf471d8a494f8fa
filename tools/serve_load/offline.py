#!/usr/bin/env python3
"""Offline batch generation through pld's Python `LLM` (vLLM's offline names): the first N rows
of workloads in Spec-Bench's JSONL format (in file order, wrapping; `--categories` to pick), all
handed to one `LLM.chat` call (one continuous batch of up to --max-num-seqs sequences), plain and
speculative, each mode in its own process so that its peak resident memory is its own, the modes
alternated over --rounds. A row with a `schema` asks for its answer under it
(`StructuredOutputsParams(json=...)`), and the share of those answers that parse and validate is
reported (`load.valid`), with how many of them were cut at --max-tokens. Prints one line per run
and, with --out, writes them as JSON.

    python3 tools/serve_load/offline.py --model qwen-coder-1.5b --threads 2 \\
        --workload workloads/grounded-dev.jsonl --workload workloads/spec-bench-dev.jsonl \\
        --categories json_extraction,rag,summarization,code_edit --prompts 64 --max-tokens 256

Needs the `pld` package (`pip install ./crates/python`) and `jsonschema`.
"""

import argparse
import json
import resource
import subprocess
import sys
import time


def rows(paths, categories):
    out = []
    for path in paths:
        for line in open(path):
            if not line.strip():
                continue
            r = json.loads(line)
            if not categories or r["category"] in categories:
                out.append(r)
    if not out:
        sys.exit("no rows of the categories asked in the workloads")
    return out


def one_mode(args) -> dict:
    """Runs one mode in this process and returns what it measured."""
    import jsonschema  # noqa: F401  (required: without it load.valid checks nothing)
    import pld

    from load import valid as meets_schema  # this folder's load.py

    picked = rows(args.workload, args.categories.split(",") if args.categories else [])
    picked = [picked[i % len(picked)] for i in range(args.prompts)]
    spec = {"num_speculative_tokens": 0} if args.mode == "plain" else None
    llm = pld.LLM(args.model, speculative_config=spec, threads=args.threads,
                  max_num_seqs=args.max_num_seqs, prefix_cache_bytes=0,
                  kv_cache_bytes=args.kv_cache_bytes)
    params = []
    for r in picked:
        structured = pld.StructuredOutputsParams(json=r["schema"]) if "schema" in r else None
        params.append(pld.SamplingParams(temperature=0, max_tokens=args.max_tokens,
                                         structured_outputs=structured))
    # Each prompt its own first line, so that no two share a cached prefix beyond the template's.
    conversations = [[{"role": "user", "content": f"[prompt {i}]\n{r['turns'][0]}"}]
                     for i, r in enumerate(picked)]
    t0 = time.perf_counter()
    outs = llm.chat(conversations, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    checked = valid = cut = 0
    for r, o in zip(picked, outs):
        if "schema" not in r:
            continue
        checked += 1
        cut += o.outputs[0].finish_reason == "length"
        valid += meets_schema(r["schema"], o.outputs[0].text) is True
    firsts = sorted(o.metrics.first_token_s for o in outs if o.metrics.first_token_s is not None)
    return {
        "mode": args.mode,
        "prompts": len(outs),
        "wall_s": wall,
        "requests_per_s": len(outs) / wall,
        "tokens_per_s": tokens / wall,
        "generated_tokens": tokens,
        "p50_first_token_s": firsts[len(firsts) // 2] if firsts else None,
        "schema_valid_share": valid / checked if checked else None,
        "schema_answers": checked,
        "schema_answers_cut": cut,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "texts": [o.outputs[0].text for o in outs],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen-coder-1.5b")
    p.add_argument("--workload", action="append", required=True)
    p.add_argument("--categories", default="")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--kv-cache-bytes", type=int, default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--out")
    p.add_argument("--mode", choices=["plain", "speculative"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.mode:
        print(json.dumps(one_mode(args)))
        return
    runs = []
    for rnd in range(args.rounds):
        order = ["plain", "speculative"] if rnd % 2 == 0 else ["speculative", "plain"]
        for mode in order:
            cmd = [sys.executable, __file__, "--mode", mode] + sys.argv[1:]
            got = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            runs.append(got)
            print(f"{mode}: {got['prompts']} prompts in {got['wall_s']:.1f} s, "
                  f"{got['requests_per_s']:.2f} req/s, {got['tokens_per_s']:.1f} tok/s, "
                  f"schema-valid {got['schema_valid_share']} of {got['schema_answers']} "
                  f"({got['schema_answers_cut']} cut at --max-tokens), "
                  f"peak RSS {got['peak_rss_bytes'] / 2**30:.2f} GiB", flush=True)
    same = all(a["texts"] == b["texts"] for a in runs for b in runs)
    print(f"outputs equal across modes and rounds: {same}")
    if args.out:
        for r in runs:
            r.pop("texts")
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "threads": args.threads, "max_tokens": args.max_tokens,
                       "max_num_seqs": args.max_num_seqs, "outputs_equal": same, "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
