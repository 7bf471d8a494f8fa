"""The `pld` package as a vLLM user calls it, on smollm2-135m (and qwen-coder-0.5b for tools):
greedy output equal to the `pld` binary's, speculative equal to plain, a batch equal to its prompts
alone (and faster than running them in turn), seeded sampling reproducible, chat with the prefix
cache and with a tool, streaming, structured output, every error as an exception with pld's
message, and Ctrl-C interrupting a generation."""

import _thread
import json
import os
import pathlib
import signal
import subprocess
import threading
import time

import pytest

import pld
from pld import LLM, SamplingParams, StructuredOutputsParams

REPO = pathlib.Path(__file__).resolve().parents[3]
PLD_BIN = os.environ.get("PLD_BIN", str(REPO / "target" / "release" / "pld"))
PROMPT = "def fibonacci(n):\n    # Return the n-th Fibonacci number.\n"


@pytest.fixture(scope="module")
def llm():
    return LLM("smollm2-135m", threads=2)


@pytest.fixture(scope="module")
def plain():
    return LLM("smollm2-135m", speculative_config={"num_speculative_tokens": 0}, threads=2)


def greedy(max_tokens=48, **kw):
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kw)


def test_greedy_equals_the_pld_binary(llm):
    out = llm.generate(PROMPT, greedy(), use_tqdm=False)[0]
    run = subprocess.run(
        [PLD_BIN, "generate", "--model", "smollm2-135m", "--prompt", PROMPT,
         "--max-tokens", "48", "--threads", "2", "--json"],
        capture_output=True, text=True, check=True,
    )
    cli = json.loads(run.stdout)
    assert out.outputs[0].token_ids == cli["token_ids"]
    assert out.outputs[0].text == cli["text"]
    assert out.prompt_token_ids == cli["prompt_token_ids"]
    assert out.prompt == PROMPT


def test_speculative_equals_plain_and_drafts_are_accepted(llm, plain):
    text = "Copy this list: alpha, beta, gamma, delta, epsilon, zeta, eta, theta.\nCopy: alpha,"
    fast = llm.generate(text, greedy(64), use_tqdm=False)[0]
    slow = plain.generate(text, greedy(64), use_tqdm=False)[0]
    assert fast.outputs[0].token_ids == slow.outputs[0].token_ids
    assert slow.metrics.draft_tokens == 0
    assert fast.metrics.accepted_tokens > 0
    assert fast.metrics.mean_accepted_tokens > 1.0
    assert llm.speculative_config["num_speculative_tokens"] > 0


def test_a_batch_equals_its_prompts_alone_and_is_faster_than_them_in_turn(plain):
    prompts = [f"Write a short note about the number {i}." for i in range(8)]
    batch_s, alone_s = [], []
    # Two rounds, each way timed in turn, and the best of each compared: the batch went first,
    # where a model's first passes (and a shared machine's other work) can cost it alone.
    for _ in range(2):
        started = time.perf_counter()
        together = plain.generate(prompts, greedy(32), use_tqdm=False)
        batch_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        alone = [plain.generate(p, greedy(32), use_tqdm=False)[0] for p in prompts]
        alone_s.append(time.perf_counter() - started)
        for t, a in zip(together, alone):
            assert t.outputs[0].token_ids == a.outputs[0].token_ids
            assert t.prompt == a.prompt
        assert [o.request_id for o in together] == [str(i) for i in range(8)]
    # Eight rows per pass cost far less than eight passes; a loose bound for a shared machine.
    assert min(batch_s) < min(alone_s), f"batch {batch_s} s, in turn {alone_s} s"


def test_seeded_sampling_is_reproducible_and_n_choices_differ(llm):
    p = SamplingParams(temperature=0.9, top_p=0.95, seed=123, max_tokens=24, n=3)
    a = llm.generate("Once upon a time", p, use_tqdm=False)[0]
    b = llm.generate("Once upon a time", p, use_tqdm=False)[0]
    assert [o.token_ids for o in a.outputs] == [o.token_ids for o in b.outputs]
    assert [o.index for o in a.outputs] == [0, 1, 2]
    assert len({tuple(o.token_ids) for o in a.outputs}) > 1, "three choices, one answer"


def test_chat_reuses_the_prefix_cache_across_turns(llm):
    messages = [{"role": "user", "content": "List five animals that live in the sea, with a sentence on each."}]
    first = llm.chat(messages, greedy(40), use_tqdm=False)[0]
    messages += [
        {"role": "assistant", "content": first.outputs[0].text},
        {"role": "user", "content": "Now pick the largest of them."},
    ]
    second = llm.chat(messages, greedy(24), use_tqdm=False)[0]
    assert second.num_cached_tokens >= len(first.prompt_token_ids) // 16 * 16 > 0
    assert second.num_cached_tokens < len(second.prompt_token_ids)


def test_a_later_process_starts_from_the_prefix_cache_dir(tmp_path):
    prompt = "".join(f"Line {i}: the tide rose {i % 7} feet at dock {i % 5}.\n" for i in range(40))
    first = LLM("smollm2-135m", threads=2, prefix_cache_dir=str(tmp_path))
    cold = first.generate(prompt, greedy(16), use_tqdm=False)[0]
    assert cold.num_cached_tokens == 0
    with pytest.raises(ValueError, match="in use by another process"):
        LLM("smollm2-135m", threads=2, prefix_cache_dir=str(tmp_path))
    del first
    import gc
    gc.collect()  # the engine's writes finish and the directory's lock is let go
    later = LLM("smollm2-135m", threads=2, prefix_cache_dir=str(tmp_path))
    warm = later.generate(prompt, greedy(16), use_tqdm=False)[0]
    assert warm.num_cached_tokens >= len(cold.prompt_token_ids) - 16 > 0
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids


def test_streamed_pieces_join_to_the_whole_text(llm):
    whole = llm.generate(PROMPT, greedy(40), use_tqdm=False)[0].outputs[0].text
    pieces = list(llm.stream(PROMPT, greedy(40)))
    assert len(pieces) > 1
    assert "".join(pieces) == whole
    chat = [{"role": "user", "content": "Say hello."}]
    assert "".join(llm.stream(chat, greedy(16))) == llm.chat(chat, greedy(16), use_tqdm=False)[0].outputs[0].text


def test_structured_output_is_valid_against_its_schema(llm):
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    p = greedy(64, structured_outputs=StructuredOutputsParams(json=schema))
    out = llm.chat([{"role": "user", "content": "Invent a person: name and age, as JSON."}], p, use_tqdm=False)
    value = json.loads(out[0].outputs[0].text)
    assert set(value) == {"name", "age"}
    assert isinstance(value["name"], str) and isinstance(value["age"], int)


def test_logprobs_have_vllm_shape(llm):
    out = llm.generate(PROMPT, greedy(8, logprobs=3), use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == len(out.token_ids)
    for token, at in zip(out.token_ids, out.logprobs):
        assert token in at and at[token].rank == 1, "greedy takes the most likely token"
        assert len(at) == 3
        assert all(lp.logprob <= 0 for lp in at.values())
    assert out.cumulative_logprob == pytest.approx(sum(at[t].logprob for t, at in zip(out.token_ids, out.logprobs)))


def test_chat_with_a_tool_on_qwen():
    llm = LLM("qwen-coder-0.5b", threads=2)
    tools = [{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }]
    ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    out = llm.chat(ask, greedy(64), use_tqdm=False, tools=tools, tool_choice="required")[0].outputs[0]
    assert out.tool_calls, f"no call in {out.text!r}"
    call = out.tool_calls[0]["function"]
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"])["city"] == "Paris"
    assert out.text == ""
    with pytest.raises(ValueError, match="tool_choice"):
        llm.chat(ask, greedy(8), use_tqdm=False, tools=tools, tool_choice={"type": "function", "function": {"name": "nope"}})


HARMONY_CALL = ("<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant"
                "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}")


def test_replies_are_read_by_the_engines_readers(llm):
    parse = pld._native.parse_reply
    # gpt-oss's harmony: the reasoning apart, a message to functions.NAME a call...
    content, reasoning, calls = parse(HARMONY_CALL, "c", True, True)
    assert (content, reasoning) == ("", "Need weather.")
    assert json.loads(calls) == [{"id": "c-0", "type": "function",
                                  "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]
    # ... but not when tool_choice is none (or no tools were given): its body is content.
    assert parse(HARMONY_CALL, "c", True, False) == ("{\"city\":\"Paris\"}", "Need weather.", "[]")
    answer = "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant<|channel|>final<|message|>4"
    assert parse(answer, "c", True, False) == ("4", "Easy.", "[]")
    # <tool_call> blocks likewise: parsed when calls are allowed, left as text when not.
    blocks = 'Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    content, reasoning, calls = parse(blocks, "c", False, True)
    assert (content, reasoning) == ("Sure.", "")
    assert json.loads(calls)[0]["function"] == {"name": "f", "arguments": "{\"a\":1}"}
    assert parse(blocks, "c", False, False) == (blocks, "", "[]")
    # smollm2 does not write harmony: its structured output applies to the whole reply.
    assert not llm._engine.harmony
    json_object = SamplingParams(structured_outputs=StructuredOutputsParams(json_object=True))
    assert llm._engine.chat_grammar(json_object._json()) is None


def test_bad_settings_raise_value_errors_naming_the_field():
    for kwargs, field in [
        ({"temperature": 3.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -5}, "top_k"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"logprobs": 50}, "logprobs"),
    ]:
        with pytest.raises(ValueError, match=field):
            SamplingParams(**kwargs)
    with pytest.raises(ValueError, match="speculative_config"):
        LLM("smollm2-135m", speculative_config={"num_speculative_tokens": 4, "bogus": 1})
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        LLM("smollm2-135m", kv_cache_dtype="fp8")


def test_a_cache_type_is_asked_for_by_vllms_name(llm):
    assert llm.kv_cache_dtype in ("bf16", "f32")  # by the CPU's kernels: KvDtype::auto
    for name, dtype in [("f16", "f16"), ("float32", "f32"), ("bfloat16", "bf16"), ("q8_0", "q8_0")]:
        other = LLM("smollm2-135m", kv_cache_dtype=name, threads=2)
        assert other.kv_cache_dtype == dtype
        out = other.generate(PROMPT, greedy(16), use_tqdm=False)[0]
        assert len(out.outputs[0].token_ids) == 16


def test_model_errors_are_exceptions_with_pld_messages(tmp_path, llm):
    with pytest.raises(FileNotFoundError, match="model file not found"):
        LLM(str(tmp_path / "missing.gguf"))
    with pytest.raises(FileNotFoundError, match="unknown model 'no-such-model'"):
        LLM("no-such-model")
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + os.urandom(64))
    with pytest.raises(ValueError, match="cannot read model file"):
        LLM(str(corrupt))
    tiny = REPO / "crates" / "engine" / "tests" / "tiny" / "llama3.gguf"
    mamba = tmp_path / "mamba.gguf"
    mamba.write_bytes(tiny.read_bytes().replace(b"llama", b"mamba"))
    with pytest.raises(ValueError, match="unsupported model architecture 'mamba'"):
        LLM(str(mamba))
    short = LLM("smollm2-135m", max_model_len=32)
    with pytest.raises(ValueError, match="prompt is too long"):
        short.generate("word " * 100, use_tqdm=False)
    with pytest.raises(ValueError, match="sampling_params"):
        llm.generate(["a", "b"], [greedy()], use_tqdm=False)


def test_ctrl_c_interrupts_a_generation(plain):
    # A process started in the background by a non-interactive shell inherits SIGINT ignored, and
    # then interrupt_main does nothing: give the test Python's own handler.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.5, _thread.interrupt_main)
    timer.start()
    started = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        plain.generate(["Count from 1 to 5000, separated by commas: 1, 2, 3,"] * 4,
                       SamplingParams(temperature=0, max_tokens=4000), use_tqdm=False)
    assert time.perf_counter() - started < 30
    timer.cancel()
    # The engine is usable afterwards.
    assert plain.generate("Hello", greedy(4), use_tqdm=False)[0].outputs[0].token_ids


def test_a_small_kv_budget_preempts_and_keeps_every_output():
    """`kv_cache_bytes` as the server's `--kv-cache-bytes`: prompts that outgrow a small budget take
    turns (the newest preempted and resumed) and each output equals the prompt's alone; a request
    that could never fit raises ValueError naming the budget."""
    prompts = [
        "Counting from %d: %s," % (s, ", ".join(str(n) for n in range(s, s + 40)))
        for s in (100, 200, 300, 400)
    ]
    params = greedy(max_tokens=80)
    alone = [o.outputs[0].text for o in LLM("smollm2-135m", threads=2).generate(prompts, params)]
    # About two and a half of these sequences at their longest (about 210 positions of 22.5 KiB).
    small = LLM("smollm2-135m", threads=2, kv_cache_bytes=12 << 20, kv_cache_dtype="bf16")
    outs = small.generate(prompts, params)
    assert [o.outputs[0].text for o in outs] == alone
    with pytest.raises(ValueError, match="KV cache budget of %d bytes" % (12 << 20)):
        small.generate(prompts[:1], greedy(max_tokens=4000))
