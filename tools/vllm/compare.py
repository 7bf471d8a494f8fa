#!/usr/bin/env python3
"""Drafters side by side inside a real vLLM: plain greedy, vLLM's `ngram`, vLLM's `suffix`
(arctic-inference) and pld's `pld.vllm.Proposer`, on the same prompts, greedy, one or several
requests at a time. Every output is checked token for token against plain greedy at the same
concurrency; the spec-decode counters (drafts, drafted and accepted tokens) come from vLLM's own
metrics.

    python tools/vllm/compare.py --model CHECKPOINT --rows workloads/grounded-dev.jsonl \\
        --per-category 2 --max-tokens 128 --concurrency 1 -k 8 --out result.json \\
        --drafter none --drafter ngram --drafter suffix --drafter pld --drafter pld:match_policy=earliest

A drafter is `none`, `ngram`, `suffix`, `pld` or `pld:NAME=VALUE,...` (settings for
`additional_config["pld"]`). vLLM runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) on the
threads VLLM_CPU_OMP_THREADS_BIND gives it. The greedy outputs (`prompt_ids`, `output_ids`) are
saved with the counts, so tools/drafter_bench/vllm_ngram.py can replay other drafters on them.
"""

import argparse
import gc
import json
import os
import platform
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def load_prompts(paths, per_category, tokenizer, max_prompt, categories=None):
    """The first turn of the first `per_category` rows of each category (of `categories`, when
    given), as chat-template ids."""
    prompts = []
    for path in paths:
        seen = {}
        for line in open(path):
            row = json.loads(line)
            turns = row["turns"]
            if isinstance(turns, str):  # some files keep the list as its Python repr
                import ast

                turns = ast.literal_eval(turns)
            cat = row["category"]
            if seen.get(cat, 0) >= per_category or (categories and cat not in categories):
                continue
            ids = tokenizer.apply_chat_template(
                [{"role": "user", "content": turns[0]}], add_generation_prompt=True, tokenize=True
            )
            if hasattr(ids, "input_ids"):
                ids = ids.input_ids
            if len(ids) > max_prompt:
                continue
            seen[cat] = seen.get(cat, 0) + 1
            prompts.append({"file": os.path.basename(path), "id": str(row["question_id"]), "category": cat,
                            "prompt_ids": list(map(int, ids))})
    return prompts


def spec_config(drafter, k, nmin, nmax):
    """(speculative_config, additional_config) for one drafter name."""
    if drafter == "none":
        return None, None
    if drafter == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": nmin,
                "prompt_lookup_max": nmax}, None
    if drafter == "suffix":
        return {"method": "suffix", "num_speculative_tokens": k}, None
    if drafter == "pld" or drafter.startswith("pld:"):
        pld = {"prompt_lookup_min": nmin, "prompt_lookup_max": nmax}
        for item in filter(None, drafter[4:].split(",")):
            name, value = item.split("=", 1)
            pld[name] = json.loads(value) if value in ("true", "false") or value.isdigit() else value
        return ({"method": "custom_class", "model": "pld.vllm.Proposer", "num_speculative_tokens": k},
                {"pld": pld})
    raise SystemExit(f"unknown drafter {drafter!r}")


def counters(llm):
    """vLLM's spec-decode counters so far (drafts, drafted, accepted), summed over engines."""
    out = {"drafts": 0, "drafted": 0, "accepted": 0}
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "drafted",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    for m in llm.get_metrics():
        if m.name in names:
            out[names[m.name]] += int(getattr(m, "value", 0))
    return out


def run_one(args, drafter, prompts):
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec, extra = spec_config(drafter, args.k, args.nmin, args.nmax)
    # enforce_eager: vLLM's CPU compile warm-up takes minutes per engine on 2 cores; every drafter
    # (and the plain reference) runs the same eager model. The KV cache is sized explicitly: the
    # default reserves 92% of the machine's memory.
    kwargs = dict(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len, seed=0,
                  max_num_seqs=args.concurrency, disable_log_stats=False, enable_prefix_caching=False,
                  enforce_eager=not args.compile, gpu_memory_utilization=0.3,
                  kv_cache_memory_bytes=args.kv_cache_gib << 30)
    if spec:
        kwargs["speculative_config"] = spec
        kwargs["per_request_spec_decode_metrics"] = "summary"  # refused without speculation
    if extra:
        kwargs["additional_config"] = extra
    llm = LLM(**kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=False)
    started = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p["prompt_ids"]) for p in prompts], params,
                        use_tqdm=False)
    wall = time.perf_counter() - started
    result = {"drafter": drafter, "speculative_config": spec, "additional_config": extra,
              "wall_s": round(wall, 2), **counters(llm),
              "outputs": [list(map(int, o.outputs[0].token_ids)) for o in outs],
              "per_request": [per_request(o.outputs[0]) for o in outs]}
    del llm
    gc.collect()
    return result


def per_request(output):
    """One request's spec-decode counts (vLLM's per-request metrics), or None."""
    m = getattr(output, "spec_decode_metrics", None)
    if m is None:
        return None
    d = m.to_dict()
    return {"steps": d["num_spec_steps"], "drafted": d["num_draft_tokens"],
            "accepted": d["num_accepted_draft_tokens"]}


def by_category(result, prompts):
    """Per category: requests, generated tokens, verify steps with a draft, drafted, accepted."""
    cats = {}
    for p, out, m in zip(prompts, result["outputs"], result.get("per_request") or []):
        c = cats.setdefault(f'{p["file"].split("-")[0]}/{p["category"]}',
                            {"rows": 0, "generated": 0, "steps": 0, "drafted": 0, "accepted": 0})
        c["rows"] += 1
        c["generated"] += len(out)
        for name in ("steps", "drafted", "accepted"):
            c[name] += (m or {}).get(name, 0)
    return cats


def summarize(result, greedy, prompts):
    """Adds per-category token counts, matches against greedy and tokens per step."""
    generated = sum(len(o) for o in result["outputs"])
    result["generated"] = generated
    result["tok_per_s"] = round(generated / result["wall_s"], 2)
    if greedy is not None:
        result["mismatches"] = [p["id"] for p, a, b in zip(prompts, result["outputs"], greedy) if a != b]
    if any(result.get("per_request") or []):
        result["by_category"] = by_category(result, prompts)
    if result["drafts"]:
        result["mean_acceptance_length"] = round(1 + result["accepted"] / result["drafts"], 3)
        # Each decode step emits 1 + its accepted tokens; the prefill emits one.
        result["tokens_per_step"] = round(generated / max(1, generated - result["accepted"]), 3)
    return result


def _child(args, drafter, prompts):
    try:
        return run_one(args, drafter, prompts)
    except Exception as e:  # as text: vLLM's exceptions do not all pickle
        import traceback

        traceback.print_exc()
        return {"drafter": drafter, "error": f"{type(e).__name__}: {e}"}


def in_child(args, drafter, prompts):
    """run_one in a fresh process: vLLM 0.32 on the CPU fails to build a second engine in a
    process that has had one (AttributeError: '_lib_fn_wrapper' object has no attribute 'get')."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            return pool.submit(_child, args, drafter, prompts).result()
        except Exception as e:
            return {"drafter": drafter, "error": f"{type(e).__name__}: {e}"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a checkpoint vLLM loads (tools/vllm/convert.py)")
    ap.add_argument("--rows", action="append", required=True, help="Spec-Bench-format JSONL (repeat)")
    ap.add_argument("--per-category", type=int, default=2)
    ap.add_argument("--category", action="append", help="only these categories (repeatable)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-prompt", type=int, default=3000, help="skip prompts longer than this")
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--concurrency", type=int, default=1, help="vLLM's max_num_seqs")
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--nmin", type=int, default=1)
    ap.add_argument("--nmax", type=int, default=4)
    ap.add_argument("--drafter", action="append", default=None)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--compile", action="store_true", help="vLLM's compiled model instead of eager")
    ap.add_argument("--kv-cache-gib", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    drafters = args.drafter or ["none", "ngram", "pld"]
    if drafters[0] != "none":
        drafters.insert(0, "none")  # the reference outputs

    import vllm
    from transformers import AutoTokenizer

    prompts = load_prompts(args.rows, args.per_category, AutoTokenizer.from_pretrained(args.model),
                           args.max_prompt, set(args.category or []))
    report = {"vllm": vllm.__version__, "model": args.model, "cpu": cpu_name(),
              "threads": os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "vLLM's default"),
              "python": platform.python_version(), "args": vars(args), "prompts": prompts, "runs": []}
    greedy = None
    for drafter in drafters:
        result = in_child(args, drafter, prompts)
        if "error" in result:  # a drafter that cannot start (suffix without arctic-inference)
            report["runs"].append(result)
            print(f"{drafter}: failed: {result['error']}", flush=True)
            continue
        summarize(result, greedy, prompts)
        if greedy is None:
            greedy = result["outputs"]
        report["runs"].append(result)
        print(json.dumps({k: v for k, v in result.items() if k not in ("outputs", "per_request")}), flush=True)
        json.dump(report, open(args.out, "w"))


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    main()
