#!/bin/bash
# The docs/bench/moe measurements, one step per call (run them one after another on an idle
# machine; each waits while /tmp/pld-quiet exists and records the load before and after):
#   tools/synthetic/bench.sh llama-pp   # llama-bench -p 1,2,4,8,16,32,64 -n 0 -r 3, 2 threads
#   tools/synthetic/bench.sh llama-tg   # llama-bench -p 0 -n 32 -r 3, 2 threads
#   CTX=0 tools/synthetic/bench.sh pld  # pld bench forward, 2 threads, passes over 1..64 rows after CTX cached (default 512)
# Variables: F (model file), L (llama.cpp bin folder), PLD (pld binary), OUT (results folder).
set -u
F=${F:-/work/synthetic-gguf/qwen3-30b-a3b-24l-synthetic.gguf}
L=${L:-/work/llama/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin}
PLD=${PLD:-/work/main/target/release/pld}
OUT=${OUT:-$(dirname "$0")/../../docs/bench/moe}
CTX=${CTX:-512}
snap() { echo "== $1 $(date -u +%FT%TZ) loadavg: $(cut -d' ' -f1-3 /proc/loadavg)"; top -bn1 | sed -n '7,12p'; free -m | head -2; }
while [ -e /tmp/pld-quiet ] && [ -z "${QUIET_OK:-}" ]; do sleep 20; done
case "${1:?step: llama-pp, llama-tg or pld}" in
 llama-pp) snap before > "$OUT/llama-bench-pp.load"
   "$L/llama-bench" -m "$F" -t 2 -p 1,2,4,8,16,32,64 -n 0 -r 3 -o json -oe md > "$OUT/llama-bench-pp.json" 2> "$OUT/llama-bench-pp.md"
   echo "rc $?"; snap after >> "$OUT/llama-bench-pp.load";;
 llama-tg) snap before > "$OUT/llama-bench-tg.load"
   "$L/llama-bench" -m "$F" -t 2 -p 0 -n 32 -r 3 -o json -oe md > "$OUT/llama-bench-tg.json" 2> "$OUT/llama-bench-tg.md"
   echo "rc $?"; snap after >> "$OUT/llama-bench-tg.load";;
 pld) snap before > "$OUT/pld-bench-forward-ctx$CTX.load"
   "$PLD" bench forward --model "$F" --threads 2 --repeats 3 --prefill-tokens 64 --context "$CTX" --json > "$OUT/pld-bench-forward-ctx$CTX.json" 2> "$OUT/pld-bench-forward-ctx$CTX.stderr"
   echo "rc $?"; snap after >> "$OUT/pld-bench-forward-ctx$CTX.load";;
 *) echo "unknown step $1" >&2; exit 2;;
esac
