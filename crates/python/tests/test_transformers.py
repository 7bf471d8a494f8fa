"""pld's drafter inside transformers' `generate` (`custom_generate=pld.transformers.prompt_lookup`)
on smollm2-135m loaded from its GGUF: the output is transformers' own greedy output, token for
token, and drafts are accepted. Skipped with the reason printed where torch or transformers is not
installed (CI does not install torch: its PyPI wheels bring gigabytes of CUDA libraries);
`tools/transformers/compare.py` runs the side-by-side with transformers' prompt lookup."""

import pathlib

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
pytest.importorskip("gguf", reason="gguf is not installed")

import pld.transformers  # noqa: E402

GGUF = pathlib.Path.home() / ".cache" / "pld" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_pld_drafter_gives_transformers_greedy_output():
    if not GGUF.exists():
        pld.LLM("smollm2-135m")  # fetches it
    tok = transformers.AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name, dtype=torch.float32)
    text = "Copy this list twice: apple, banana, cherry, damson, elderberry, fig.\n"
    ids = tok(text, return_tensors="pt")
    calls = [0]
    forward = model.forward

    def counted(*a, **kw):
        calls[0] += 1
        return forward(*a, **kw)

    model.forward = counted
    with torch.no_grad():
        plain = model.generate(**ids, max_new_tokens=48, do_sample=False)
        plain_calls, calls[0] = calls[0], 0
        ours = model.generate(**ids, max_new_tokens=48, do_sample=False,
                              custom_generate=pld.transformers.prompt_lookup,
                              pld_config={"num_speculative_tokens": 8})
    assert ours[0].tolist() == plain[0].tolist()
    assert calls[0] < plain_calls, f"{calls[0]} passes with drafts, {plain_calls} without"
