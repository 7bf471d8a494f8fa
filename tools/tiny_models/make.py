#!/usr/bin/env python3
"""Build tiny random-weight GGUF checkpoints plus Hugging Face reference outputs.

For each model below this script

  1. builds a tiny model with Hugging Face transformers (float32, eager attention) and
     re-initialises every parameter from a fixed seed with weights large enough that the
     predictions are confident (top-1 vs top-2 log-prob margins mostly > 0.1);
  2. maps the weights to llama.cpp's GGUF layout (tensor names, q/k row permutation for the
     `llama` arch, Gemma's `1 + w` norms, fused Phi-3 tensors, rope factor tensors) and stores
     them in the model's weight type (F32 / F16 / Q8_0 / Q4_0 / Q5_0), quantizing with
     `gguf.quants.quantize`;
  3. turns the stored values back into float32 (dequantize, undo the layout mapping) and loads
     them into the torch model, so that the reference describes exactly the weights in the file;
  4. records float32 reference outputs (top-8 log-probs per position and a 24-token greedy
     continuation) for three token-id prompts;
  5. writes `<name>.gguf` with `gguf.GGUFWriter` and `<name>.json` with the references;
  6. checks the result: reloads the GGUF with `gguf.GGUFReader`, asserts metadata, tensor names,
     shapes and types, rebuilds a torch model from the file's contents and asserts it reproduces
     the reference logits exactly; then runs `gguf_forward.py`, an independent float64 numpy
     forward pass with llama.cpp's semantics over the GGUF alone, against the JSON.

The tokenizer is a truncated copy of SmolLM2's byte-level BPE tokenizer (first V tokens and the
merges that stay within them), read from a SmolLM2 GGUF file.

Run:  /work/pyenv/venv/bin/python tools/tiny_models/make.py [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import transformers
import gguf
from gguf import GGMLQuantizationType as QT

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gguf_forward  # noqa: E402  (independent GGUF forward pass used as a check)

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "crates" / "engine" / "tests" / "tiny"
DEFAULT_TOKENIZER_GGUF = Path("/root/.cache/pld/models/SmolLM2-135M-Instruct.Q4_1.gguf")

V = 512  # vocabulary size: 17 control tokens (0..16), 235 byte symbols (17..251), 260 merged tokens
CTX = 256  # max_position_embeddings / {arch}.context_length
GREEDY_TOKENS = 24
TOP_K = 8
PROMPT_SEED = 1234

# Scale of the random weights (see `reinit`).
# (With transformers' default init, std 0.02, logits are flat and greedy decoding falls into
# one repeated token; these scales give confident, varied predictions.)
W_STD = 0.2  # every matrix except the output projection
OUT_STD = 0.8  # output projection (lm_head): makes predictions confident
NORM_STD = 0.1  # norm weights are 1 + NORM_STD * randn (effective scale, also for Gemma)
# Gemma: the input embedding (times sqrt(64) = 8) is tied to the output, so the residual stream
# points at the current token and greedy decoding just repeats it. Large gains on the post-
# attention / post-ffn norms (effective 1 + GEMMA_POST_NORM + 0.1 randn) let the layers dominate.
GEMMA_OUT_STD = 0.5
GEMMA_POST_NORM = 8.0
# Seed search (see `make`): every greedy step must have a top-1 vs top-2 log-prob gap of at
# least MIN_GREEDY_MARGIN and every greedy continuation at least MIN_DISTINCT distinct tokens.
MIN_GREEDY_MARGIN = 0.1
MIN_DISTINCT = 6
SEED_TRIES = 400
CONTROL_SHRINK = 0.1  # output rows of control tokens are scaled down so greedy never emits them


# --------------------------------------------------------------------------------------------
# Tokenizer
# --------------------------------------------------------------------------------------------


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the 256 byte-level BPE symbols)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


@dataclass
class Tokenizer:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    pre: str
    bos: int
    eos: int
    unk: int
    pad: int
    byte_ids: list[int]  # ids of the byte symbols the vocabulary has
    first_normal: int  # lowest id that is not a control token

    def describe(self) -> dict:
        return {
            "source": "SmolLM2-135M-Instruct (truncated)",
            "vocab_size": len(self.tokens),
            "pre": self.pre,
            "bos": self.bos,
            "eos": self.eos,
            "unk": self.unk,
            "pad": self.pad,
            "control_ids": [i for i, t in enumerate(self.types) if t == int(gguf.TokenType.CONTROL)],
            "byte_symbol_ids": [min(self.byte_ids), max(self.byte_ids)],
            "byte_symbols": len(self.byte_ids),
            "merges": len(self.merges),
        }


def load_tokenizer(path: Path, vocab: int) -> Tokenizer:
    r = gguf.GGUFReader(str(path))
    f = r.fields
    tokens = list(f["tokenizer.ggml.tokens"].contents())[:vocab]
    types = [int(t) for t in f["tokenizer.ggml.token_type"].contents()][:vocab]
    merges_all = list(f["tokenizer.ggml.merges"].contents())
    pre = f["tokenizer.ggml.pre"].contents()
    model = f["tokenizer.ggml.model"].contents()
    assert model == "gpt2", model
    ids = {t: i for i, t in enumerate(tokens)}
    # Keep a merge only when both parts and the merged token all lie within the first V tokens.
    merges = []
    for m in merges_all:
        a, b = m.split(" ")
        if a in ids and b in ids and (a + b) in ids:
            merges.append(m)
    # Every byte symbol of the source vocabulary must survive the truncation. (SmolLM2's vocabulary
    # itself lacks 21 of the 256 symbols: bytes that never occur in UTF-8 text, 0xC0 0xC1 0xF5-0xFF,
    # and the control bytes 0x04 0x06 0x13 0x14 0x16 0x1D; it holds the other 235 at ids 17..251.)
    b2u = bytes_to_unicode()
    all_ids = {t: i for i, t in enumerate(f["tokenizer.ggml.tokens"].contents())}
    in_source = [b for b in range(256) if b2u[b] in all_ids]
    assert all(b2u[b] in ids for b in in_source), "a byte symbol lies beyond the first V tokens"
    byte_ids = [ids[b2u[b]] for b in in_source]
    special = {}
    for key in ("bos", "eos", "unknown", "padding"):
        special[key] = int(f[f"tokenizer.ggml.{key}_token_id"].contents())
        assert special[key] < vocab
    first_normal = next(i for i, t in enumerate(types) if t != int(gguf.TokenType.CONTROL))
    assert all(t == int(gguf.TokenType.CONTROL) for t in types[:first_normal])
    assert all(t != int(gguf.TokenType.CONTROL) for t in types[first_normal:])
    return Tokenizer(tokens, types, merges, pre, special["bos"], special["eos"], special["unknown"],
                     special["padding"], byte_ids, first_normal)


# --------------------------------------------------------------------------------------------
# Prompts
# --------------------------------------------------------------------------------------------


def make_prompts(tok: Tokenizer) -> list[list[int]]:
    """Three prompts of lengths 12, 24 and 40 from ids in [first_normal, V); the last one repeats
    an 8-token sub-sequence three times (so prompt-lookup drafting finds matches)."""
    rng = np.random.default_rng(PROMPT_SEED)
    lo, hi = tok.first_normal, len(tok.tokens)
    draw = lambda n: [int(x) for x in rng.integers(lo, hi, size=n)]
    a = draw(8)
    repeated = a + draw(5) + a + draw(6) + a + draw(5)
    prompts = [draw(12), draw(24), repeated]
    assert [len(p) for p in prompts] == [12, 24, 40]
    return prompts


# --------------------------------------------------------------------------------------------
# Layout mapping HF <-> GGUF
# --------------------------------------------------------------------------------------------


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter permutation for the `llama` arch: within each head, rows are
    reordered from HF's halves layout (rotate_half) to interleaved pairs."""
    rows = w.shape[0]
    return w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of `permute_qk`."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@dataclass
class TensorSpec:
    gguf_name: str
    hf_name: str | None  # None for tensors that are not model parameters (rope factors)
    to_gguf: Callable[[np.ndarray], np.ndarray] = lambda w: w
    from_gguf: Callable[[np.ndarray], np.ndarray] = lambda w: w
    qtype: QT = QT.F32
    value: np.ndarray | None = None  # for non-parameter tensors
    # Rows a..b of the parameter's second-to-last axis, where one parameter is stored as several
    # tensors (transformers' fused expert gate_up_proj as GGUF's ffn_gate_exps and ffn_up_exps).
    part: tuple[int, int] | None = None
    # One expert (an index along the first axis) of a 3-D parameter, stored as its own tensor
    # (the older GGUF layout of Mixtral); `part` then applies within it.
    expert: int | None = None
    # A strided view of the torch parameter that is this tensor (gpt-oss's interleaved gate and up
    # columns, transposed), written through when the decoded values are loaded back.
    view: Callable[["torch.Tensor"], "torch.Tensor"] | None = None


@dataclass
class ModelDef:
    name: str
    arch: str  # GGUF architecture
    weights: str  # the main weight type ("F32", "F16", "Q8_0", "Q4_0"), the JSON's "weights"
    seed: int
    build: Callable[[Tokenizer], "transformers.PreTrainedModel"]
    tensor_specs: Callable[["transformers.PreTrainedModel"], list[TensorSpec]]
    metadata: Callable[["transformers.PreTrainedModel"], dict]  # extra {arch}.* keys
    checks: Callable[["transformers.PreTrainedModel"], list[str]] = lambda m: []
    gemma_norms: bool = False  # norms hold w with effective scale 1 + w
    out_std: float = OUT_STD  # scale of the output projection's random init
    weights_detail: str = ""  # the exceptions, for the JSON's "weights_detail"
    notes: list[str] = field(default_factory=list)
    after_init: Callable[["transformers.PreTrainedModel"], None] = lambda m: None  # after `reinit`


LAYER_MAP_LLAMA = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
LAYER_MAP_QWEN3 = {**LAYER_MAP_LLAMA, "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
LAYER_MAP_GEMMA3 = {
    **LAYER_MAP_QWEN3,
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
LAYER_MAP_PHI3 = {
    "attn_norm": "input_layernorm",
    "attn_qkv": "self_attn.qkv_proj",  # HF rows are already [q; k; v], as llama.cpp stores them
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_up": "mlp.gate_up_proj",  # HF rows are [gate; up], stored as is
    "ffn_down": "mlp.down_proj",
}


def standard_specs(model, layer_map: dict, matrix_type: Callable[[str], QT], *, permute: bool,
                   gemma_norms: bool, tied: bool) -> list[TensorSpec]:
    """Tensor specs for a decoder of the llama family. `matrix_type(gguf_name)` gives the
    storage type of each 2-D tensor; 1-D tensors (norms) are F32."""
    cfg = model.config
    specs = []

    def add(gname: str, hname: str, ndim: int):
        to_g, from_g = (lambda w: w), (lambda w: w)
        if permute and gname.endswith("attn_q.weight"):
            n = cfg.num_attention_heads
            to_g, from_g = (lambda w, n=n: permute_qk(w, n)), (lambda w, n=n: unpermute_qk(w, n))
        elif permute and gname.endswith("attn_k.weight"):
            n = cfg.num_key_value_heads
            to_g, from_g = (lambda w, n=n: permute_qk(w, n)), (lambda w, n=n: unpermute_qk(w, n))
        elif gemma_norms and ndim == 1:
            # Gemma's RMSNorm computes x * (1 + w); llama.cpp stores (1 + w).
            to_g, from_g = (lambda w: (w + np.float32(1.0)).astype(np.float32)), (lambda w: (w - np.float32(1.0)).astype(np.float32))
        qtype = matrix_type(gname) if ndim == 2 else QT.F32
        specs.append(TensorSpec(gname, hname, to_g, from_g, qtype))

    specs.append(TensorSpec("token_embd.weight", "model.embed_tokens.weight", qtype=matrix_type("token_embd.weight")))
    for i in range(cfg.num_hidden_layers):
        for gsuf, hsuf in layer_map.items():
            hname = f"model.layers.{i}.{hsuf}.weight"
            ndim = model.get_parameter(hname).ndim
            add(f"blk.{i}.{gsuf}.weight", hname, ndim)
    add("output_norm.weight", "model.norm.weight", 1)
    if not tied:
        specs.append(TensorSpec("output.weight", "lm_head.weight", qtype=matrix_type("output.weight")))
    return specs


def common_config(tok: Tokenizer, **kw) -> dict:
    base = dict(
        vocab_size=len(tok.tokens),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=CTX,
        rms_norm_eps=1e-6,
        bos_token_id=tok.bos,
        eos_token_id=tok.eos,
        pad_token_id=tok.pad,
        tie_word_embeddings=False,
    )
    base.update(kw)
    return base


def instantiate(cls, config) -> "transformers.PreTrainedModel":
    model = cls._from_config(config, attn_implementation="eager", dtype=torch.float32)
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    return model.eval()


# ---- llama3 ---------------------------------------------------------------------------------

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}


def llama3_rope_factors(head_dim: int, p: dict) -> np.ndarray:
    """llama.cpp's `rope_freqs` for Llama 3 scaling: the engine divides each inv_freq by it."""
    base, factor = p["rope_theta"], p["factor"]
    lo, hi, orig = p["low_freq_factor"], p["high_freq_factor"], p["original_max_position_embeddings"]
    low_wavelen, high_wavelen = orig / lo, orig / hi
    out = []
    for i in range(0, head_dim, 2):
        inv_freq = 1.0 / base ** (i / head_dim)
        wavelen = 2 * math.pi / inv_freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (orig / wavelen - lo) / (hi - lo)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def build_llama3(tok):
    cfg = transformers.LlamaConfig(**common_config(tok, rope_parameters=dict(LLAMA3_ROPE)))
    return instantiate(transformers.LlamaForCausalLM, cfg)


def specs_llama3(model):
    specs = standard_specs(model, LAYER_MAP_LLAMA, lambda n: QT.F16, permute=True, gemma_norms=False, tied=False)
    factors = llama3_rope_factors(model.config.head_dim, LLAMA3_ROPE)
    specs.append(TensorSpec("rope_freqs.weight", None, value=factors))
    return specs


def check_llama3(model):
    hd = model.config.head_dim
    base = 1.0 / (LLAMA3_ROPE["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ours = base / torch.from_numpy(llama3_rope_factors(hd, LLAMA3_ROPE))
    hf = model.model.rotary_emb.inv_freq
    assert torch.allclose(ours, hf, rtol=1e-6, atol=0), (ours, hf)
    factors = llama3_rope_factors(hd, LLAMA3_ROPE)
    assert len(set(factors.round(6).tolist())) >= 3, factors
    return [f"rope_freqs {factors.round(6).tolist()} reproduce transformers' llama3 inv_freq "
            f"(max rel err {float(((ours - hf).abs() / hf).max()):.2e})"]


# ---- mistral --------------------------------------------------------------------------------


def build_mistral(tok, sliding_window=8, layers=2):
    cfg = transformers.MistralConfig(**common_config(
        tok, sliding_window=sliding_window, num_hidden_layers=layers,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}))
    return instantiate(transformers.MistralForCausalLM, cfg)


def specs_mistral(model):
    return standard_specs(model, LAYER_MAP_LLAMA, lambda n: QT.Q8_0, permute=True, gemma_norms=False, tied=False)


def window_checks(model, build_unwindowed: Callable[[], "transformers.PreTrainedModel"], window: int) -> list[str]:
    """The window must matter: without it, logits at positions >= window change while the
    earlier ones stay identical."""
    other = build_unwindowed()
    other.load_state_dict(model.state_dict())
    ids = torch.tensor([list(range(20, 20 + 3 * window))])
    with torch.no_grad():
        a = model(ids).logits[0]
        b = other(ids).logits[0]
    early = (a[:window] - b[:window]).abs().max().item()
    late = (a[window:] - b[window:]).abs().amax(dim=-1)
    assert early == 0.0, early
    assert (late > 1e-4).all(), late
    return [f"sliding window applied: disabling it leaves positions < {window} identical and changes "
            f"every later position (min max|dlogit| {late.min().item():.3g})"]


def window_rule_check(tok) -> str:
    """Empirically pin the mask rule with a 1-layer windowed Mistral: position i sees j iff
    0 <= i - j < W."""
    torch.manual_seed(0)
    m = build_mistral(tok, sliding_window=8, layers=1)
    reinit(m, torch.Generator().manual_seed(0), gemma_norms=False, control_ids=tok.first_normal, out_std=OUT_STD)
    ids = torch.tensor([list(range(30, 60))])
    i = 20
    with torch.no_grad():
        base = m(ids).logits[0, i]
        changed = {}
        for j in (i - 9, i - 8, i - 7, i - 1):
            alt = ids.clone()
            alt[0, j] = 100
            changed[i - j] = (m(alt).logits[0, i] - base).abs().max().item() > 0
    assert changed == {9: False, 8: False, 7: True, 1: True}, changed
    return "position i attends j iff 0 <= i - j < W (W = sliding_window; W tokens including itself)"


def check_mistral(model):
    tok = model._tiny_tok
    return window_checks(model, lambda: build_mistral(tok, sliding_window=None), 8)


# ---- qwen3 ----------------------------------------------------------------------------------


def build_qwen3(tok):
    cfg = transformers.Qwen3Config(**common_config(
        tok, head_dim=32, attention_bias=False, use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}))
    return instantiate(transformers.Qwen3ForCausalLM, cfg)


def specs_qwen3(model):
    return standard_specs(model, LAYER_MAP_QWEN3, lambda n: QT.F32, permute=False, gemma_norms=False, tied=False)


def check_qwen3(model):
    assert not any(n.endswith("bias") for n, _ in model.named_parameters())
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (4 * 32, 64)
    return ["no biases; q_proj [128, 64] (key_length 32 != 64 / 4)"]


# ---- gemma3 ---------------------------------------------------------------------------------

GEMMA3_LAYER_TYPES = ["sliding_attention"] * 5 + ["full_attention"]


def build_gemma3(tok, sliding_window=8):
    cfg = transformers.Gemma3TextConfig(**common_config(
        tok,
        num_hidden_layers=6,
        sliding_window=sliding_window,
        layer_types=list(GEMMA3_LAYER_TYPES),
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
        query_pre_attn_scalar=16,
        hidden_activation="gelu_pytorch_tanh",
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
        tie_word_embeddings=True,
    ))
    return instantiate(transformers.Gemma3ForCausalLM, cfg)


def specs_gemma3(model, matrix_type=lambda n: QT.F32):
    return standard_specs(model, LAYER_MAP_GEMMA3, matrix_type, permute=False, gemma_norms=True, tied=True)


def gemma3_q4_type(name: str) -> QT:
    if name == "token_embd.weight":
        return QT.Q8_0
    if name.endswith("ffn_down.weight"):
        return QT.Q5_0
    return QT.Q4_0


def check_gemma3(model):
    cfg = model.config
    assert cfg.layer_types == GEMMA3_LAYER_TYPES, cfg.layer_types
    attn = [l.self_attn for l in model.model.layers]
    assert [a.sliding_window for a in attn] == [8] * 5 + [None], [a.sliding_window for a in attn]
    assert abs(attn[0].scaling - 0.25) < 1e-12
    rot = model.model.rotary_emb
    hd = cfg.head_dim
    exps = torch.arange(0, hd, 2, dtype=torch.float32) / hd
    assert torch.allclose(rot.sliding_attention_inv_freq, 1.0 / 10000.0 ** exps)
    assert torch.allclose(rot.full_attention_inv_freq, 1.0 / 1000000.0 ** exps)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "not tied"
    assert float(model.model.embed_tokens.embed_scale) == 8.0
    tok = model._tiny_tok
    out = window_checks(model, lambda: build_gemma3(tok, sliding_window=10000), 8)
    return out + ["layer_types [sliding]*5 + [full]; rope bases: sliding 1e4, full 1e6; attention scale "
                  "16**-0.5; embeddings scaled by sqrt(64) = 8; lm_head tied"]


# ---- phi3 -----------------------------------------------------------------------------------

PHI3_SHORT = [1.0, 1.1, 1.25, 1.4, 1.55, 1.7, 1.85, 2.0]
PHI3_LONG = [2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]


def build_phi3(tok):
    kw = common_config(
        tok,
        original_max_position_embeddings=CTX,
        sliding_window=None,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                         "short_factor": list(PHI3_SHORT), "long_factor": list(PHI3_LONG)},
    )
    kw.pop("head_dim")  # Phi3Config derives it (64 / 4 = 16)
    cfg = transformers.Phi3Config(**kw)
    return instantiate(transformers.Phi3ForCausalLM, cfg)


def specs_phi3(model):
    specs = standard_specs(model, LAYER_MAP_PHI3, lambda n: QT.F32, permute=False, gemma_norms=False, tied=False)
    specs.append(TensorSpec("rope_factors_long.weight", None, value=np.array(PHI3_LONG, dtype=np.float32)))
    specs.append(TensorSpec("rope_factors_short.weight", None, value=np.array(PHI3_SHORT, dtype=np.float32)))
    return specs


def check_phi3(model):
    rot = model.model.rotary_emb
    hd = model.config.hidden_size // model.config.num_attention_heads
    exps = torch.arange(0, hd, 2, dtype=torch.float32) / hd
    expect = 1.0 / (torch.tensor(PHI3_SHORT) * 10000.0 ** exps)
    assert torch.allclose(rot.inv_freq, expect, rtol=1e-6), (rot.inv_freq, expect)
    assert rot.attention_scaling == 1.0, rot.attention_scaling
    a = model.model.layers[0].self_attn
    assert a.qkv_proj.weight.shape == ((4 + 2 * 2) * 16, 64)
    assert model.model.layers[0].mlp.gate_up_proj.weight.shape == (2 * 128, 64)
    return ["longrope: inv_freq = 1 / (short_factor * base^(2i/d)), attention scaling 1.0 (original = max = 256)"]


# ---- model table ------------------------------------------------------------------------------


def meta_sliding(window):
    return lambda model: {"attention.sliding_window": window}


# Seeds: where the search in `make` ended when started from 1000, 2000, ..., 6000 (so a rerun tries
# just one; with other library versions it may move on).
MODELS = [
    ModelDef("llama3", "llama", "F16", 1000, build_llama3, specs_llama3,
             lambda m: {}, check_llama3, weights_detail="F16 matrices; norms and rope_freqs F32"),
    ModelDef("mistral", "llama", "Q8_0", 2088, build_mistral, specs_mistral,
             meta_sliding(8), check_mistral, weights_detail="Q8_0 matrices (token_embd and output too); norms F32"),
    ModelDef("qwen3", "qwen3", "F32", 3002, build_qwen3, specs_qwen3, lambda m: {}, check_qwen3,
             weights_detail="all F32"),
    ModelDef("gemma3", "gemma3", "F32", 4021, build_gemma3, specs_gemma3,
             lambda m: {"attention.sliding_window": 8, "rope.freq_base_swa": 10000.0}, check_gemma3,
             gemma_norms=True, out_std=GEMMA_OUT_STD, weights_detail="all F32"),
    ModelDef("phi3", "phi3", "F32", 5017, build_phi3, specs_phi3,
             lambda m: {"rope.scaling.original_context_length": CTX, "rope.scaling.attn_factor": 1.0},
             check_phi3, weights_detail="all F32 (fused attn_qkv and ffn_up)"),
    ModelDef("gemma3-q4", "gemma3", "Q4_0", 6099, build_gemma3,
             lambda m: specs_gemma3(m, gemma3_q4_type),
             lambda m: {"attention.sliding_window": 8, "rope.freq_base_swa": 10000.0}, check_gemma3,
             gemma_norms=True, out_std=GEMMA_OUT_STD,
             weights_detail="Q4_0 attn_q/k/v/output, ffn_gate/up; Q5_0 ffn_down; Q8_0 token_embd (tied); norms F32"),
]

import moe  # noqa: E402  (the mixture-of-experts models, built from this module's pieces)

MODELS += moe.models(sys.modules[__name__])

import gpt_oss  # noqa: E402

MODELS += gpt_oss.models(sys.modules[__name__])


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------


def reinit(model, gen: torch.Generator, *, gemma_norms: bool, control_ids: int, out_std: float) -> None:
    """Overwrite every parameter (in named_parameters order, so deterministic) with larger random
    values than transformers' default init: matrices W_STD * randn, the output projection
    out_std * randn (its rows of control tokens shrunk), norms 1 + NORM_STD * randn (Gemma: the
    parameter w is NORM_STD * randn, as it computes x * (1 + w), plus GEMMA_POST_NORM for the
    post-attention / post-ffn norms)."""
    out_name = "model.embed_tokens.weight" if model.config.tie_word_embeddings else "lm_head.weight"
    with torch.no_grad():
        for name, p in model.named_parameters():  # tied weights appear once
            r = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if p.ndim == 1:
                offset = 1.0
                if gemma_norms:
                    offset = GEMMA_POST_NORM if ".post_" in name else 0.0
                p.copy_(NORM_STD * r + offset)
            elif name == out_name:
                r = out_std * r
                r[:control_ids] *= CONTROL_SHRINK
                p.copy_(r)
            else:
                p.copy_(W_STD * r)


def encode(spec: TensorSpec, model) -> tuple[np.ndarray, QT, np.ndarray]:
    """Returns (array to hand to GGUFWriter, its type, the float32 values it decodes to), all in
    GGUF row order."""
    if spec.value is not None:
        w = spec.value.astype(np.float32)
    else:
        p = model.get_parameter(spec.hf_name).detach()
        if spec.view is not None:
            p = spec.view(p)
        w = p.numpy().astype(np.float32)
        if spec.expert is not None:
            w = w[spec.expert]
        if spec.part is not None:
            w = w[..., spec.part[0]:spec.part[1], :]
        w = spec.to_gguf(w)
    w = np.ascontiguousarray(w)
    if spec.qtype == QT.F32:
        return w, QT.F32, w.copy()
    if spec.qtype == QT.F16:
        h = w.astype(np.float16)
        return h, QT.F16, h.astype(np.float32)
    q = gguf.quants.quantize(w, spec.qtype)
    return q, spec.qtype, gguf.quants.dequantize(q, spec.qtype).astype(np.float32).reshape(w.shape)


def load_decoded(model, specs: list[TensorSpec], decoded: dict[str, np.ndarray]) -> None:
    """Loads float32 values in GGUF layout (as decoded from the file) into the torch model."""
    with torch.no_grad():
        for s in specs:
            if s.hf_name is None:
                continue
            w = s.from_gguf(decoded[s.gguf_name])
            p = model.get_parameter(s.hf_name)
            if s.view is not None:
                p = s.view(p)
            if s.expert is not None:
                p = p[s.expert]
            if s.part is not None:
                p = p[..., s.part[0]:s.part[1], :]
            assert tuple(w.shape) == tuple(p.shape), (s.gguf_name, w.shape, p.shape)
            p.copy_(torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)))


# --------------------------------------------------------------------------------------------
# GGUF writing and reading back
# --------------------------------------------------------------------------------------------

FILE_TYPE = {"F32": 0, "F16": 1, "Q4_0": 2, "Q8_0": 7, "MXFP4": 38}


def gguf_metadata(mdef: ModelDef, model) -> dict[str, object]:
    """The {arch}.* keys (without prefix)."""
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    rp = cfg.rope_parameters
    theta = rp["full_attention"]["rope_theta"] if "full_attention" in rp else rp["rope_theta"]
    meta = {
        "context_length": CTX,
        "embedding_length": cfg.hidden_size,
        "block_count": cfg.num_hidden_layers,
        "feed_forward_length": cfg.intermediate_size,
        "attention.head_count": cfg.num_attention_heads,
        "attention.head_count_kv": cfg.num_key_value_heads,
        "attention.key_length": head_dim,
        "attention.value_length": head_dim,
        "rope.dimension_count": head_dim,
        "rope.freq_base": float(theta),
        "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
        "vocab_size": cfg.vocab_size,
    }
    meta.update(mdef.metadata(model))
    return meta


def write_gguf(path: Path, mdef: ModelDef, model, tok: Tokenizer, meta: dict, tensors: list[tuple[str, np.ndarray, QT]]):
    w = gguf.GGUFWriter(str(path), mdef.arch)
    w.add_name(f"pld tiny {mdef.name}")
    w.add_file_type(FILE_TYPE[mdef.weights])
    for key, value in meta.items():
        full = f"{mdef.arch}.{key}"
        if isinstance(value, float):
            w.add_float32(full, value)
        elif isinstance(value, int):
            w.add_uint32(full, value)
        elif isinstance(value, str):
            w.add_string(full, value)
        else:
            raise TypeError(key)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(tok.pre)
    w.add_token_list(tok.tokens)
    w.add_token_types(tok.types)
    w.add_token_merges(tok.merges)
    w.add_bos_token_id(tok.bos)
    w.add_eos_token_id(tok.eos)
    w.add_unk_token_id(tok.unk)
    w.add_pad_token_id(tok.pad)
    w.add_add_bos_token(False)
    w.add_add_space_prefix(False)
    for name, arr, qtype in tensors:
        if qtype in (QT.F32, QT.F16):
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def verify_gguf(path: Path, mdef: ModelDef, tok: Tokenizer, meta: dict,
                tensors: list[tuple[str, np.ndarray, QT]], decoded: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Reloads the file, asserts it holds what we meant to write, and returns its tensors decoded
    to float32 (GGUF row order)."""
    r = gguf.GGUFReader(str(path))
    f = r.fields
    assert f["general.architecture"].contents() == mdef.arch
    for key, value in meta.items():
        got = f[f"{mdef.arch}.{key}"].contents()
        if isinstance(value, float):
            assert abs(got - value) <= 1e-6 * abs(value), (key, got, value)
            assert f[f"{mdef.arch}.{key}"].types == [gguf.GGUFValueType.FLOAT32]
        elif isinstance(value, str):
            assert got == value and f[f"{mdef.arch}.{key}"].types == [gguf.GGUFValueType.STRING], (key, got)
        else:
            assert got == value, (key, got, value)
            assert f[f"{mdef.arch}.{key}"].types == [gguf.GGUFValueType.UINT32]
    assert f["tokenizer.ggml.model"].contents() == "gpt2"
    assert f["tokenizer.ggml.pre"].contents() == tok.pre
    assert list(f["tokenizer.ggml.tokens"].contents()) == tok.tokens
    assert [int(t) for t in f["tokenizer.ggml.token_type"].contents()] == tok.types
    assert list(f["tokenizer.ggml.merges"].contents()) == tok.merges
    assert f["tokenizer.ggml.bos_token_id"].contents() == tok.bos
    assert f["tokenizer.ggml.eos_token_id"].contents() == tok.eos
    assert f["tokenizer.ggml.add_bos_token"].contents() is False
    assert "tokenizer.chat_template" not in f
    got = {t.name: t for t in r.tensors}
    assert list(got) == [n for n, _, _ in tensors], "tensor names / order"
    out = {}
    for name, arr, qtype in tensors:
        t = got[name]
        assert t.tensor_type == qtype, (name, t.tensor_type, qtype)
        shape = decoded[name].shape
        assert tuple(int(x) for x in t.shape) == tuple(reversed(shape)), (name, t.shape, shape)
        if qtype == QT.F32:
            vals = np.array(t.data, dtype=np.float32).reshape(shape)
        elif qtype == QT.F16:
            vals = np.array(t.data, dtype=np.float16).astype(np.float32).reshape(shape)
        else:
            vals = gguf.quants.dequantize(np.array(t.data), qtype).astype(np.float32).reshape(shape)
        assert np.array_equal(vals, decoded[name]), name
        out[name] = vals
    return out


# --------------------------------------------------------------------------------------------
# References
# --------------------------------------------------------------------------------------------


def logits_of(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def margin(logp_row: torch.Tensor) -> float:
    top2 = torch.topk(logp_row, 2).values
    return float(top2[0] - top2[1])


def reference_case(model, ids: list[int], tok: Tokenizer) -> tuple[dict, list[float]]:
    logp = torch.log_softmax(logits_of(model, ids), dim=-1)
    vals, idx = torch.topk(logp, TOP_K, dim=-1)
    top = [[[int(i), round(float(v), 6)] for i, v in zip(ri, rv)] for ri, rv in zip(idx, vals)]
    margins = [margin(row) for row in logp]
    # Greedy continuation: full recomputation each step (no cache), argmax of float32 logits.
    seq = list(ids)
    greedy, greedy_margins = [], []
    for _ in range(GREEDY_TOKENS):
        row = torch.log_softmax(logits_of(model, seq)[-1], dim=-1)
        nxt = int(torch.argmax(row))
        greedy.append(nxt)
        greedy_margins.append(margin(row))
        seq.append(nxt)
    # Cross-check with transformers' own generate (KV cache path).
    with torch.no_grad():
        gen = model.generate(torch.tensor([ids]), max_new_tokens=GREEDY_TOKENS, min_new_tokens=GREEDY_TOKENS,
                             do_sample=False, pad_token_id=tok.pad)
    assert gen[0, len(ids):].tolist() == greedy, (gen[0, len(ids):].tolist(), greedy)
    assert all(t >= tok.first_normal for t in greedy), f"greedy emitted a control token: {greedy}"
    case = {
        "ids": ids,
        "top": top,
        "greedy": greedy,
        "greedy_min_margin": round(min(greedy_margins), 6),
        # top-1 minus top-2 log-prob at each greedy step
        "greedy_margins": [round(m, 4) for m in greedy_margins],
    }
    return case, margins + greedy_margins


def json_safe(x):
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    if isinstance(x, torch.dtype):
        return str(x).removeprefix("torch.")
    return str(x)


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def attempt(mdef: ModelDef, tok: Tokenizer, prompts: list[list[int]], seed: int):
    """Builds the model from `seed`, fixes its weights to what the GGUF will hold and computes
    the references."""
    torch.manual_seed(seed)
    model = mdef.build(tok)
    model._tiny_tok = tok
    model._tiny_prompts = prompts
    reinit(model, torch.Generator().manual_seed(seed), gemma_norms=mdef.gemma_norms,
           control_ids=tok.first_normal, out_std=mdef.out_std)
    mdef.after_init(model)

    # GGUF tensors and the float32 values they decode to; load those into the model.
    specs = mdef.tensor_specs(model)
    tensors, decoded = [], {}
    for s in specs:
        arr, qtype, dec = encode(s, model)
        tensors.append((s.gguf_name, arr, qtype))
        decoded[s.gguf_name] = dec
    load_decoded(model, specs, decoded)

    # References.
    cases, margins = [], []
    for ids in prompts:
        case, m = reference_case(model, ids, tok)
        cases.append(case)
        margins += m
    return model, specs, tensors, decoded, cases, np.array(margins)


def make(mdef: ModelDef, tok: Tokenizer, prompts: list[list[int]], out: Path, window_rule: str) -> None:
    print(f"== {mdef.name}")
    # Deterministic seed search: the first of seed, seed + 1, ... whose greedy continuations never
    # come within MIN_GREEDY_MARGIN of a tie (so engines with slightly different rounding, f16 or
    # quantized activations, still reproduce them) and do not collapse into a short loop.
    for k in range(SEED_TRIES):
        seed = mdef.seed + k
        model, specs, tensors, decoded, cases, margins = attempt(mdef, tok, prompts, seed)
        worst = min(c["greedy_min_margin"] for c in cases)
        distinct = min(len(set(c["greedy"])) for c in cases)
        if worst >= MIN_GREEDY_MARGIN and distinct >= MIN_DISTINCT:
            break
        print(f"   seed {seed}: min greedy margin {worst:.4f}, min distinct greedy tokens {distinct}; next seed", flush=True)
    else:
        sys.exit(f"{mdef.name}: no seed among {SEED_TRIES} passes the greedy checks")
    notes = mdef.checks(model)
    print(f"   seed {seed}; top-1 margin: median {np.median(margins):.3f}, > 0.1 for {100 * (margins > 0.1).mean():.0f}% "
          f"of positions, min greedy margin {worst:.4f}, distinct greedy tokens "
          f"{[len(set(c['greedy'])) for c in cases]}")

    # Write and verify the GGUF.
    gguf_path = out / f"{mdef.name}.gguf"
    meta = gguf_metadata(mdef, model)
    write_gguf(gguf_path, mdef, model, tok, meta, tensors)
    from_file = verify_gguf(gguf_path, mdef, tok, meta, tensors, decoded)

    # Rebuild a fresh model from the file's contents; it must reproduce the reference logits.
    torch.manual_seed(0)
    fresh = mdef.build(tok)
    fresh._tiny_tok = tok
    load_decoded(fresh, specs, from_file)
    for ids, case in zip(prompts, cases):
        a, b = logits_of(model, ids), logits_of(fresh, ids)
        assert torch.equal(a, b), float((a - b).abs().max())
        logp = torch.log_softmax(b, dim=-1)
        for pos, row in enumerate(case["top"]):
            for i, lp in row:
                assert abs(float(logp[pos, i]) - lp) <= 1e-6
    notes.append("model rebuilt from the GGUF's tensors reproduces the reference logits exactly")
    if getattr(model.config, "sliding_window", None):
        notes.append("sliding window: " + window_rule)

    ref = {
        "name": mdef.name,
        "arch": mdef.arch,
        "gguf": gguf_path.name,
        "weights": mdef.weights,
        "weights_detail": mdef.weights_detail,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "gguf_py": gguf_version(),
        "seed": seed,
        "tokenizer": tok.describe(),
        "notes": notes,
        "config": json_safe(model.config.to_dict()),
        "cases": cases,
    }
    json_path = out / f"{mdef.name}.json"
    json_path.write_text(json.dumps(ref, indent=1) + "\n")
    # Independent check: a numpy forward pass with llama.cpp's semantics over the GGUF alone.
    worst = gguf_forward.check_reference(json_path)
    print(f"   independent numpy forward over the GGUF matches (max |dlogp| {worst:.1e}, greedy equal)")
    for n in notes:
        print("   " + n)
    print(f"   wrote {gguf_path.name} ({gguf_path.stat().st_size} bytes), {mdef.name}.json "
          f"({(out / f'{mdef.name}.json').stat().st_size} bytes)")


def gguf_version() -> str:
    try:
        from importlib.metadata import version
        return version("gguf")
    except Exception:
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", help="model names to build (default: all)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--tokenizer-gguf", type=Path,
                    default=Path(os.environ.get("PLD_TOKENIZER_GGUF", DEFAULT_TOKENIZER_GGUF)))
    args = ap.parse_args()

    torch.set_num_threads(1)  # reproducible float summation order
    torch.use_deterministic_algorithms(True)
    transformers.logging.set_verbosity_error()
    args.out.mkdir(parents=True, exist_ok=True)

    tok = load_tokenizer(args.tokenizer_gguf, V)
    print(f"tokenizer: V = {len(tok.tokens)}, control ids 0..{tok.first_normal - 1}, {len(tok.byte_ids)} byte symbols at ids "
          f"{min(tok.byte_ids)}..{max(tok.byte_ids)}, {len(tok.merges)} merges, pre '{tok.pre}'")
    prompts = make_prompts(tok)
    window_rule = window_rule_check(tok)
    print(f"mask rule: {window_rule}")

    names = [m.name for m in MODELS]
    selected = args.only or names
    for n in selected:
        if n not in names:
            sys.exit(f"unknown model {n}; choose from {names}")
    for mdef in MODELS:
        if mdef.name in selected:
            make(mdef, tok, prompts, args.out, window_rule)

    total = sum(p.stat().st_size for p in args.out.iterdir() if p.is_file())
    print(f"total size of {args.out}: {total} bytes ({total / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
