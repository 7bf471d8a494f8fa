#!/usr/bin/env python3
"""Time OpenVINO GenAI on a GGUF file: time to first token and decode rate, prompts given as token ids.

    OV_VENV=/tmp/ov-venv tools/openvino/setup.sh
    /tmp/ov-venv/bin/python tools/openvino/ttft.py \
        --gguf ~/.cache/pld/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
        --prompt-ids tools/openvino/prompts-qwen-coder.json --threads 2 > ov.json

The GGUF is read by openvino_genai.LLMPipeline(path, "CPU", ...) itself. Each prompt (a list of
token ids, already chat-templated) goes in as openvino_genai.TokenizedInputs, so OpenVINO's own
tokenizer and chat template play no part; decoding is greedy. Every prompt runs once as a
warm-up, then --repeats timed runs; the medians are reported.

Per run it records OpenVINO's own perf_metrics (TTFT, TPOT, throughput, generate duration) and
wall-clock: around generate(), and to the first token (a token-id streamer that only takes the
time). JSON goes to stdout, a short table to stderr.

Converting a GGUF takes a while (the 1.5B: a minute or more). With --cache-dir (default
/tmp/ov-cache) the GGUF is linked into <cache-dir>/<model>/model.gguf and loaded from there with
enable_save_ov_model, so OpenVINO writes the converted IR (openvino_model.xml/.bin and the
tokenizer models) beside the link, never beside the real file; later runs load that IR unless
--from-gguf is given. CACHE_DIR (compiled blobs) points into the same folder.

On x86 CPUs LLMPipeline runs the paged-attention (continuous batching) backend with a prefix
cache; this script passes the same scheduler settings with the prefix cache off, so that a
timed run cannot reuse the warm-up's KV cache (--prefix-caching restores it, --attention-backend
SDPA takes the stateful backend instead).
"""

import argparse
import hashlib
import json
import os
import platform
import statistics
import sys
import time


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    keep = ["avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"]
                    return [k for k in keep if k in flags]
    except OSError:
        pass
    return None


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def model_workdir(cache_dir, gguf):
    # One folder per GGUF file (path, size, mtime).
    real = os.path.realpath(gguf)
    st = os.stat(real)
    key = hashlib.sha1(f"{real}|{st.st_size}|{int(st.st_mtime)}".encode()).hexdigest()[:10]
    stem = os.path.splitext(os.path.basename(real))[0]
    return os.path.join(cache_dir, f"{stem}-{key}"), real


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True, help="path to the .gguf file")
    ap.add_argument("--prompt-ids", required=True, help="JSON: a list of prompts, each a list of token ids")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2, help="CPU property INFERENCE_NUM_THREADS")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per prompt after one warm-up run")
    ap.add_argument("--ignore-eos", action="store_true", help="always generate --max-new-tokens tokens")
    ap.add_argument("--cache-dir", default="/tmp/ov-cache", help="where the converted IR and compiled blobs go ('' for none)")
    ap.add_argument("--from-gguf", action="store_true", help="convert the GGUF again even if a converted IR is cached")
    ap.add_argument("--attention-backend", choices=["PA", "SDPA"], help="ATTENTION_BACKEND (default: the library's, PA on x86 CPUs)")
    ap.add_argument("--prefix-caching", action="store_true",
                    help="keep the PA backend's prefix cache on (the library's default; off here, or every timed run "
                         "after the warm-up would reuse the warm-up's KV cache and TTFT would measure almost nothing)")
    ap.add_argument("--ov-property", action="append", default=[], metavar="KEY=VALUE",
                    help="extra CPU/pipeline property, e.g. INFERENCE_PRECISION_HINT=f32 (repeatable; none by default)")
    ap.add_argument("--no-text", action="store_true", help="do not decode the generated ids to text in the JSON")
    args = ap.parse_args()

    import numpy as np
    import openvino as ov
    import openvino_genai as ov_genai

    with open(args.prompt_ids) as f:
        prompts = json.load(f)
    if not (isinstance(prompts, list) and all(isinstance(p, list) and p and all(isinstance(t, int) for t in p) for p in prompts)):
        sys.exit("--prompt-ids must be a JSON list of non-empty lists of token ids")

    props = {"INFERENCE_NUM_THREADS": args.threads}
    if args.attention_backend:
        props["ATTENTION_BACKEND"] = args.attention_backend
    for kv in args.ov_property:
        k, _, v = kv.partition("=")
        if not k or not _:
            sys.exit(f"--ov-property wants KEY=VALUE, got {kv!r}")
        props[k] = int(v) if v.lstrip("-").isdigit() else v
    scheduler = None
    if args.attention_backend != "SDPA":
        # The library's own PA config (get_latency_oriented_scheduler_config) with prefix caching off:
        # no cap on tokens per step (the prompt is prefilled in one step), no KV reuse between calls.
        scheduler = ov_genai.SchedulerConfig()
        scheduler.max_num_batched_tokens = sys.maxsize
        scheduler.enable_prefix_caching = bool(args.prefix_caching)

    load_path, loaded_from = os.path.realpath(args.gguf), "gguf"
    workdir = None
    if args.cache_dir:
        workdir, real = model_workdir(args.cache_dir, args.gguf)
        os.makedirs(workdir, exist_ok=True)
        link = os.path.join(workdir, "model.gguf")
        if not os.path.lexists(link):
            os.symlink(real, link)
        props["CACHE_DIR"] = os.path.join(workdir, "compiled")
        have_ir = all(os.path.exists(os.path.join(workdir, n)) for n in
                      ("openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml", "openvino_detokenizer.xml"))
        if have_ir and not args.from_gguf:
            load_path, loaded_from = workdir, "cached IR converted from the gguf"
        else:
            load_path = link
            props["enable_save_ov_model"] = True

    print(f"loading {load_path} ({loaded_from}) with {props}", file=sys.stderr)
    t0 = time.perf_counter()
    extra = {"scheduler_config": scheduler} if scheduler is not None else {}
    pipe = ov_genai.LLMPipeline(load_path, "CPU", **props, **extra)
    load_wall_s = time.perf_counter() - t0
    print(f"loaded in {load_wall_s:.1f} s", file=sys.stderr)

    tokenizer = pipe.get_tokenizer()
    eos = tokenizer.get_eos_token_id()

    config = pipe.get_generation_config()
    config.do_sample = False
    config.num_beams = 1
    config.max_new_tokens = args.max_new_tokens
    config.min_new_tokens = 0
    config.repetition_penalty = 1.0
    config.ignore_eos = args.ignore_eos
    if eos is not None and eos >= 0 and config.eos_token_id < 0:
        config.eos_token_id = eos

    class FirstTokenTimer(ov_genai.StreamerBase):
        def __init__(self):
            super().__init__()
            self.first = None
            self.writes = 0

        def write(self, token):
            if self.first is None:
                self.first = time.perf_counter()
            self.writes += 1
            return ov_genai.StreamingStatus.RUNNING

        def end(self):
            pass

    def run(ids):
        input_ids = ov.Tensor(np.array([ids], dtype=np.int64))
        mask = ov.Tensor(np.ones((1, len(ids)), dtype=np.int64))
        timer = FirstTokenTimer()
        t_start = time.perf_counter()
        res = pipe.generate(ov_genai.TokenizedInputs(input_ids, mask), config, timer)
        t_end = time.perf_counter()
        pm = res.perf_metrics
        out = [int(t) for t in res.tokens[0]]
        n = len(out)
        ttft_wall = (timer.first - t_start) if timer.first else None
        decode_wall = ((n - 1) / (t_end - timer.first)) if (timer.first and n > 1 and t_end > timer.first) else None
        tpot_ms = pm.get_tpot().mean
        return {
            "prompt_tokens": pm.get_num_input_tokens(),
            "generated_tokens": n,
            "ttft_s": pm.get_ttft().mean / 1000.0,
            "tpot_ms": tpot_ms,
            "decode_tok_s": (1000.0 / tpot_ms) if tpot_ms > 0 else None,
            "throughput_tok_s": pm.get_throughput().mean,
            "generate_s": pm.get_generate_duration().mean / 1000.0,
            "inference_s": pm.get_inference_duration().mean / 1000.0,
            "wall_total_s": t_end - t_start,
            "wall_ttft_s": ttft_wall,
            "wall_decode_tok_s": decode_wall,
            "finish_reason": str(res.finish_reasons[0]) if getattr(res, "finish_reasons", None) else None,
            "ids": out,
        }

    results = []
    for i, ids in enumerate(prompts):
        t = time.perf_counter()
        warm = run(ids)
        print(f"prompt {i}: {len(ids)} tokens, warm-up {time.perf_counter() - t:.1f} s", file=sys.stderr)
        runs = []
        for r in range(args.repeats):
            runs.append(run(ids))
            print(f"prompt {i}: run {r + 1}: ttft {runs[-1]['ttft_s']:.3f} s, "
                  f"decode {runs[-1]['decode_tok_s'] or 0:.1f} tok/s, total {runs[-1]['wall_total_s']:.2f} s", file=sys.stderr)
        timed = runs or [warm]
        ids_out = timed[-1]["ids"]
        entry = {
            "prompt_index": i,
            "prompt_tokens": len(ids),
            "prompt_tokens_seen_by_ov": timed[-1]["prompt_tokens"],
            "generated_tokens": len(ids_out),
            "median": {k: median([r[k] for r in timed]) for k in
                       ("ttft_s", "decode_tok_s", "tpot_ms", "throughput_tok_s", "generate_s", "wall_total_s",
                        "wall_ttft_s", "wall_decode_tok_s")},
            "runs": [{k: v for k, v in r.items() if k != "ids"} for r in timed],
            "warmup": {k: v for k, v in warm.items() if k != "ids"},
            "same_ids_every_run": all(r["ids"] == warm["ids"] for r in timed),
            "generated_ids": ids_out,
        }
        if not args.no_text:
            entry["generated_text"] = tokenizer.decode(ids_out, skip_special_tokens=False)
        results.append(entry)

    plugin_defaults = {}
    core = ov.Core()
    for k in ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "DYNAMIC_QUANTIZATION_GROUP_SIZE",
              "ENABLE_CPU_PINNING", "ENABLE_HYPER_THREADING", "NUM_STREAMS", "PERFORMANCE_HINT"):
        try:
            plugin_defaults[k] = str(core.get_property("CPU", k))
        except Exception:  # property not known to this version
            pass

    out = {
        "engine": "openvino_genai.LLMPipeline",
        "openvino": ov.__version__,
        "openvino_genai": ov_genai.__version__,
        "python": platform.python_version(),
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "nproc": os.cpu_count(),
        "gguf": os.path.realpath(args.gguf),
        "loaded_from": loaded_from,
        "load_path": load_path,
        "load_wall_s": load_wall_s,
        "properties": props,
        "cpu_plugin_defaults": plugin_defaults,
        "scheduler_config": ({"max_num_batched_tokens": scheduler.max_num_batched_tokens,
                              "enable_prefix_caching": scheduler.enable_prefix_caching,
                              "dynamic_split_fuse": scheduler.dynamic_split_fuse}
                             if scheduler is not None else None),
        "attention_backend": args.attention_backend or "PA (scheduler_config given)",
        "generation": {"do_sample": False, "max_new_tokens": args.max_new_tokens, "ignore_eos": args.ignore_eos,
                       "eos_token_id": config.eos_token_id, "stop_token_ids": sorted(config.stop_token_ids)},
        "warmup_runs": 1,
        "repeats": args.repeats,
        "prompt_ids_file": args.prompt_ids,
        "prompts": results,
    }
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")

    print(f"\nopenvino {ov.__version__} / genai {ov_genai.__version__}, {cpu_model()}, {args.threads} threads, "
          f"median of {args.repeats}", file=sys.stderr)
    print(f"{'prompt':>6} {'tokens':>7} {'ttft s':>8} {'wall ttft':>9} {'decode t/s':>10} {'wall dec':>8} {'total s':>8} {'gen':>4}",
          file=sys.stderr)
    for e in results:
        m = e["median"]
        f = lambda v, w, p: f"{v:>{w}.{p}f}" if v is not None else f"{'-':>{w}}"
        print(f"{e['prompt_index']:>6} {e['prompt_tokens']:>7} {f(m['ttft_s'], 8, 3)} {f(m['wall_ttft_s'], 9, 3)} "
              f"{f(m['decode_tok_s'], 10, 1)} {f(m['wall_decode_tok_s'], 8, 1)} {f(m['wall_total_s'], 8, 2)} "
              f"{e['generated_tokens']:>4}", file=sys.stderr)


if __name__ == "__main__":
    main()
