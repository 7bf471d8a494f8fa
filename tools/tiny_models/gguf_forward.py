#!/usr/bin/env python3
"""An independent float64 numpy forward pass that reads ONLY a GGUF file, with llama.cpp's
semantics (the ones the engine implements), used to cross-check the tiny models.

make.py validates its GGUF files by undoing its own layout mapping, which cannot catch a mapping
that is self-consistent but wrong (say, the q/k permutation applied the wrong way round). This
file instead computes the logits the way a GGUF consumer does:

  * `llama` arch: RoPE on adjacent pairs (x[2i], x[2i+1]) -- valid because the converter
    permuted q/k rows; `qwen3`, `gemma3`, `phi3`: NeoX RoPE on halves (x[i], x[i + d/2]);
  * inv_freq_i = base^(-2i/d) / factor_i with factor_i from `rope_freqs.weight` (Llama 3) or
    `rope_factors_short.weight` (Phi-3, context <= original context), cos/sin times
    `rope.scaling.attn_factor`;
  * sliding window: position i sees j iff 0 <= i - j < W, on every layer (llama arch with the key)
    or, for gemma3, on every layer except each 6th (layer l is global iff (l + 1) % 6 == 0),
    whose RoPE base is 10000 while global layers use `rope.freq_base`;
  * gemma3: embeddings times sqrt(d_model), stored norm weights used as is (they hold 1 + w),
    post-attention and post-ffn norms, GELU (tanh) gate; tied output = token_embd;
  * phi3: `attn_qkv` rows [q; k; v], `ffn_up` rows [gate; up];
  * mixtures of experts (`qwen3moe`, `llama` with `expert_count`): softmax over the router's
    (`ffn_gate_inp`) scores, the `expert_used_count` most likely experts, their probabilities
    renormalised to sum 1 unless `expert_weights_norm` is false, each expert's SwiGLU over its
    slice of `ffn_{gate,up,down}_exps` (or its own `ffn_{gate,up,down}.<e>.weight`), added with
    those weights.
  * gpt-oss: biases on q, k, v and the attention output; a sink logit per head in each softmax
    (`attn_sinks`); layer l windowed iff l is even; YaRN RoPE (`rope.scaling.type = yarn`), its
    ramp not rounded to whole dimensions (the model's reference; llama.cpp rounds), cos/sin times
    0.1 ln(factor) + 1; the ffn norm `post_attention_norm`; the router's bias, its top-k logits
    softmaxed; expert biases; (clamp(up, -7, 7) + 1) * g * sigmoid(1.702 g), g = min(gate, 7).

Run standalone to check every reference in crates/engine/tests/tiny:
  /work/pyenv/venv/bin/python tools/tiny_models/gguf_forward.py
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT


class GgufModel:
    def __init__(self, path: Path):
        r = gguf.GGUFReader(str(path))
        self.arch = r.fields["general.architecture"].contents()
        meta = lambda k, d=None: r.fields[f"{self.arch}.{k}"].contents() if f"{self.arch}.{k}" in r.fields else d
        self.n_layer = meta("block_count")
        self.d = meta("embedding_length")
        self.n_head = meta("attention.head_count")
        self.n_kv = meta("attention.head_count_kv")
        self.hd = meta("attention.key_length")
        self.eps = meta("attention.layer_norm_rms_epsilon")
        self.base = meta("rope.freq_base")
        self.window = meta("attention.sliding_window")
        self.attn_factor = meta("rope.scaling.attn_factor", 1.0)
        self.yarn = None
        if meta("rope.scaling.type") == "yarn":
            self.yarn = (meta("rope.scaling.factor"), meta("rope.scaling.original_context_length"),
                         meta("rope.scaling.yarn_beta_fast", 32.0), meta("rope.scaling.yarn_beta_slow", 1.0))
        self.used = meta("expert_used_count")
        self.expert_norm = meta("expert_weights_norm", True)
        self.t = {}
        for t in r.tensors:
            shape = tuple(int(x) for x in reversed(t.shape))
            if t.tensor_type == QT.F32:
                v = np.array(t.data, dtype=np.float32)
            elif t.tensor_type == QT.F16:
                v = np.array(t.data, dtype=np.float16).astype(np.float32)
            else:
                v = gguf.quants.dequantize(np.array(t.data), t.tensor_type)
            self.t[t.name] = v.reshape(shape).astype(np.float64)
        pairs = self.hd // 2
        factors = self.t.get("rope_freqs.weight", self.t.get("rope_factors_short.weight", np.ones(pairs)))
        exps = np.arange(0, self.hd, 2, dtype=np.float64) / self.hd
        self.inv_freq = 1.0 / (self.base ** exps) / factors
        if self.yarn:
            factor, orig, fast, slow = self.yarn
            # The (fractional) pair index whose frequency turns `n` times over the original context.
            dim_of = lambda n: self.hd * math.log(orig / (n * 2 * math.pi)) / (2 * math.log(self.base))
            lo, hi = dim_of(fast), dim_of(slow)
            if self.arch != "gpt-oss":
                lo, hi = math.floor(lo), math.ceil(hi)
            lo, hi = max(lo, 0.0), min(hi, self.hd - 1.0)
            ramp = np.clip((np.arange(pairs) - lo) / max(hi - lo, 0.001), 0.0, 1.0)
            extrapolated = 1.0 - ramp
            self.inv_freq = self.inv_freq / factor * (1 - extrapolated) + self.inv_freq * extrapolated
            self.attn_factor *= 0.1 * math.log(factor) + 1.0
        self.inv_freq_local = 1.0 / (10000.0 ** exps)  # gemma3 sliding layers

    def windowed(self, layer: int) -> bool:
        if not self.window:
            return False
        if self.arch == "gpt-oss":
            return layer % 2 == 0
        return self.arch != "gemma3" or (layer + 1) % 6 != 0

    def norm(self, x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + self.eps) * w

    def rope(self, x, inv_freq):
        """x: [T, heads, hd]."""
        T = x.shape[0]
        ang = np.arange(T, dtype=np.float64)[:, None] * inv_freq[None, :]  # [T, hd/2]
        cos = (np.cos(ang) * self.attn_factor)[:, None, :]
        sin = (np.sin(ang) * self.attn_factor)[:, None, :]
        out = np.empty_like(x)
        if self.arch == "llama":  # adjacent pairs
            a, b = x[..., 0::2], x[..., 1::2]
            out[..., 0::2] = a * cos - b * sin
            out[..., 1::2] = a * sin + b * cos
        else:  # NeoX halves
            h = self.hd // 2
            a, b = x[..., :h], x[..., h:]
            out[..., :h] = a * cos - b * sin
            out[..., h:] = a * sin + b * cos
        return out

    def experts(self, h: np.ndarray, p: str) -> np.ndarray:
        """A mixture-of-experts block over the normalized rows `h` [T, d]."""
        t = self.t
        scores = h @ t[p + "ffn_gate_inp.weight"].T + t.get(p + "ffn_gate_inp.bias", 0.0)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out = np.zeros_like(h)
        oai = self.arch == "gpt-oss"
        for r in range(h.shape[0]):
            chosen = np.argsort(-probs[r], kind="stable")[: self.used]
            if oai:  # softmax over the chosen logits
                weights = np.exp(scores[r, chosen] - scores[r, chosen].max())
                weights /= weights.sum()
            else:
                weights = probs[r, chosen]
                if self.expert_norm:
                    weights = weights / weights.sum()
            for e, w in zip(chosen, weights):
                gate, up, down = (self.expert(p, kind, e) for kind in ("gate", "up", "down"))
                g, u = gate @ h[r], up @ h[r]
                if oai:
                    g, u = g + t[p + "ffn_gate_exps.bias"][e], u + t[p + "ffn_up_exps.bias"][e]
                    g = np.minimum(g, 7.0)
                    act = (np.clip(u, -7.0, 7.0) + 1) * g / (1 + np.exp(-1.702 * g))
                    out[r] += w * (down @ act + t[p + "ffn_down_exps.bias"][e])
                else:
                    out[r] += w * (down @ (silu(g) * u))
        return out

    def expert(self, p: str, kind: str, e: int) -> np.ndarray:
        """Expert `e`'s matrix: its slice of the 3-D `ffn_<kind>_exps`, or its own 2-D
        `ffn_<kind>.<e>.weight` (the older Mixtral layout)."""
        merged = self.t.get(p + f"ffn_{kind}_exps.weight")
        return merged[e] if merged is not None else self.t[p + f"ffn_{kind}.{e}.weight"]

    def logits(self, ids: list[int]) -> np.ndarray:
        t, T, hd = self.t, len(ids), self.hd
        x = t["token_embd.weight"][ids]
        if self.arch == "gemma3":
            x = x * math.sqrt(self.d)
        for l in range(self.n_layer):
            p = f"blk.{l}."
            h = self.norm(x, t[p + "attn_norm.weight"])
            if self.arch == "phi3":
                qkv = h @ t[p + "attn_qkv.weight"].T
                q, k, v = np.split(qkv, [self.n_head * hd, (self.n_head + self.n_kv) * hd], axis=-1)
            else:
                q, k, v = (h @ t[p + f"attn_{n}.weight"].T + t.get(p + f"attn_{n}.bias", 0.0) for n in "qkv")
            q = q.reshape(T, self.n_head, hd)
            k = k.reshape(T, self.n_kv, hd)
            v = v.reshape(T, self.n_kv, hd)
            if p + "attn_q_norm.weight" in t:
                q = self.norm(q, t[p + "attn_q_norm.weight"])
                k = self.norm(k, t[p + "attn_k_norm.weight"])
            windowed = self.windowed(l)
            inv = self.inv_freq_local if (self.arch == "gemma3" and windowed) else self.inv_freq
            q, k = self.rope(q, inv), self.rope(k, inv)
            i, j = np.arange(T)[:, None], np.arange(T)[None, :]
            allowed = (j <= i) & ((i - j < self.window) if windowed else True)
            group = self.n_head // self.n_kv
            sinks = t.get(p + "attn_sinks.weight")
            heads = []
            for hh in range(self.n_head):
                s = q[:, hh] @ k[:, hh // group].T / math.sqrt(hd)
                s = np.where(allowed, s, -np.inf)
                if sinks is None:
                    s = np.exp(s - s.max(-1, keepdims=True))
                    heads.append((s / s.sum(-1, keepdims=True)) @ v[:, hh // group])
                else:  # the sink joins the softmax as one more logit with no value
                    top = np.maximum(s.max(-1, keepdims=True), sinks[hh])
                    e = np.exp(s - top)
                    heads.append((e / (e.sum(-1, keepdims=True) + np.exp(sinks[hh] - top))) @ v[:, hh // group])
            o = np.concatenate(heads, axis=-1) @ t[p + "attn_output.weight"].T + t.get(p + "attn_output.bias", 0.0)
            if self.arch == "gemma3":
                o = self.norm(o, t[p + "post_attention_norm.weight"])
            x = x + o
            h = self.norm(x, t[p + ("post_attention_norm.weight" if self.arch == "gpt-oss" else "ffn_norm.weight")])
            if p + "ffn_gate_inp.weight" in t:
                x = x + self.experts(h, p)
                continue
            if self.arch == "phi3":
                gate, up = np.split(h @ t[p + "ffn_up.weight"].T, 2, axis=-1)
            else:
                gate, up = h @ t[p + "ffn_gate.weight"].T, h @ t[p + "ffn_up.weight"].T
            if self.arch == "gemma3":  # gelu, tanh approximation
                act = 0.5 * gate * (1 + np.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate ** 3)))
            else:
                act = silu(gate)
            f = (act * up) @ t[p + "ffn_down.weight"].T
            if self.arch == "gemma3":
                f = self.norm(f, t[p + "post_ffw_norm.weight"])
            x = x + f
        x = self.norm(x, t["output_norm.weight"])
        return x @ t.get("output.weight", t["token_embd.weight"]).T


def silu(z: np.ndarray) -> np.ndarray:
    return z / (1 + np.exp(-z))


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def check_reference(json_path: Path, tol: float = 2e-4) -> float:
    """Asserts that the numpy forward pass over the GGUF matches the JSON's top-8 log-probs
    within `tol` and reproduces its greedy continuations. Returns the largest difference."""
    ref = json.loads(json_path.read_text())
    m = GgufModel(json_path.parent / ref["gguf"])
    worst = 0.0
    for case in ref["cases"]:
        lp = log_softmax(m.logits(case["ids"]))
        for pos, row in enumerate(case["top"]):
            assert int(np.argmax(lp[pos])) == row[0][0], (ref["name"], pos)
            for i, v in row:
                worst = max(worst, abs(lp[pos, i] - v))
        seq = list(case["ids"])
        for _ in case["greedy"]:
            seq.append(int(np.argmax(m.logits(seq)[-1])))
        assert seq[len(case["ids"]):] == case["greedy"], (ref["name"], seq[len(case["ids"]):], case["greedy"])
    assert worst <= tol, (ref["name"], worst)
    return worst


def main() -> None:
    d = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "crates/engine/tests/tiny"
    for p in sorted(d.glob("*.json")):
        print(f"{p.name}: numpy GGUF forward matches the reference, max |dlogp| {check_reference(p):.2e}, greedy equal")


if __name__ == "__main__":
    main()
