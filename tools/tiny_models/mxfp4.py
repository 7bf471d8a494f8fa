"""Writes crates/engine/tests/tiny/mxfp4.gguf: MXFP4 tensors quantized and dequantized by gguf-py
(llama.cpp's own Python package), for pld's test that its reading and dequantization of MXFP4
(ggml type 39) are llama.cpp's, bit for bit.

Tensors (pld's names; shapes outermost first):
- `w.source` F32 [2, 96]: known floats; `w` MXFP4 [2, 96]: gguf-py's quantization of them;
  `w.dequantized` F32 [2, 96]: gguf-py's dequantization of `w`.
- `blk.0.ffn_up_exps.weight` MXFP4 [3, 3, 64]: three experts of 3x64, quantized by gguf-py, then
  the exponent bytes of a few blocks set to the ends of the range (0, 1, 2, 254, 255: the
  subnormal and largest scales); `blk.0.ffn_up_exps.dequantized` F32 [3, 3, 64]: gguf-py's
  dequantization of those bytes. An expert is 102 bytes, so the second starts off 4-byte
  alignment.

Run: /work/pyenv-moe/bin/python tools/tiny_models/mxfp4.py (gguf 0.19, numpy).
"""

import sys
from pathlib import Path

import numpy as np
import gguf
from gguf.quants import quantize, dequantize

MXFP4 = gguf.GGMLQuantizationType.MXFP4
OUT = Path(__file__).resolve().parents[2] / "crates/engine/tests/tiny/mxfp4.gguf"


def main() -> None:
    rng = np.random.default_rng(39)
    # Row 0: random normals at several magnitudes; row 1: values on and between the grid, ties,
    # an all-zero block and a block with one large value.
    src = np.zeros((2, 96), dtype=np.float32)
    src[0] = rng.standard_normal(96).astype(np.float32) * np.repeat([0.02, 1.0, 300.0], 32)
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)
    src[1, :32] = np.concatenate([grid, -grid, grid + 0.25, -(grid + 0.25)])
    src[1, 32:64] = 0.0
    src[1, 64:] = rng.standard_normal(32).astype(np.float32) * 1e-3
    src[1, 70] = 5.0e4
    w = quantize(src, MXFP4)
    w_deq = dequantize(w, MXFP4)

    experts = (rng.standard_normal((3, 3, 64)) * 0.1).astype(np.float32)
    e = quantize(experts, MXFP4)  # uint8 [3, 3, 2 * 17]
    blocks = e.reshape(-1, 17)
    for block, exponent in [(0, 0), (3, 1), (7, 2), (11, 254), (16, 255)]:
        blocks[block, 0] = exponent
    e = blocks.reshape(3, 3, 34)
    with np.errstate(over="ignore"):  # 12 * 2^127 and the like: inf, as in ggml
        e_deq = dequantize(e, MXFP4)

    writer = gguf.GGUFWriter(str(OUT), "mxfp4-test")
    writer.add_tensor("w.source", src)
    writer.add_tensor("w", w, raw_dtype=MXFP4)
    writer.add_tensor("w.dequantized", w_deq.astype(np.float32))
    writer.add_tensor("blk.0.ffn_up_exps.weight", e, raw_dtype=MXFP4)
    writer.add_tensor("blk.0.ffn_up_exps.dequantized", e_deq.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
