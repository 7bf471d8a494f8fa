#!/usr/bin/env bash
# A copy-heavy agent workload, recorded for `pld bench replay`: aider asked for three edits in a row
# to one 122-line Python file (tools/agents/subject/load.py, a frozen copy of an early tools/serve_load/load.py), in a scratch git repository,
# through `pld serve --record-requests`. aider's edit format for a model it does not know is
# "whole": every answer re-sends the whole file with the edit in it, and every request re-sends
# the file as it now is, which is what prompt lookup and the prefix cache are for. Run by hand
# (see docs/agents.md):
#
#   tools/agents/aider_edits.sh [MODEL] [OUT_DIR]     (default qwen-coder-1.5b, /tmp/pld-aider)
#   pld bench replay --model MODEL --requests OUT_DIR/record/requests.jsonl --threads 2
#
# With SESSION=1 the edits (and a fourth, a new flag) are one aider session instead of one aider run
# each: the tasks are typed into one aider process (`--no-fancy-input` reads them from stdin), so
# every request carries the chat so far, as a user's session does.
#
# Installs aider into OUT_DIR/aider-venv (PyPI: aider-chat) on first use. Prints each edit's exit
# code, wall time and diff size.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MODEL=${1:-qwen-coder-1.5b}
OUT=${2:-/tmp/pld-aider}
PORT=${PORT:-8124}
PLD=${PLD:-$ROOT/target/release/pld}
LIMIT=${LIMIT:-900}
AIDER=${AIDER:-$OUT/aider-venv/bin/aider}
mkdir -p "$OUT"
if [ ! -x "$AIDER" ]; then
  python3 -m venv "$OUT/aider-venv" && "$OUT/aider-venv/bin/pip" install --quiet aider-chat || exit 1
fi

REPO=$OUT/repo
rm -rf "$REPO" "$OUT/record" && mkdir -p "$REPO" && cp "$ROOT/tools/agents/subject/load.py" "$REPO/"
git -C "$REPO" init -q && git -C "$REPO" add . && git -C "$REPO" -c user.email=pld@test -c user.name=pld commit -qm start

"$PLD" serve --model "$MODEL" --port "$PORT" --lenient --record-requests "$OUT/record" > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 1; done

TASKS=(
  "Rename the function ask to ask_once in load.py, and update every call."
  "In load.py, rename the parameter max_tokens to max_new_tokens everywhere."
  "Add a one-line docstring to the nested function client in load.py."
)
aider() {
  (cd "$REPO" && LITELLM_LOCAL_MODEL_COST_MAP=True timeout "$LIMIT" "$AIDER" --model "openai/$MODEL" \
    --openai-api-base "http://127.0.0.1:$PORT/v1" --openai-api-key none --yes-always \
    --no-check-update --analytics-disable --no-show-model-warnings --no-gitignore --no-pretty \
    --edit-format whole "$@")
}
if [ "${SESSION:-0}" = 1 ]; then
  TASKS+=("Add a --timeout flag to load.py that sets the HTTP timeout in seconds (default 600), and use it where requests are sent.")
  t=$SECONDS
  printf '%s\n' "${TASKS[@]}" | aider --no-fancy-input load.py > "$OUT/aider-session.log" 2>&1
  echo "== session of ${#TASKS[@]} edits: exit $?, $((SECONDS - t))s, $(git -C "$REPO" log --oneline | wc -l) commits"
else
  i=0
  for task in "${TASKS[@]}"; do
    i=$((i + 1)); t=$SECONDS
    aider --message "$task" load.py < /dev/null > "$OUT/aider-$i.log" 2>&1
    echo "== edit $i: exit $?, $((SECONDS - t))s, $(git -C "$REPO" diff HEAD~1 --shortstat 2>/dev/null)"
  done
fi
echo "requests recorded: $(wc -l < "$OUT/record/requests.jsonl") in $OUT/record/requests.jsonl"
