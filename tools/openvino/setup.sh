#!/usr/bin/env bash
# Create a Python venv with OpenVINO GenAI for tools/openvino/ttft.py.
# Idempotent: re-running reuses the venv and skips the install when the pinned version is present.
# Usage: tools/openvino/setup.sh            (venv at /tmp/ov-venv)
#        OV_VENV=/path/to/venv tools/openvino/setup.sh
set -euo pipefail

OV_VENV="${OV_VENV:-/tmp/ov-venv}"
OV_GENAI_VERSION="${OV_GENAI_VERSION:-2026.4.1.0}"
PYTHON="${PYTHON:-python3}"

if [ ! -x "$OV_VENV/bin/python" ]; then
    echo "creating venv at $OV_VENV" >&2
    "$PYTHON" -m venv "$OV_VENV"
fi

have="$("$OV_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("openvino-genai"))' 2>/dev/null || true)"
if [ "$have" = "$OV_GENAI_VERSION" ]; then
    echo "openvino-genai $have already installed in $OV_VENV" >&2
else
    "$OV_VENV/bin/python" -m pip install --quiet --upgrade pip
    "$OV_VENV/bin/python" -m pip install --quiet "openvino-genai==$OV_GENAI_VERSION"
fi

"$OV_VENV/bin/python" - <<'PY'
import openvino, openvino_genai
print("openvino", openvino.__version__)
print("openvino_genai", openvino_genai.__version__)
PY
echo "python: $OV_VENV/bin/python" >&2
