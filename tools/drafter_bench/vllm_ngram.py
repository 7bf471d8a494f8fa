#!/usr/bin/env python3
"""pld's vLLM proposer (`pld.vllm.Proposer`) beside vLLM's own `NgramProposer`, called the same
way on the same persistent batch: tokens per step on the greedy outputs `pld bench run` recorded
(each proposer drafting for the recorded output, accepted up to the first token that differs, plus
the model's own), and proposal time per step at 1k, 8k, 32k and 128k tokens of context.

vLLM's proposer is imported from vLLM when it is installed, or loaded from its source file
(`--vllm-file .../vllm/v1/spec_decode/ngram_proposer.py`, e.g. from the unpacked wheel; it needs
numpy, numba and torch). Both get K=8 and n-grams of 1..4 (vLLM: the longest n-gram, earliest
match; pld: most recent match, full-length drafts (its default inside vLLM), and again with its
adaptive length).

    python3 tools/drafter_bench/vllm_ngram.py --results docs/bench/results.json --vllm-file FILE
"""

import argparse
import importlib.util
import json
import sys
import time
import types
from types import SimpleNamespace

import numpy as np

from pld.vllm import Proposer


def vllm_ngram_class(path):
    try:
        from vllm.v1.spec_decode.ngram_proposer import NgramProposer  # type: ignore

        return NgramProposer
    except ImportError:
        if not path:
            raise SystemExit("vLLM is not installed: give --vllm-file (its ngram_proposer.py)")
    # The file only needs VllmConfig as a type: stand it in.
    for name in ("vllm", "vllm.config"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["vllm.config"].VllmConfig = object
    spec = importlib.util.spec_from_file_location("vllm_ngram_proposer", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.NgramProposer


def config(k, max_len, rows, pld=None):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k, prompt_lookup_min=1, prompt_lookup_max=4),
        model_config=SimpleNamespace(max_model_len=max_len),
        scheduler_config=SimpleNamespace(max_num_seqs=rows),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
        additional_config={"pld": dict(pld or {})},
    )


def call(proposer, k, sampled, lengths, tokens):
    if type(proposer).__name__ == "NgramProposer":
        return proposer.propose(k, sampled, lengths, tokens)
    return proposer.propose(sampled, lengths, tokens)


def tokens_per_step(proposer, k, rows, max_len):
    """Replays each recorded (prompt, output) as greedy decoding would go with this proposer."""
    steps = produced = 0
    for prompt, output in rows:
        truth = prompt + output
        tokens = np.zeros((1, max_len), dtype=np.int32)
        n = len(prompt) + 1  # prefill gives the first output token
        tokens[0, :n] = truth[:n]
        sampled = [truth[len(prompt):n]]
        while n < len(truth):
            draft = call(proposer, k, sampled, np.array([n], dtype=np.int32), tokens)[0]
            accepted = 0
            while accepted < len(draft) and n + accepted < len(truth) and draft[accepted] == truth[n + accepted]:
                accepted += 1
            new = truth[n:n + accepted + 1]
            tokens[0, n:n + len(new)] = new
            n += len(new)
            sampled = [new]
            steps += 1
            produced += len(new)
    return produced / max(steps, 1)


def propose_time(proposer, k, context, max_len, steps=200):
    """Mean seconds per propose call for one row of `context` tokens, one token added per step."""
    tokens = np.zeros((1, max_len), dtype=np.int32)
    tokens[0, :len(context)] = context
    n = len(context) - steps
    call(proposer, k, [[int(tokens[0, n - 1])]], np.array([n], dtype=np.int32), tokens)
    started = time.perf_counter()
    for _ in range(steps):
        n += 1
        call(proposer, k, [[int(tokens[0, n - 1])]], np.array([n], dtype=np.int32), tokens)
    return (time.perf_counter() - started) / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", required=True, help="results.json of `pld bench run`")
    ap.add_argument("--vllm-file", help="vLLM's ngram_proposer.py, when vLLM is not installed")
    ap.add_argument("-k", type=int, default=8)
    a = ap.parse_args()
    Ngram = vllm_ngram_class(a.vllm_file)
    rows = [(t["prompt_ids"], t["output_ids"]) for r in json.load(open(a.results))["rows"] for t in r["turns"]]
    max_len = 8192
    print(f"{len(rows)} recorded turns, K={a.k}")
    for name, make, pld in [
        ("vLLM NgramProposer", Ngram, None),
        ("pld.vllm.Proposer", Proposer, None),
        ("pld.vllm.Proposer, adaptive length", Proposer, {"adaptive": True}),
    ]:
        p = make(config(a.k, max_len, 1, pld))
        print(f"{name}: {tokens_per_step(p, a.k, rows, max_len):.2f} tokens per step")
    corpus = [t for prompt, output in rows for t in prompt + output]
    print("\n| context | vLLM NgramProposer us/step | pld.vllm.Proposer us/step |\n|---:|---:|---:|")
    for context in (1024, 8192, 32768, 131072):
        text = (corpus * (context // len(corpus) + 1))[:context]
        cfg = config(a.k, context + 16, 1)
        times = [propose_time(make(cfg), a.k, text, context + 16) for make in (Ngram, Proposer)]
        print(f"| {context} | {times[0] * 1e6:.1f} | {times[1] * 1e6:.1f} |")


if __name__ == "__main__":
    main()
