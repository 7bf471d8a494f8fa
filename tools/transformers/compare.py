#!/usr/bin/env python3
"""transformers' greedy decoding three ways on the same rows: plain, its own prompt lookup
(`prompt_lookup_num_tokens=K`) and pld's drafter (`custom_generate=pld.transformers.prompt_lookup`):
checks that the outputs are identical and reports tokens per forward pass and wall time of each.
Needs torch, transformers, gguf and accelerate (`pip install torch transformers gguf accelerate`)
and the `pld` package.

    python3 tools/transformers/compare.py --limit 3 --max-new-tokens 128
"""

import argparse
import json
import pathlib
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import pld.transformers

SHARED = pathlib.Path(__file__).resolve().parents[3] / "shared" / "bench"


def count_passes(model):
    """Wraps the model's forward to count calls; returns the counter (a one-element list)."""
    calls = [0]
    inner = model.forward

    def forward(*args, **kwargs):
        calls[0] += 1
        return inner(*args, **kwargs)

    model.forward = forward
    return calls


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", default=str(pathlib.Path.home() / ".cache/pld/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--workload", default=str(SHARED / "grounded-dev.jsonl"))
    ap.add_argument("--limit", type=int, default=2, help="rows per category")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("-k", type=int, default=8, help="draft tokens per step, both methods")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    gguf = pathlib.Path(a.gguf)
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model.eval()
    passes = count_passes(model)
    rows, seen = [], {}
    for line in open(a.workload):
        if line.strip():
            r = json.loads(line)
            if seen.get(r["category"], 0) < a.limit:
                seen[r["category"]] = seen.get(r["category"], 0) + 1
                rows.append(r)
    ways = {
        "plain": {},
        "transformers prompt lookup": {"prompt_lookup_num_tokens": a.k},
        "pld drafter": {"custom_generate": pld.transformers.prompt_lookup, "pld_config": {"num_speculative_tokens": a.k}},
        "pld drafter, adaptive length": {"custom_generate": pld.transformers.prompt_lookup, "pld_config": {"num_speculative_tokens": a.k, "adaptive": True}},
    }
    totals = {w: [0, 0, 0.0] for w in ways}  # new tokens, passes, seconds
    for r in rows:
        text = tok.apply_chat_template([{"role": "user", "content": r["turns"][0]}], tokenize=False, add_generation_prompt=True)
        ids = tok(text, return_tensors="pt")
        outs = {}
        for name, extra in ways.items():
            passes[0] = 0
            t = time.perf_counter()
            with torch.no_grad():
                out = model.generate(**ids, max_new_tokens=a.max_new_tokens, do_sample=False, **extra)
            seconds = time.perf_counter() - t
            new = out[0, ids["input_ids"].shape[1]:].tolist()
            outs[name] = new
            totals[name][0] += len(new)
            totals[name][1] += passes[0]
            totals[name][2] += seconds
        same = all(o == outs["plain"] for o in outs.values())
        print(f"{r['category']} {r['question_id']}: {len(outs['plain'])} tokens, identical: {same}", flush=True)
        if not same:
            raise SystemExit("outputs differ from transformers' plain greedy decoding")
    base = totals["plain"][2]
    print("\n| method | tokens per forward pass | wall s | speedup |\n|---|---:|---:|---:|")
    for name, (new, n, s) in totals.items():
        print(f"| {name} | {new / max(n, 1):.2f} | {s:.1f} | {base / s:.2f}x |")


if __name__ == "__main__":
    main()
