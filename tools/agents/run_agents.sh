#!/usr/bin/env bash
# Real coding agents against `pld serve`, end to end (run by hand; see docs/agents.md):
# OpenAI's Codex CLI over the Responses API, Anthropic's Claude Code over the Messages API and
# aider over chat completions, each asked for the same small edit in its own scratch git
# repository. Every request is recorded (`--record-requests`) for `pld bench replay`.
#
#   tools/agents/run_agents.sh [MODEL] [OUT_DIR]     (default qwen-coder-1.5b, /tmp/pld-agents)
#
# Installs the agents into OUT_DIR/npm (npm: @openai/codex, @anthropic-ai/claude-code) and
# OUT_DIR/aider-venv (PyPI: aider-chat) on first use. Prints, per agent: its exit code, wall time,
# the requests it made, and the diff it left.
set -uo pipefail
MODEL=${1:-qwen-coder-1.5b}
OUT=${2:-/tmp/pld-agents}
PORT=${PORT:-8123}
PLD=${PLD:-$(cd "$(dirname "$0")/../.." && pwd)/target/release/pld}
LIMIT=${LIMIT:-900}
TASK="Rename the function add in calc.py to add_numbers, and update its use in main.py."
mkdir -p "$OUT"

if [ ! -x "$OUT/npm/node_modules/.bin/codex" ] || [ ! -x "$OUT/npm/node_modules/.bin/claude" ]; then
  (mkdir -p "$OUT/npm" && cd "$OUT/npm" && npm init -y >/dev/null && npm install --silent @openai/codex @anthropic-ai/claude-code) || exit 1
fi
if [ ! -x "$OUT/aider-venv/bin/aider" ]; then
  python3 -m venv "$OUT/aider-venv" && "$OUT/aider-venv/bin/pip" install --quiet aider-chat || exit 1
fi

scratch() {  # a fresh repository with the two files the task edits
  rm -rf "$1" && mkdir -p "$1" && cd "$1" && git init -q
  printf 'def add(a, b):\n    """Return the sum of a and b."""\n    return a + b\n' > calc.py
  printf 'from calc import add\n\nprint(add(2, 3))\n' > main.py
  git add . && git -c user.email=pld@test -c user.name=pld commit -qm start
}

report() {  # agent, exit code, seconds, first request line
  local name=$1 rc=$2 secs=$3 from=$4 repo=$OUT/$1
  local n=$(( $(wc -l < "$OUT/record/requests.jsonl") - from ))
  echo "== $name: exit $rc, ${secs}s, $n requests"
  git -C "$repo" diff --stat; git -C "$repo" diff | head -40
  if python3 "$repo/main.py" 2>/dev/null | grep -qx 5 && grep -q "def add_numbers" "$repo/calc.py" \
     && grep -q "add_numbers" "$repo/main.py"; then echo "edit: right"; else echo "edit: not done"; fi
}

"$PLD" serve --model "$MODEL" --port "$PORT" --lenient --record-requests "$OUT/record" > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done
touch "$OUT/record/requests.jsonl"

# Codex CLI: a model provider whose wire API is `responses`.
export CODEX_HOME=$OUT/codex-home
mkdir -p "$CODEX_HOME"
cat > "$CODEX_HOME/config.toml" <<TOML
model = "$MODEL"
model_provider = "pld"
[model_providers.pld]
name = "pld"
base_url = "http://127.0.0.1:$PORT/v1"
wire_api = "responses"
TOML
from=$(wc -l < "$OUT/record/requests.jsonl"); scratch "$OUT/codex"; t=$SECONDS
timeout "$LIMIT" "$OUT/npm/node_modules/.bin/codex" exec --skip-git-repo-check --sandbox workspace-write \
  --ephemeral "$TASK" < /dev/null > "$OUT/codex.log" 2>&1
report codex $? $((SECONDS - t)) "$from"

# Claude Code: the Messages API at ANTHROPIC_BASE_URL.
from=$(wc -l < "$OUT/record/requests.jsonl"); scratch "$OUT/claude"; t=$SECONDS
ANTHROPIC_BASE_URL=http://127.0.0.1:$PORT ANTHROPIC_AUTH_TOKEN=none ANTHROPIC_MODEL=$MODEL \
  ANTHROPIC_SMALL_FAST_MODEL=$MODEL ANTHROPIC_DEFAULT_HAIKU_MODEL=$MODEL DISABLE_TELEMETRY=1 \
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 HOME=$OUT/claude-home \
  timeout "$LIMIT" "$OUT/npm/node_modules/.bin/claude" -p "$TASK" --permission-mode acceptEdits \
  < /dev/null > "$OUT/claude.log" 2>&1
report claude $? $((SECONDS - t)) "$from"

# aider: chat completions through litellm's OpenAI-compatible provider.
from=$(wc -l < "$OUT/record/requests.jsonl"); scratch "$OUT/aider"; t=$SECONDS
LITELLM_LOCAL_MODEL_COST_MAP=True timeout "$LIMIT" "$OUT/aider-venv/bin/aider" --model "openai/$MODEL" \
  --openai-api-base "http://127.0.0.1:$PORT/v1" --openai-api-key none --yes-always --no-check-update \
  --analytics-disable --no-show-model-warnings --no-auto-commits --no-gitignore --no-pretty \
  --message "$TASK" calc.py main.py < /dev/null > "$OUT/aider.log" 2>&1
report aider $? $((SECONDS - t)) "$from"
