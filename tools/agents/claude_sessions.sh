#!/usr/bin/env bash
# Two real Claude Code sessions in a row against `pld serve`, each started with its own first
# message (`claude -p`), as a script or CI job runs them: Claude Code's system prompt and tool list
# are the same in both, but its billing line (`x-anthropic-billing-header: cc_version=...`) takes a
# new suffix per session. Prints each request's prompt and cached tokens and time from the server's
# log, and keeps the requests for `pld bench replay`. Run by hand:
#
#   tools/agents/claude_sessions.sh [MODEL] [OUT_DIR] [-- extra pld serve flags]
#       (default qwen-coder-0.5b, /tmp/pld-claude; needs `npm install -g @anthropic-ai/claude-code`)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL=${1:-qwen-coder-0.5b}
OUT=${2:-/tmp/pld-claude}
shift 2 2>/dev/null; [ "${1:-}" = "--" ] && shift
PORT=${PORT:-8125}
PLD=${PLD:-$ROOT/target/release/pld}
LIMIT=${LIMIT:-1200}
command -v claude >/dev/null || { echo "claude not found: npm install -g @anthropic-ai/claude-code" >&2; exit 1; }

REPO=$OUT/repo
rm -rf "$REPO" "$OUT/record" && mkdir -p "$REPO"
cp "$ROOT/tools/agents/subject/load.py" "$REPO/"
git -C "$REPO" init -q && git -C "$REPO" add . && git -C "$REPO" -c user.email=pld@test -c user.name=pld commit -qm start

RUST_LOG=info "$PLD" serve --model "$MODEL" --port "$PORT" --lenient --record-requests "$OUT/record" "$@" > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null' EXIT
for _ in $(seq 300); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done

export ANTHROPIC_BASE_URL=http://127.0.0.1:$PORT ANTHROPIC_AUTH_TOKEN=none
export ANTHROPIC_MODEL=$MODEL ANTHROPIC_DEFAULT_HAIKU_MODEL=$MODEL ANTHROPIC_SMALL_FAST_MODEL=$MODEL
export CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 DISABLE_TELEMETRY=1 DISABLE_AUTOUPDATER=1
i=0
for task in \
  "In load.py, what does the function ask return? Answer in one sentence." \
  "List the command-line flags that load.py accepts."; do
  i=$((i + 1))
  start=$(date +%s.%N)
  (cd "$REPO" && timeout "$LIMIT" claude -p "$task" --max-turns 1 > "$OUT/session$i.txt" 2>&1)
  code=$?
  echo "session $i: exit $code, $(echo "$(date +%s.%N) - $start" | bc) s"
done
kill $SERVER 2>/dev/null
sed 's/\x1b\[[0-9;]*m//g' "$OUT/serve.log" | grep "request done" |
  sed -E 's/.*prompt_tokens=([0-9]+) cached_tokens=([0-9]+).* seconds="?([0-9.]+).*/prompt \1 cached \2 seconds \3/'
grep -o 'x-anthropic-billing-header: [^"]*' "$OUT/record/requests.jsonl" | sort | uniq -c
