"""The tiny gpt-oss models of make.py (`gpt-oss`: F32; `gpt-oss-mxfp4`: the same model with its
experts stored in MXFP4, as OpenAI ships them and llama.cpp's converter writes them; its seed
search starts from the same seed but, the quantized weights moving the margins, may end on
another).

gpt-oss, as transformers' `GptOssForCausalLM` computes it and llama.cpp's `gpt-oss` reads it:
  * attention with biases on q, k, v and the output, and a learned sink logit per query head
    (`self_attn.sinks` -> `attn_sinks.weight`) that joins every softmax without a value;
  * layers in turn sliding-window (even) and full attention (odd);
  * YaRN RoPE on halves; transformers' gpt-oss config does not round YaRN's ramp to whole
    dimensions (`truncate: false`), which llama.cpp's ggml always does: pld follows the reference;
  * the pre-ffn norm `post_attention_layernorm` -> `post_attention_norm.weight`;
  * a router with a bias (`mlp.router` -> `ffn_gate_inp`), the top-k of its logits, softmax over
    those k;
  * experts with biases: transformers keeps `gate_up_proj` [experts, hidden, 2 * ff] with gate and
    up interleaved by column (gate = ::2, up = 1::2) and `down_proj` [experts, ff, hidden];
    llama.cpp's layout is `ffn_{gate,up}_exps` [experts, ff, hidden], `ffn_down_exps`
    [experts, hidden, ff], and `ffn_{gate,up,down}_exps.bias`;
  * the clamped SwiGLU: (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g), g = min(gate, 7).
"""

from __future__ import annotations

import torch
import transformers
from gguf import GGMLQuantizationType as QT

import moe

EXPERTS = 8
USED = 4
EXPERT_FF = 64
WINDOW = 8
# The gate/up products scaled up after the common init so that the clamps at +-7 are reached.
GATE_UP_SCALE = 3.0
YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "original_max_position_embeddings": 4096, "truncate": False}

ATTENTION = {
    "attn_norm": ("input_layernorm.weight", None),
    "attn_q": ("self_attn.q_proj.weight", None),
    "attn_k": ("self_attn.k_proj.weight", None),
    "attn_v": ("self_attn.v_proj.weight", None),
    "attn_output": ("self_attn.o_proj.weight", None),
}
BIASES = {"attn_q": "self_attn.q_proj.bias", "attn_k": "self_attn.k_proj.bias", "attn_v": "self_attn.v_proj.bias",
          "attn_output": "self_attn.o_proj.bias"}


def build(mk, tok):
    cfg = transformers.GptOssConfig(**mk.common_config(
        tok, intermediate_size=EXPERT_FF, num_local_experts=EXPERTS, num_experts_per_tok=USED,
        sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"], attention_bias=True,
        rope_parameters=dict(YARN), rms_norm_eps=1e-5))
    return mk.instantiate(transformers.GptOssForCausalLM, cfg)


def after_init(model):
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj.mul_(GATE_UP_SCALE)


def specs(mk, model, expert_type):
    """GGUF tensors in llama.cpp's order and names; `expert_type` stores the expert matrices."""
    S = mk.TensorSpec
    out = [S("token_embd.weight", "model.embed_tokens.weight")]
    t = lambda w: w.transpose(-1, -2)
    for i in range(model.config.num_hidden_layers):
        p, h = f"blk.{i}.", f"model.layers.{i}."
        for g, (hn, _) in ATTENTION.items():
            out.append(S(p + f"{g}.weight", h + hn))
            if g in BIASES:
                out.append(S(p + f"{g}.bias", h + BIASES[g]))
        out.append(S(p + "attn_sinks.weight", h + "self_attn.sinks"))
        out.append(S(p + "post_attention_norm.weight", h + "post_attention_layernorm.weight"))
        out.append(S(p + "ffn_gate_inp.weight", h + "mlp.router.weight"))
        out.append(S(p + "ffn_gate_inp.bias", h + "mlp.router.bias"))
        e = h + "mlp.experts."
        out += [
            S(p + "ffn_gate_exps.weight", e + "gate_up_proj", qtype=expert_type, view=lambda w: t(w)[..., 0::2, :]),
            S(p + "ffn_up_exps.weight", e + "gate_up_proj", qtype=expert_type, view=lambda w: t(w)[..., 1::2, :]),
            S(p + "ffn_down_exps.weight", e + "down_proj", qtype=expert_type, view=t),
            S(p + "ffn_gate_exps.bias", e + "gate_up_proj_bias", view=lambda w: w[..., 0::2]),
            S(p + "ffn_up_exps.bias", e + "gate_up_proj_bias", view=lambda w: w[..., 1::2]),
            S(p + "ffn_down_exps.bias", e + "down_proj_bias"),
        ]
    out.append(S("output_norm.weight", "model.norm.weight"))
    out.append(S("output.weight", "lm_head.weight"))
    return out


def metadata(model):
    return {
        "expert_count": EXPERTS,
        "expert_used_count": USED,
        "expert_feed_forward_length": EXPERT_FF,
        "attention.sliding_window": WINDOW,
        "rope.scaling.type": "yarn",
        "rope.scaling.factor": YARN["factor"],
        "rope.scaling.original_context_length": YARN["original_max_position_embeddings"],
        "rope.scaling.yarn_beta_fast": YARN["beta_fast"],
        "rope.scaling.yarn_beta_slow": YARN["beta_slow"],
    }


def checks(model):
    """Facts of the reference that the test relies on: the layer kinds, that the clamps were
    reached, and the routing's closest call."""
    cfg = model.config
    assert cfg.layer_types == ["sliding_attention", "full_attention"], cfg.layer_types
    assert cfg.rope_parameters["truncate"] is False
    gaps, clamped, total = [], 0, 0

    def router_hook(_m, _inputs, output):
        logits = output[0]
        top = torch.topk(logits, USED + 1, dim=-1).values
        gaps.append(float((top[:, USED - 1] - top[:, USED]).min()))

    def experts_hook(module, inputs, _output):
        nonlocal clamped, total
        x = inputs[0]
        gate_up = torch.einsum("td,edf->etf", x, module.gate_up_proj) + module.gate_up_proj_bias[:, None, :]
        clamped += int((gate_up[..., 0::2] > 7).sum() + (gate_up[..., 1::2].abs() > 7).sum())
        total += gate_up.numel()

    handles = [l.mlp.router.register_forward_hook(router_hook) for l in model.model.layers]
    handles += [l.mlp.experts.register_forward_hook(experts_hook) for l in model.model.layers]
    moe.run_prompts_with_hooks(model, handles)
    assert clamped > 0, "the clamps are never reached"
    return [f"routing: top {USED} of {EXPERTS} experts, softmax over the chosen logits; smallest gap between the "
            f"last chosen and the first unchosen logit over the prompts {min(gaps):.2e}",
            f"clamped SwiGLU: {100 * clamped / total:.1f}% of the gate/up values (all experts, every position) "
            f"lie beyond the clamps at +-7",
            "attention sinks per head; layers 0 sliding-window (8), 1 full; YaRN factor 32 over 4096, "
            "beta 32/1, not truncated"]


def models(mk):
    common = dict(build=lambda tok: build(mk, tok), metadata=metadata, checks=checks, after_init=after_init)
    return [
        mk.ModelDef("gpt-oss", "gpt-oss", "F32", 9001, tensor_specs=lambda m: specs(mk, m, QT.F32),
                    weights_detail="all F32", **common),
        # The same model (same seed) with its experts in MXFP4.
        mk.ModelDef("gpt-oss-mxfp4", "gpt-oss", "MXFP4", 9001, tensor_specs=lambda m: specs(mk, m, QT.MXFP4),
                    weights_detail="experts' matrices MXFP4; the rest F32", **common),
    ]
