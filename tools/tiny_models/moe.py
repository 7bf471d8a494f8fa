"""The tiny mixture-of-experts models of make.py: Qwen3-MoE (`qwen3moe`) and Mixtral (`llama`
with experts), each 8 experts of which every token runs 2.

transformers keeps a layer's experts as two 3-D parameters, `experts.gate_up_proj`
[experts, 2 * ff, hidden] (gate rows first) and `experts.down_proj` [experts, hidden, ff], and
the router as `gate.weight` [experts, hidden]; llama.cpp's layout is `ffn_gate_inp` (the router,
kept F32 as llama.cpp's quantizer keeps it), `ffn_gate_exps` and `ffn_up_exps` [experts, ff,
hidden] and `ffn_down_exps` [experts, hidden, ff], one slice per expert.

`models(mk)` returns the two `ModelDef`s, built from make.py's pieces (`mk` is that module).
"""

from __future__ import annotations

import torch
import transformers
from gguf import GGMLQuantizationType as QT

EXPERTS = 8
USED = 2
EXPERT_FF = 64  # a multiple of 64, so that every expert matrix is packed for the SIMD kernels

DENSE_FFN = ("ffn_gate", "ffn_up", "ffn_down")  # replaced by the experts (`moe_specs`)


def without_dense_ffn(layer_map: dict) -> dict:
    """A dense family's tensor map less its feed-forward matrices: attention and norms."""
    return {k: v for k, v in layer_map.items() if k not in DENSE_FFN}


def moe_specs(mk, model, expert_type, split: bool):
    """Every layer's router and experts (`expert_type`: the experts' storage type): as 3-D
    `ffn_*_exps` tensors, or with `split` as one 2-D tensor per expert (`ffn_gate.<e>.weight`...),
    the layout of Mixtral files converted before llama.cpp merged them."""
    ff = EXPERT_FF
    kinds = [("gate", "experts.gate_up_proj", (0, ff)), ("up", "experts.gate_up_proj", (ff, 2 * ff)),
             ("down", "experts.down_proj", None)]
    specs = []
    for i in range(model.config.num_hidden_layers):
        p, h = f"blk.{i}.", f"model.layers.{i}.mlp."
        specs.append(mk.TensorSpec(p + "ffn_gate_inp.weight", h + "gate.weight", qtype=QT.F32))
        for kind, param, part in kinds:
            if split:
                specs += [mk.TensorSpec(p + f"ffn_{kind}.{e}.weight", h + param, qtype=expert_type, part=part, expert=e)
                          for e in range(EXPERTS)]
            else:
                specs.append(mk.TensorSpec(p + f"ffn_{kind}_exps.weight", h + param, qtype=expert_type, part=part))
    return specs


def specs_with_experts(mk, model, layer_map, matrix_type, *, permute, split=False):
    specs = mk.standard_specs(model, layer_map, matrix_type, permute=permute, gemma_norms=False, tied=False)
    at = next(i for i, s in enumerate(specs) if s.gguf_name == "output_norm.weight")
    return specs[:at] + moe_specs(mk, model, matrix_type("experts"), split) + specs[at:]


def expert_metadata(model):
    return {"expert_count": EXPERTS, "expert_used_count": USED, "expert_feed_forward_length": EXPERT_FF}


def mixtral_metadata(model):
    """As llama.cpp writes Mixtral: the experts' width is `feed_forward_length`."""
    return {"expert_count": EXPERTS, "expert_used_count": USED}


def run_prompts_with_hooks(model, handles) -> None:
    """Runs the reference prompts through `model`, then removes the forward hooks `handles`."""
    try:
        for ids in model._tiny_prompts:
            with torch.no_grad():
                model(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()


def routing_checks(model) -> list[str]:
    """Routing facts of the reference: every router output's gap between the last chosen and the
    first unchosen expert's score over the three prompts (a near tie there is where two float
    paths could choose differently), and how often each expert is chosen."""
    gaps, counts = [], torch.zeros(EXPERTS, dtype=torch.long)

    def hook(_module, _inputs, output):
        logits = output[0]
        top = torch.topk(logits, USED + 1, dim=-1)
        gaps.append(float((top.values[:, USED - 1] - top.values[:, USED]).min()))
        counts.add_(torch.bincount(top.indices[:, :USED].reshape(-1), minlength=EXPERTS))

    run_prompts_with_hooks(model, [layer.mlp.gate.register_forward_hook(hook) for layer in model.model.layers])
    assert (counts > 0).all(), counts
    return [f"routing: {USED} of {EXPERTS} experts per token; smallest router-score gap between the last chosen and "
            f"the first unchosen expert over the prompts {min(gaps):.2e}; choices per expert {counts.tolist()}"]


# ---- qwen3moe -------------------------------------------------------------------------------


def build_qwen3moe(mk, tok):
    cfg = transformers.Qwen3MoeConfig(**mk.common_config(
        tok, attention_bias=False, use_sliding_window=False, num_experts=EXPERTS,
        num_experts_per_tok=USED, moe_intermediate_size=EXPERT_FF, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[],
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}))
    return mk.instantiate(transformers.Qwen3MoeForCausalLM, cfg)


def check_qwen3moe(model):
    mlp = model.model.layers[0].mlp
    assert type(mlp).__name__ == "Qwen3MoeSparseMoeBlock", type(mlp)
    assert mlp.gate.norm_topk_prob
    return routing_checks(model) + ["norm_topk_prob: the chosen experts' softmax weights renormalised to sum 1 "
                                    "(llama.cpp's qwen3moe default; no expert_weights_norm key written)"]


# ---- mixtral --------------------------------------------------------------------------------


def build_mixtral(mk, tok):
    cfg = transformers.MixtralConfig(**mk.common_config(
        tok, intermediate_size=EXPERT_FF, num_local_experts=EXPERTS, num_experts_per_tok=USED,
        sliding_window=None, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}))
    return mk.instantiate(transformers.MixtralForCausalLM, cfg)


def check_mixtral(model):
    assert type(model.model.layers[0].mlp).__name__ == "MixtralSparseMoeBlock"
    return routing_checks(model) + ["llama arch with experts: q/k permuted for pair RoPE; softmax over all "
                                    "experts, top 2, renormalised (= softmax over the chosen two)"]


def models(mk):
    return [
        mk.ModelDef("qwen3moe", "qwen3moe", "F32", 7088, lambda tok: build_qwen3moe(mk, tok),
                    lambda m: specs_with_experts(mk, m, without_dense_ffn(mk.LAYER_MAP_QWEN3),
                                                 lambda n: QT.F32, permute=False),
                    expert_metadata, check_qwen3moe, weights_detail="all F32"),
        mk.ModelDef("mixtral", "llama", "Q8_0", 8096, lambda tok: build_mixtral(mk, tok),
                    lambda m: specs_with_experts(mk, m, without_dense_ffn(mk.LAYER_MAP_LLAMA), lambda n: QT.Q8_0, permute=True),
                    mixtral_metadata, check_mixtral,
                    weights_detail="Q8_0 matrices (experts, token_embd and output too); router and norms F32"),
        # The same model (same seed, so the same weights and references) in the older layout.
        mk.ModelDef("mixtral-split", "llama", "Q8_0", 8096, lambda tok: build_mixtral(mk, tok),
                    lambda m: specs_with_experts(mk, m, without_dense_ffn(mk.LAYER_MAP_LLAMA), lambda n: QT.Q8_0, permute=True, split=True),
                    mixtral_metadata, check_mixtral,
                    weights_detail="as mixtral, each expert's matrices their own 2-D tensors (ffn_gate.<e>.weight)"),
    ]
