#!/usr/bin/env python3
"""pld's vLLM proposer (`pld.vllm.Proposer`) beside vLLM's own drafters (`NgramProposer`, and
`SuffixDecodingProposer` when arctic-inference is installed), each called as vLLM calls it on the
same persistent batch.

Two measurements:

- Replay (tokens per step): each proposer drafts along recorded greedy outputs, a draft accepted
  up to its first token that differs, plus the model's own token, as greedy verification goes.
  The outputs come from `pld bench run` (`--results`) or from tools/vllm/compare.py's plain
  greedy run inside vLLM (`--traces`, with each prompt's category). Counted per category: steps,
  drafts, drafted and accepted tokens.
- Proposal time (`--timing`): CPU time (process time) per step for a batch of B rows of C tokens
  of context, one token added to every row per step (vLLM's ngram rescans each row; pld updates
  an index).

vLLM's classes are imported from vLLM when it is installed; without vLLM, `--vllm-file` loads
`ngram_proposer.py` from its source (it needs numpy, numba and torch). pld's proposer is given
its settings as `--pld NAME=VALUE,...` (repeatable; `--pld ''` is its defaults).

    python3 tools/drafter_bench/vllm_ngram.py --traces greedy.json --pld '' --pld match_policy=earliest
    python3 tools/drafter_bench/vllm_ngram.py --traces greedy.json --timing --batch 64 --batch 256
"""

import argparse
import importlib.util
import json
import sys
import time
import types
from collections import defaultdict
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


def suffix_class():
    """vLLM's suffix decoding proposer, or None (with why) when it or arctic-inference is missing."""
    try:
        import arctic_inference.suffix_decoding  # noqa: F401
        from vllm.v1.spec_decode.suffix_decoding import SuffixDecodingProposer
    except ImportError as e:
        return None, str(e)
    return SuffixDecodingProposer, None


def config(k, max_len, rows, pld=None, nmin=1, nmax=4):
    spec = SimpleNamespace(
        num_speculative_tokens=k, prompt_lookup_min=nmin, prompt_lookup_max=nmax,
        # vLLM 0.32's defaults for suffix decoding
        suffix_decoding_max_tree_depth=24, suffix_decoding_max_cached_requests=10000,
        suffix_decoding_max_spec_factor=1.0, suffix_decoding_min_token_prob=0.1,
    )
    return SimpleNamespace(
        speculative_config=spec,
        model_config=SimpleNamespace(max_model_len=max_len),
        scheduler_config=SimpleNamespace(max_num_seqs=rows),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
        additional_config={"pld": dict(pld or {})},
    )


def pld_settings(text):
    """`NAME=VALUE,...` as a dict (numbers and booleans parsed)."""
    out = {}
    for item in filter(None, text.split(",")):
        name, value = item.split("=", 1)
        try:
            out[name] = json.loads(value)
        except ValueError:
            out[name] = value
    return out


class Batch:
    """The part of vLLM's InputBatch that its suffix proposer reads."""

    def __init__(self, tokens, req_ids, prompt_lengths):
        self.token_ids_cpu = tokens
        self.req_ids = list(req_ids)
        self.req_id_to_index = {r: i for i, r in enumerate(self.req_ids)}
        self.num_prompt_tokens = np.array(prompt_lengths, dtype=np.int32)
        self.num_tokens_no_spec = np.zeros(len(self.req_ids), dtype=np.int32)


def call(proposer, k, sampled, lengths, tokens, batch=None):
    kind = type(proposer).__name__
    if kind == "NgramProposer":
        return proposer.propose(k, sampled, lengths, tokens)
    if kind == "SuffixDecodingProposer":
        batch.num_tokens_no_spec = np.asarray(lengths, dtype=np.int32)
        return proposer.propose(k, batch, sampled)
    return proposer.propose(sampled, lengths, tokens)


def replay(proposer, k, rows, max_len):
    """Counts per category as greedy decoding goes with this proposer on each recorded row
    (prompt, output, category), one request at a time."""
    counts = defaultdict(lambda: dict(rows=0, steps=0, drafts=0, drafted=0, accepted=0, produced=0))
    for r, (prompt, output, category) in enumerate(rows):
        c = counts[category]
        c["rows"] += 1
        truth = list(prompt) + list(output)
        tokens = np.zeros((1, max_len), dtype=np.int32)
        n = len(prompt) + 1  # the prefill gives the first output token
        tokens[0, :n] = truth[:n]
        batch = Batch(tokens, [f"req-{r}"], [len(prompt)])
        sampled = [truth[len(prompt):n]]
        while n < len(truth):
            draft = call(proposer, k, sampled, np.array([n], dtype=np.int32), tokens, batch)[0]
            accepted = 0
            while accepted < len(draft) and n + accepted < len(truth) and draft[accepted] == truth[n + accepted]:
                accepted += 1
            new = truth[n:n + accepted + 1]
            tokens[0, n:n + len(new)] = new
            n += len(new)
            sampled = [new]
            c["steps"] += 1
            c["drafts"] += bool(draft)
            c["drafted"] += len(draft)
            c["accepted"] += accepted
            c["produced"] += len(new)
        batch.req_ids, batch.req_id_to_index = [], {}
        call(proposer, k, [], np.zeros(0, dtype=np.int32), tokens, batch)  # ends the request
    return dict(counts)


def total(counts):
    out = defaultdict(int)
    for c in counts.values():
        for name, value in c.items():
            out[name] += value
    return dict(out)


WARM_STEPS = 3


def propose_time(make, k, corpus, rows, context, steps):
    """(seconds of the first call and the WARM_STEPS after it, mean seconds per later step) for
    `rows` rows of `context` tokens, each a different stretch of `corpus`, one token added to
    every row per step. pld builds a row's index on its first call and its first pushes after the
    build grow the index's storage (a one-off copy per request), so they are timed apart."""
    steps += WARM_STEPS
    max_len = context + steps + 16
    tokens = np.zeros((rows, max_len), dtype=np.int32)
    need = context + steps
    for r in range(rows):
        start = (r * 7919) % len(corpus)
        tokens[r, :need] = np.resize(np.roll(corpus, -start), need)
    proposer = make(config(k, max_len, rows))
    batch = Batch(tokens, [f"req-{r}" for r in range(rows)], [context - steps] * rows)
    n = context - steps
    lengths = np.full(rows, n, dtype=np.int32)
    started = time.process_time()
    call(proposer, k, [[int(tokens[r, n - 1])] for r in range(rows)], lengths, tokens, batch)
    times = []
    for _ in range(steps):
        n += 1
        lengths[:] = n
        sampled = [[int(tokens[r, n - 1])] for r in range(rows)]
        t = time.process_time()
        call(proposer, k, sampled, lengths, tokens, batch)
        times.append(time.process_time() - t)
    first = time.process_time() - started - sum(times[WARM_STEPS:])
    # CPU time of this process (all its threads), not wall time: on a shared machine a step now
    # and then waits for a core. The median, as a step now and then also pays for a page fault.
    return first, float(np.median(times[WARM_STEPS:])), float(np.mean(times[WARM_STEPS:]))


def load_rows(a):
    rows = []
    if a.results:
        for r in json.load(open(a.results))["rows"]:
            for t in r["turns"]:
                rows.append((t["prompt_ids"], t["output_ids"], r.get("category", "all")))
    for path in a.traces or []:
        report = json.load(open(path))
        greedy = next(run for run in report["runs"] if run.get("drafter") == "none")
        for p, out in zip(report["prompts"], greedy["outputs"]):
            rows.append((p["prompt_ids"], out, f'{p["file"].split("-")[0]}/{p["category"]}'))
    if not rows:
        raise SystemExit("give --results or --traces")
    return rows


def proposers(a):
    """(name, factory) for every proposer to compare."""
    Ngram = vllm_ngram_class(a.vllm_file)
    out = [("vLLM ngram", Ngram)]
    Suffix, why = suffix_class() if not a.no_suffix else (None, "--no-suffix")
    if Suffix is not None:
        out.append(("vLLM suffix (arctic-inference)", Suffix))
    else:
        print(f"vLLM suffix: not run ({why})", file=sys.stderr)
    for text in a.pld or [""]:
        settings = pld_settings(text)
        out.append((f"pld {text or 'defaults'}", lambda cfg, s=settings: Proposer(_with_pld(cfg, s))))
    return out


def _with_pld(cfg, settings):
    cfg.additional_config = {"pld": dict(settings)}
    return cfg


def run_replay(a, rows, out):
    print(f"{len(rows)} recorded rows, K={a.k}, n-grams {a.nmin}..{a.nmax}")
    max_len = max(len(p) + len(o) for p, o, _ in rows) + a.k + 2
    print("| drafter | category | steps | drafted | accepted | tokens/step | drafted/step |\n"
          "|---|---|---:|---:|---:|---:|---:|")
    for name, make in proposers(a):
        cfg = config(a.k, max_len, 1, nmin=a.nmin, nmax=a.nmax)
        counts = replay(make(cfg), a.k, rows, max_len)
        counts["all"] = total(counts)
        out["replay"][name] = counts
        for cat in sorted(counts, key=lambda c: (c == "all", c)):
            c = counts[cat]
            print(f"| {name} | {cat} | {c['steps']} | {c['drafted']} | {c['accepted']} "
                  f"| {c['produced'] / c['steps']:.3f} | {c['drafted'] / c['steps']:.2f} |", flush=True)


def run_timing(a, rows, out):
    corpus = np.array([t for p, o, _ in rows for t in list(p) + list(o)], dtype=np.int32)
    print(f"\n| drafter | rows | context | first {WARM_STEPS + 1} steps ms | median ms/step "
          "| mean ms/step | median us/row/step |\n|---|---:|---:|---:|---:|---:|---:|")
    for batch in a.batch or [1]:
        for context in a.context or [1024, 8192, 32768, 131072]:
            if batch * context > a.max_batch_tokens:
                print(f"| (skipped: over --max-batch-tokens) | {batch} | {context} | | | | |")
                continue
            for name, make in proposers(a):
                first, step, mean = propose_time(make, a.k, corpus, batch, context, a.steps)
                out["timing"].append(dict(drafter=name, rows=batch, context=context, first_s=first,
                                          median_step_s=step, mean_step_s=mean))
                print(f"| {name} | {batch} | {context} | {first * 1e3:.1f} | {step * 1e3:.3f} "
                      f"| {mean * 1e3:.3f} | {step * 1e6 / batch:.2f} |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", help="results.json of `pld bench run`")
    ap.add_argument("--traces", action="append", help="tools/vllm/compare.py's JSON (repeatable)")
    ap.add_argument("--vllm-file", help="vLLM's ngram_proposer.py, when vLLM is not installed")
    ap.add_argument("--pld", action="append", help="pld settings NAME=VALUE,... ('' for defaults)")
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--nmin", type=int, default=1)
    ap.add_argument("--nmax", type=int, default=4)
    ap.add_argument("--timing", action="store_true", help="proposal time instead of the replay")
    ap.add_argument("--batch", type=int, action="append", help="rows per step (timing; repeatable)")
    ap.add_argument("--context", type=int, action="append", help="tokens of context (timing; repeatable)")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per size")
    ap.add_argument("--max-batch-tokens", type=int, default=1 << 24,
                    help="skip timing sizes over this many tokens (pld's index takes ~150 B a token)")
    ap.add_argument("--no-suffix", action="store_true", help="leave vLLM's suffix proposer out")
    ap.add_argument("--out", help="write the raw results here (JSON)")
    a = ap.parse_args()
    rows = load_rows(a)
    out = {"k": a.k, "nmin": a.nmin, "nmax": a.nmax, "rows": len(rows), "replay": {}, "timing": []}
    if a.timing:
        run_timing(a, rows, out)
    else:
        run_replay(a, rows, out)
    if a.out:
        json.dump(out, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
