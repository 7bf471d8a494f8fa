#!/usr/bin/env bash
# Types into a file in Vim with llama.vim completing against a server, accepts the completion
# with <Tab>, and prints the file as saved.
#
#   tools/editing_session/llama_vim.sh LLAMA_VIM_DIR http://127.0.0.1:8012 FILE KEYS [ACCEPT_MS]
#
# LLAMA_VIM_DIR: a checkout of https://github.com/ggml-org/llama.vim. KEYS: what is typed, as
# Vim keys (e.g. '2GA    return a': line 2, append). ACCEPT_MS: when <Tab> is pressed (default
# 15000), which leaves the server that long to answer. Vim runs in a pseudo-terminal (`script`),
# without swap file or viminfo; the file itself is not changed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
cp "$3" "$work/"
out="$work/out"
LLAMA_VIM=$1 PLD_URL=$2 TYPE_KEYS=$4 ACCEPT_MS=${5:-15000} OUT=$out TERM=xterm \
    timeout 120 script -qfec "vim -N -n -i NONE -u $here/llama_vim.vim $work/$(basename "$3")" \
    /dev/null >"$work/screen" 2>&1
cat "$out"
rm -rf "$work"
