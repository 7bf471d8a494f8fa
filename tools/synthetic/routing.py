"""Which experts the rows of a pass actually choose in a synthetic qwen3moe file: a float32 numpy
forward pass with llama.cpp's qwen3moe semantics (RMS norms, q/k norms, NEOX RoPE, causal GQA
attention, softmax router, top-k renormalised, SiLU-gated experts) over the GGUF alone, recording
every layer's top-k choices, then for each pass size r the distinct experts the first r rows of
the pass touch, per layer, beside the uniform-choice expectation experts * (1 - (1 - k/E)^r).

Two passes, as the two benchmarks make them:
- `random`: r random token ids at positions 0..r-1, nothing cached (llama-bench `-p r`).
- `cycled`: a cache of `--context` positions then the pass, all of one short token sequence
  repeated (pld bench forward fills its cache and its passes with a sentence repeated; here a
  sequence of `--cycle` random ids stands for that sentence's tokens).

    /work/pyenv-moe/bin/python tools/synthetic/routing.py FILE [--layers N] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import gguf
from gguf.quants import dequantize


class Weights:
    def __init__(self, path: Path):
        self.r = gguf.GGUFReader(path)
        self.t = {t.name: t for t in self.r.tensors}
        f = self.r.fields
        a = f["general.architecture"].contents()
        assert a == "qwen3moe", a
        g = lambda k: f[f"{a}.{k}"].contents()
        self.layers, self.heads, self.kv_heads = g("block_count"), g("attention.head_count"), g("attention.head_count_kv")
        self.head_dim, self.experts, self.used = g("attention.key_length"), g("expert_count"), g("expert_used_count")
        self.theta, self.eps = g("rope.freq_base"), g("attention.layer_norm_rms_epsilon")

    def dense(self, name: str) -> np.ndarray:
        t = self.t[name]
        return dequantize(t.data, t.tensor_type).astype(np.float32)

    def rows(self, name: str, ids) -> np.ndarray:
        t = self.t[name]
        return dequantize(t.data[np.asarray(ids)], t.tensor_type).astype(np.float32)

    def expert(self, name: str, e: int) -> np.ndarray:
        t = self.t[name]
        return dequantize(t.data[e], t.tensor_type).astype(np.float32)


def rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def rope_neox(x, pos, theta):
    # x: [n, heads, d]; llama.cpp NEOX: rotate pairs (i, i + d/2)
    d = x.shape[-1]
    inv = theta ** (-np.arange(0, d // 2, dtype=np.float64) * 2 / d)
    ang = np.outer(pos, inv)  # [n, d/2]
    c, s = np.cos(ang)[:, None, :].astype(np.float32), np.sin(ang)[:, None, :].astype(np.float32)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return np.concatenate([a * c - b * s, a * s + b * c], -1)


def forward_choices(w: Weights, ids: np.ndarray, n_layers: int, embd_scale: float = 1.0, wo_scale: float = 1.0) -> list[np.ndarray]:
    """Every layer's top-k expert ids per row, [n, k]."""
    n = len(ids)
    pos = np.arange(n)
    x = embd_scale * w.rows("token_embd.weight", ids)
    H, KV, D = w.heads, w.kv_heads, w.head_dim
    mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)
    choices = []
    for il in range(n_layers):
        p = f"blk.{il}."
        h = rmsnorm(x, w.dense(p + "attn_norm.weight"), w.eps)
        q = (h @ w.dense(p + "attn_q.weight").T).reshape(n, H, D)
        k = (h @ w.dense(p + "attn_k.weight").T).reshape(n, KV, D)
        v = (h @ w.dense(p + "attn_v.weight").T).reshape(n, KV, D)
        q = rope_neox(rmsnorm(q, w.dense(p + "attn_q_norm.weight"), w.eps), pos, w.theta)
        k = rope_neox(rmsnorm(k, w.dense(p + "attn_k_norm.weight"), w.eps), pos, w.theta)
        g = H // KV
        out = np.empty((n, H, D), np.float32)
        for hh in range(H):
            s = q[:, hh] @ k[:, hh // g].T / np.sqrt(D) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, hh // g]
        x = x + out.reshape(n, H * D) @ (wo_scale * w.dense(p + "attn_output.weight").T)
        h = rmsnorm(x, w.dense(p + "ffn_norm.weight"), w.eps)
        logits = h @ w.dense(p + "ffn_gate_inp.weight").T
        top = np.argsort(-logits, -1, kind="stable")[:, : w.used]
        pr = np.exp(logits - logits.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        wt = np.take_along_axis(pr, top, -1)
        wt /= wt.sum(-1, keepdims=True)
        moe = np.zeros_like(x)
        for e in np.unique(top):
            rows, slot = np.nonzero(top == e)
            he = h[rows]
            gate = he @ w.expert(p + "ffn_gate_exps.weight", e).T
            up = he @ w.expert(p + "ffn_up_exps.weight", e).T
            act = gate / (1 + np.exp(-gate)) * up
            moe[rows] += wt[rows, slot][:, None] * (act @ w.expert(p + "ffn_down_exps.weight", e).T)
        x = x + moe
        choices.append(top)
    return choices


def unions(choices: list[np.ndarray], start: int, sizes: list[int]) -> dict[int, list[int]]:
    return {r: [len(np.unique(c[start:start + r])) for c in choices] for r in sizes}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file", type=Path)
    ap.add_argument("--layers", type=int, help="first N layers only (default: all)")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--cycle", type=int, default=24)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--wo-scale", type=float, default=1.0, help="scale attn_output (an experiment)")
    ap.add_argument("--embd-scale", type=float, default=1.0, help="scale the token embeddings (an experiment)")
    a = ap.parse_args()
    w = Weights(a.file)
    n_layers = a.layers or w.layers
    sizes = [1, 2, 4, 8, 16, 32, 64]
    rng = np.random.default_rng(a.seed)
    vocab = 151643  # ordinary tokens only
    E, k = w.experts, w.used
    res = {"file": str(a.file), "layers": n_layers, "experts": E, "used": k, "sizes": sizes,
           "uniform": {r: E * (1 - (1 - k / E) ** r) for r in sizes}}
    t0 = time.time()
    ids = rng.integers(0, vocab, 64)
    res["random"] = unions(forward_choices(w, ids, n_layers, a.embd_scale, a.wo_scale), 0, sizes)
    t1 = time.time()
    cyc = rng.integers(0, vocab, a.cycle)
    ids = np.resize(cyc, a.context + 64)
    res["cycled"] = unions(forward_choices(w, ids, n_layers, a.embd_scale, a.wo_scale), a.context, sizes)
    res["cycled_setup"] = {"context": a.context, "cycle": a.cycle}
    t2 = time.time()
    print(f"{a.file.name}: {n_layers} layers; forward passes {t1 - t0:.0f} s and {t2 - t1:.0f} s")
    print("| rows | uniform expectation | random ids, no cache (mean over layers, min..max) | "
          f"a {a.cycle}-id cycle after {a.context} cached |")
    print("|---:|---:|---:|---:|")
    for r in sizes:
        ra, cy = res["random"][r], res["cycled"][r]
        print(f"| {r} | {res['uniform'][r]:.1f} | {np.mean(ra):.1f} ({min(ra)}..{max(ra)}) | "
              f"{np.mean(cy):.1f} ({min(cy)}..{max(cy)}) |")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
