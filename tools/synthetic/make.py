"""Synthetic GGUF files with a real mixture-of-experts model's shapes, formats and metadata, and
random weights: for timing passes on real shapes where no real model can be downloaded.

Every quantized tensor is written directly as blocks of its format (random codes, scales chosen
so that the values come out centred with a standard deviation near 0.025, about what trained
matrices have; nothing is quantized from floats), tensor by tensor and chunk by chunk, so memory
stays under a few hundred MB whatever the file's size. The values are finite by construction
(finite f16 scales, subnormal for the small-valued attention output as in real files, E8M0
exponents near 2^-8); `--check` rereads the file and dequantizes a sample of every tensor with
gguf-py to show it.

Presets (see tools/synthetic/README.md for what each follows and where it departs):
- `qwen3-30b-a3b`: `qwen3moe`, as llama.cpp's converter and `llama-quantize Q4_K_M` write
  Qwen3-30B-A3B; tokenizer metadata copied from a Qwen2.5 GGUF (same vocabulary, 151936).
- `gpt-oss-20b`: `gpt-oss`, as llama.cpp's converter and its MXFP4_MOE type mix write gpt-oss-20b
  (ggml-org/gpt-oss-20b-GGUF); a stand-in byte-level BPE tokenizer of the real size (201088).

    /work/pyenv-moe/bin/python tools/synthetic/make.py --preset qwen3-30b-a3b --out FILE [--layers 24]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGML_QUANT_SIZES

TARGET_STD = 0.025  # standard deviation of every matrix's values, but:
# Random weights make a transformer's rows converge (attention averages the values of all earlier
# positions, and that shared part grows layer by layer), and then every row routes to the same
# few experts: 29 of 128 per layer for 64 random tokens over 24 layers instead of the 126 of
# uniform choice (tools/synthetic/routing.py). Token embeddings 20x larger and the attention
# output 10x smaller keep each row's residual its own, so the rows route independently (124.8
# of 125.9 over 12 layers). Both values stay in a realistic range.
EMBD_STD = 0.5
ATTN_OUT_STD = 0.0025
CHUNK_BYTES = 32 << 20  # generated and written at most this much at a time

# ---- blocks ---------------------------------------------------------------------------------


def _f16_bytes(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).view(np.uint8).reshape(x.shape[0], 2)


def _jitter(rng, n: int, base: float) -> np.ndarray:
    """Per-block scales: `base` times a factor in [0.75, 1.25)."""
    return base * rng.uniform(0.75, 1.25, n)


def q4_k_blocks(rng, n: int, std: float = TARGET_STD) -> np.ndarray:
    """block_q4_K: d, dmin (f16), 12 bytes of 6-bit sub-block scales and mins, 128 bytes of
    nibbles. value = d * sc * q - dmin * m; with m = sc and dmin = 7.5 d each sub-block is
    d * sc * (q - 7.5), centred."""
    out = np.empty((n, 144), np.uint8)
    sc = rng.integers(32, 64, (n, 8), dtype=np.uint8)
    m = sc
    # q uniform on 0..15: std of q - 7.5 is 4.61; mean sc 47.5
    d = _jitter(rng, n, std / (47.5 * 4.61))
    out[:, 0:2] = _f16_bytes(d)
    out[:, 2:4] = _f16_bytes(7.5 * d)
    # layout of gguf-py's Q4_K.get_scale_min (llama.cpp's get_scale_min_k4)
    out[:, 4:8] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    out[:, 12:16] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    out[:, 16:] = np.frombuffer(rng.bytes(n * 128), np.uint8).reshape(n, 128)
    return out


def q6_k_blocks(rng, n: int, std: float = TARGET_STD) -> np.ndarray:
    """block_q6_K: 128 bytes low nibbles, 64 bytes high bit pairs, 16 int8 scales, d (f16).
    value = d * scale * (q - 32), q uniform on 0..63 (std of q - 32: 18.5)."""
    out = np.empty((n, 210), np.uint8)
    out[:, :192] = np.frombuffer(rng.bytes(n * 192), np.uint8).reshape(n, 192)
    mag = rng.integers(8, 32, (n, 16))
    sign = np.where(rng.random((n, 16)) < 0.5, -1, 1)
    out[:, 192:208] = (mag * sign).astype(np.int8).view(np.uint8)
    d = _jitter(rng, n, std / (np.sqrt(np.mean(np.arange(8, 32) ** 2)) * 18.5))
    out[:, 208:210] = _f16_bytes(d)
    return out


def q8_0_blocks(rng, n: int, std: float = TARGET_STD) -> np.ndarray:
    """block_q8_0: d (f16), 32 int8. value = d * q, q uniform on -127..127 (std 73.6)."""
    out = np.empty((n, 34), np.uint8)
    d = _jitter(rng, n, std / 73.6)
    out[:, 0:2] = _f16_bytes(d)
    q = np.frombuffer(rng.bytes(n * 32), np.int8).reshape(n, 32)
    q = np.where(q == -128, np.int8(-127), q)
    out[:, 2:] = q.view(np.uint8)
    return out


def mxfp4_blocks(rng, n: int, std: float = TARGET_STD) -> np.ndarray:
    """block_mxfp4: an E8M0 exponent byte e, 16 bytes of 4-bit E2M1 codes (element j low nibble,
    j + 16 high). value = kvalues[code] * 2^(e - 128) (ggml doubles the E2M1 values and halves
    the scale); the codes' rms is 5.85, so e near 128 + log2(0.025 / 5.85) = 120."""
    out = np.empty((n, 17), np.uint8)
    e = int(round(128 + np.log2(std / 5.85)))
    out[:, 0] = rng.integers(e - 1, e + 2, n, dtype=np.uint8)
    out[:, 1:] = np.frombuffer(rng.bytes(n * 16), np.uint8).reshape(n, 16)
    return out


BLOCKS = {QT.Q4_K: q4_k_blocks, QT.Q6_K: q6_k_blocks, QT.Q8_0: q8_0_blocks, QT.MXFP4: mxfp4_blocks}

# ---- tensors --------------------------------------------------------------------------------


@dataclass
class Tensor:
    name: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the row length
    qtype: QT
    # F32 tensors: "ones" (norm weights, near 1), "normal" (std `std`)
    init: str = "normal"
    std: float = TARGET_STD

    @property
    def rows(self) -> int:
        return int(np.prod(self.ne[1:], dtype=np.int64)) if len(self.ne) > 1 else 1

    @property
    def row_bytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.qtype]
        assert self.ne[0] % block == 0, (self.name, self.ne, self.qtype)
        return self.ne[0] // block * size

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    def byte_shape(self) -> tuple[int, ...]:
        """numpy shape (outermost first) of the raw bytes, as GGUFWriter takes it."""
        return tuple(reversed(self.ne[1:])) + (self.row_bytes,)

    def chunks(self, seed: int):
        """The tensor's bytes in chunks of whole rows, from a generator seeded by the name."""
        h = hashlib.sha256(f"{seed}:{self.name}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(h[:8], "little"))
        if self.qtype == QT.F32:
            n = int(np.prod(self.ne))
            if self.init == "ones":
                v = 1.0 + 0.1 * rng.standard_normal(n)
            else:
                v = self.std * rng.standard_normal(n)
            yield v.astype(np.float32)
            return
        block, _ = GGML_QUANT_SIZES[self.qtype]
        blocks_per_row = self.ne[0] // block
        rows_per_chunk = max(1, CHUNK_BYTES // self.row_bytes)
        make = BLOCKS[self.qtype]
        for start in range(0, self.rows, rows_per_chunk):
            r = min(rows_per_chunk, self.rows - start)
            yield make(rng, r * blocks_per_row, self.std)


# ---- presets --------------------------------------------------------------------------------


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama-quant.cpp's choice of the layers whose attn_v and ffn_down get more bits in Q4_K_M."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


@dataclass
class Preset:
    arch: str
    full_layers: int
    default_layers: int
    metadata: dict  # key (without the "<arch>." prefix where `arch_keys`) -> (type, value)
    tensors: callable  # (layers) -> list[Tensor]
    tokenizer: callable  # (writer, args) -> None
    notes: list[str] = field(default_factory=list)


QWEN3 = dict(hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128, experts=128, used=8,
             expert_ff=768, dense_ff=6144, vocab=151936, ctx=40960, theta=1e6, eps=1e-6)


def qwen3moe_tensors(n_layers: int) -> list[Tensor]:
    c = QWEN3
    h, q, kv, e, ff, v = c["hidden"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"], c["experts"], c["expert_ff"], c["vocab"]
    t = [Tensor("token_embd.weight", (h, v), QT.Q4_K, std=EMBD_STD)]
    for i in range(n_layers):
        p = f"blk.{i}."
        # Q4_K_M: attn_v and ffn_down Q6_K on the layers use_more_bits picks (over the full model's
        # 48 layers, so the kept layers are the first of a real file), Q4_K elsewhere
        more = QT.Q6_K if use_more_bits(i, c["layers"]) else QT.Q4_K
        t += [
            Tensor(p + "attn_norm.weight", (h,), QT.F32, "ones"),
            Tensor(p + "attn_q.weight", (h, q), QT.Q4_K),
            Tensor(p + "attn_k.weight", (h, kv), QT.Q4_K),
            Tensor(p + "attn_v.weight", (h, kv), more),
            Tensor(p + "attn_output.weight", (q, h), QT.Q4_K, std=ATTN_OUT_STD),
            Tensor(p + "attn_q_norm.weight", (c["head_dim"],), QT.F32, "ones"),
            Tensor(p + "attn_k_norm.weight", (c["head_dim"],), QT.F32, "ones"),
            Tensor(p + "ffn_norm.weight", (h,), QT.F32, "ones"),
            Tensor(p + "ffn_gate_inp.weight", (h, e), QT.F32),
            Tensor(p + "ffn_gate_exps.weight", (h, ff, e), QT.Q4_K),
            Tensor(p + "ffn_up_exps.weight", (h, ff, e), QT.Q4_K),
            Tensor(p + "ffn_down_exps.weight", (ff, h, e), more),
        ]
    t += [Tensor("output_norm.weight", (h,), QT.F32, "ones"), Tensor("output.weight", (h, v), QT.Q6_K)]
    return t


def qwen3moe_metadata(n_layers: int) -> list[tuple[str, str, object]]:
    c = QWEN3
    a = "qwen3moe"
    return [
        ("general.name", "str", "Qwen3 30B A3B (synthetic: random weights)"),
        ("general.basename", "str", "Qwen3"),
        ("general.size_label", "str", "30B-A3B"),
        (f"{a}.block_count", "u32", n_layers),
        (f"{a}.context_length", "u32", c["ctx"]),
        (f"{a}.embedding_length", "u32", c["hidden"]),
        (f"{a}.feed_forward_length", "u32", c["dense_ff"]),
        (f"{a}.attention.head_count", "u32", c["heads"]),
        (f"{a}.attention.head_count_kv", "u32", c["kv_heads"]),
        (f"{a}.rope.freq_base", "f32", c["theta"]),
        (f"{a}.attention.layer_norm_rms_epsilon", "f32", c["eps"]),
        (f"{a}.expert_count", "u32", c["experts"]),
        (f"{a}.expert_used_count", "u32", c["used"]),
        (f"{a}.attention.key_length", "u32", c["head_dim"]),
        (f"{a}.attention.value_length", "u32", c["head_dim"]),
        ("general.file_type", "u32", int(gguf.LlamaFileType.MOSTLY_Q4_K_M)),
        (f"{a}.expert_feed_forward_length", "u32", c["expert_ff"]),
        ("general.quantization_version", "u32", gguf.GGML_QUANT_VERSION),
    ]


GPTOSS = dict(hidden=2880, layers=24, heads=64, kv_heads=8, head_dim=64, experts=32, used=4,
              expert_ff=2880, vocab=201088, ctx=131072, theta=150000.0, eps=1e-5, window=128,
              yarn_factor=32.0, yarn_orig_ctx=4096, yarn_beta_fast=32.0, yarn_beta_slow=1.0)


def gptoss_tensors(n_layers: int) -> list[Tensor]:
    c = GPTOSS
    h, q, kv, e, ff, v = c["hidden"], c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"], c["experts"], c["expert_ff"], c["vocab"]
    t = [Tensor("token_embd.weight", (h, v), QT.Q8_0, std=EMBD_STD)]
    for i in range(n_layers):
        p = f"blk.{i}."
        t += [
            Tensor(p + "attn_norm.weight", (h,), QT.F32, "ones"),
            Tensor(p + "attn_q.weight", (h, q), QT.Q8_0),
            Tensor(p + "attn_q.bias", (q,), QT.F32),
            Tensor(p + "attn_k.weight", (h, kv), QT.Q8_0),
            Tensor(p + "attn_k.bias", (kv,), QT.F32),
            Tensor(p + "attn_v.weight", (h, kv), QT.Q8_0),
            Tensor(p + "attn_v.bias", (kv,), QT.F32),
            Tensor(p + "attn_output.weight", (q, h), QT.Q8_0, std=ATTN_OUT_STD),
            Tensor(p + "attn_output.bias", (h,), QT.F32),
            Tensor(p + "attn_sinks.weight", (c["heads"],), QT.F32, std=1.0),
            Tensor(p + "post_attention_norm.weight", (h,), QT.F32, "ones"),
            Tensor(p + "ffn_gate_inp.weight", (h, e), QT.F32),
            Tensor(p + "ffn_gate_inp.bias", (e,), QT.F32),
            Tensor(p + "ffn_gate_exps.weight", (h, ff, e), QT.MXFP4),
            Tensor(p + "ffn_gate_exps.bias", (ff, e), QT.F32),
            Tensor(p + "ffn_up_exps.weight", (h, ff, e), QT.MXFP4),
            Tensor(p + "ffn_up_exps.bias", (ff, e), QT.F32),
            Tensor(p + "ffn_down_exps.weight", (ff, h, e), QT.MXFP4),
            Tensor(p + "ffn_down_exps.bias", (h, e), QT.F32),
        ]
    t += [Tensor("output_norm.weight", (h,), QT.F32, "ones"), Tensor("output.weight", (h, v), QT.Q8_0)]
    return t


def gptoss_metadata(n_layers: int) -> list[tuple[str, str, object]]:
    c = GPTOSS
    a = "gpt-oss"
    return [
        ("general.name", "str", "Gpt Oss 20b (synthetic: random weights)"),
        ("general.basename", "str", "gpt-oss"),
        ("general.size_label", "str", "20B"),
        (f"{a}.block_count", "u32", n_layers),
        (f"{a}.context_length", "u32", c["ctx"]),
        (f"{a}.embedding_length", "u32", c["hidden"]),
        (f"{a}.feed_forward_length", "u32", c["expert_ff"]),
        (f"{a}.attention.head_count", "u32", c["heads"]),
        (f"{a}.attention.head_count_kv", "u32", c["kv_heads"]),
        (f"{a}.rope.scaling.type", "str", "yarn"),
        (f"{a}.rope.scaling.factor", "f32", c["yarn_factor"]),
        (f"{a}.rope.scaling.original_context_length", "u32", c["yarn_orig_ctx"]),
        (f"{a}.rope.scaling.yarn_beta_fast", "f32", c["yarn_beta_fast"]),
        (f"{a}.rope.scaling.yarn_beta_slow", "f32", c["yarn_beta_slow"]),
        (f"{a}.rope.freq_base", "f32", c["theta"]),
        (f"{a}.attention.layer_norm_rms_epsilon", "f32", c["eps"]),
        (f"{a}.expert_count", "u32", c["experts"]),
        (f"{a}.expert_used_count", "u32", c["used"]),
        (f"{a}.attention.key_length", "u32", c["head_dim"]),
        (f"{a}.attention.value_length", "u32", c["head_dim"]),
        ("general.file_type", "u32", int(gguf.LlamaFileType.MOSTLY_MXFP4_MOE)),
        (f"{a}.attention.sliding_window", "u32", c["window"]),
        (f"{a}.expert_feed_forward_length", "u32", c["expert_ff"]),
        ("general.quantization_version", "u32", gguf.GGML_QUANT_VERSION),
    ]


# ---- tokenizers -----------------------------------------------------------------------------


def read_tokenizer(path: Path) -> dict:
    r = gguf.GGUFReader(path)
    out = {}
    for k, f in r.fields.items():
        if k.startswith("tokenizer."):
            out[k] = (f.types, f.contents())
    return out


def write_field(w: gguf.GGUFWriter, key: str, types, value) -> None:
    V = gguf.GGUFValueType
    if types[0] == V.ARRAY:
        sub = types[1]
        w.add_key_value(key, value, V.ARRAY, sub_type=sub)
    else:
        w.add_key_value(key, value, types[0])


def qwen_tokenizer(w: gguf.GGUFWriter, src: Path) -> list[str]:
    """The Qwen2.5 GGUF's tokenizer.* keys, unchanged (Qwen3 has the same 151936-entry vocabulary
    and merges; its chat template and eos differ: Qwen2.5's are kept)."""
    tok = read_tokenizer(src)
    assert len(tok["tokenizer.ggml.tokens"][1]) == QWEN3["vocab"], len(tok["tokenizer.ggml.tokens"][1])
    for k, (types, value) in tok.items():
        write_field(w, k, types, value)
    return [f"tokenizer: {len(tok)} tokenizer.* keys copied from {src.name}"]


# o200k_harmony's special tokens at their real ids (the rest of 199998..201087 are reserved)
HARMONY = {199998: "<|startoftext|>", 199999: "<|endoftext|>", 200002: "<|return|>", 200003: "<|constrain|>",
           200005: "<|channel|>", 200006: "<|start|>", 200007: "<|end|>", 200008: "<|message|>", 200012: "<|call|>"}


def gptoss_tokenizer(w: gguf.GGUFWriter, src: Path) -> list[str]:
    """A stand-in for o200k_harmony (not on this machine): Qwen2.5's byte-level BPE tokens and
    merges (ids 0..151642), unused padding to 199997, then the harmony specials at their real ids
    199998..200012 and reserved specials to 201087, as the converter marks them (control)."""
    tok = read_tokenizer(src)
    qtokens = tok["tokenizer.ggml.tokens"][1]
    qtypes = tok["tokenizer.ggml.token_type"][1]
    n_normal = 151643
    assert all(t == 1 for t in qtypes[:n_normal])
    V = GPTOSS["vocab"]
    tokens = list(qtokens[:n_normal])
    types = [int(gguf.TokenType.NORMAL)] * n_normal
    for i in range(n_normal, 199998):
        tokens.append(f"[PAD{i}]")
        types.append(int(gguf.TokenType.UNUSED))
    for i in range(199998, V):
        tokens.append(HARMONY.get(i, f"<|reserved_{i}|>"))
        types.append(int(gguf.TokenType.CONTROL))
    assert len(tokens) == V and len(set(tokens)) == V
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-4o")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(tok["tokenizer.ggml.merges"][1])
    w.add_bos_token_id(199998)
    w.add_eos_token_id(200002)
    w.add_pad_token_id(199999)
    return [f"tokenizer: stand-in, {n_normal} byte-level BPE tokens and {len(tok['tokenizer.ggml.merges'][1])} merges "
            f"from {src.name}, unused [PADn] to 199997, harmony specials at 199998..200012 and reserved to {V - 1}"]


PRESETS = {
    "qwen3-30b-a3b": Preset("qwen3moe", 48, 24, qwen3moe_metadata, qwen3moe_tensors, qwen_tokenizer),
    "gpt-oss-20b": Preset("gpt-oss", 24, 24, gptoss_metadata, gptoss_tensors, gptoss_tokenizer),
}

# ---- writing --------------------------------------------------------------------------------


def add_kv(w: gguf.GGUFWriter, key: str, kind: str, value) -> None:
    V = gguf.GGUFValueType
    vt = {"u32": V.UINT32, "f32": V.FLOAT32, "str": V.STRING, "bool": V.BOOL}[kind]
    w.add_key_value(key, value, vt)


def write_streamed(w: gguf.GGUFWriter, t: Tensor, seed: int, chunks=None) -> None:
    """GGUFWriter.write_tensor_data for one tensor, its bytes written chunk by chunk (gguf-py
    0.19's writer state: the next tensor info is popped, the data padded to the alignment);
    `chunks` replaces the tensor's own random bytes."""
    fout = w.fout[0]
    name = next(iter(w.tensors[0]))
    assert name == t.name, (name, t.name)
    ti = w.tensors[0].pop(name)
    w.write_padding(fout, fout.tell())
    written = 0
    for c in chunks if chunks is not None else t.chunks(seed):
        c.tofile(fout)
        written += c.nbytes
    assert written == ti.nbytes == (t.nbytes if t.qtype != QT.F32 else 4 * int(np.prod(t.ne))), (t.name, written, ti.nbytes)
    w.write_padding(fout, written)
    w.state = gguf.gguf_writer.WriterState.WEIGHTS


def successor_head(tensors: list[Tensor], tokenizer_src: Path, seed: int, out: Path):
    """Replaces the output head by successor.py's (Q8_0), writes the cycle beside `out` and
    returns the head's chunks."""
    import json
    import successor
    embd = next(t for t in tensors if t.name == "token_embd.weight")
    i = next(i for i, t in enumerate(tensors) if t.name == "output.weight")
    tensors[i] = Tensor("output.weight", tensors[i].ne, QT.Q8_0, init="successor")
    pieces = list(read_tokenizer(tokenizer_src)["tokenizer.ggml.tokens"][1])
    cycle = successor.word_cycle(pieces, seed)
    successor.cycle_path(out).write_text(json.dumps({"seed": seed, "cycle": cycle}))
    rows = max(1, CHUNK_BYTES // tensors[i].row_bytes)
    return successor.head_chunks(embd.chunks(seed), embd.row_bytes, embd.qtype, embd.ne[1], pieces,
                                 cycle, seed, rows)


def make(preset: Preset, layers: int, out: Path, tokenizer_src: Path, seed: int,
         succ: bool = False) -> None:
    tensors = preset.tensors(layers)
    head = successor_head(tensors, tokenizer_src, seed, out) if succ else None
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(out.suffix + ".part")
    w = gguf.GGUFWriter(tmp, preset.arch)
    for key, kind, value in preset.metadata(layers):
        add_kv(w, key, kind, value)
    notes = preset.tokenizer(w, tokenizer_src)
    for t in tensors:
        if t.qtype == QT.F32:
            shape = tuple(reversed(t.ne))
            w.add_tensor_info(t.name, shape, np.dtype(np.float32), 4 * int(np.prod(t.ne)))
        else:
            w.add_tensor_info(t.name, t.byte_shape(), np.dtype(np.uint8), t.nbytes, raw_dtype=t.qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = sum(t.nbytes if t.qtype != QT.F32 else 4 * int(np.prod(t.ne)) for t in tensors)
    t0, done = time.time(), 0
    for i, t in enumerate(tensors):
        write_streamed(w, t, seed, head if t.init == "successor" else None)
        done += t.nbytes if t.qtype != QT.F32 else 0
        if t.nbytes > 50e6 or i == len(tensors) - 1:
            print(f"\r{done / 1e9:6.2f} / {total / 1e9:.2f} GB  {t.name:32s} {time.time() - t0:5.0f} s", end="", file=sys.stderr)
    print(file=sys.stderr)
    w.close()
    os.replace(tmp, out)
    for n in notes:
        print(n)
    print(f"wrote {out}: {out.stat().st_size / 1e9:.2f} GB, {len(tensors)} tensors, {layers} of {preset.full_layers} layers")


def check(path: Path, sample_rows: int = 64) -> None:
    """Reread the file: every tensor's type and shape, and a sample of each dequantized (first
    and last rows), finite and of the intended spread."""
    r = gguf.GGUFReader(path)
    counts: dict[str, int] = {}
    worst = 0.0
    for t in r.tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        data = t.data
        rows = data.reshape(-1, data.shape[-1])
        sample = np.concatenate([rows[:sample_rows], rows[-sample_rows:]])
        x = gguf.quants.dequantize(sample, t.tensor_type)
        assert np.isfinite(x).all(), t.name
        worst = max(worst, float(np.abs(x).max()))
        if t.tensor_type != QT.F32:
            s = float(x.std())
            want = EMBD_STD if t.name == "token_embd.weight" else ATTN_OUT_STD if "attn_output" in t.name else TARGET_STD
            assert 0.5 * want < s < 2 * want, (t.name, s, want)
    print(f"check: {len(r.tensors)} tensors {dict(sorted(counts.items()))}; sampled values finite, "
          f"every matrix's std within 2x of its intended one, largest |value| {worst:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", choices=sorted(PRESETS), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, help="keep the first N layers (default: qwen3-30b-a3b 24 of 48, gpt-oss-20b all 24)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer-gguf", type=Path,
                    default=Path(os.environ.get("PLD_TOKENIZER_GGUF", "/root/.cache/pld/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")))
    ap.add_argument("--successor-head", action="store_true",
                    help="an output head that makes the next token known (successor.py; qwen tokenizer only)")
    ap.add_argument("--check", action="store_true", help="reread the written file and dequantize a sample of every tensor")
    ap.add_argument("--check-only", action="store_true", help="only check an existing --out file")
    a = ap.parse_args()
    p = PRESETS[a.preset]
    if a.successor_head and a.preset != "qwen3-30b-a3b":
        ap.error("--successor-head needs the qwen3-30b-a3b preset (its tokenizer is the real one)")
    if not a.check_only:
        layers = a.layers or p.default_layers
        assert 1 <= layers <= p.full_layers, layers
        make(p, layers, a.out, a.tokenizer_gguf, a.seed, a.successor_head)
    if a.check or a.check_only:
        check(a.out)


if __name__ == "__main__":
    main()
