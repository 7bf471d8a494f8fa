"""A synthetic model whose next token is known: the "successor head", and workloads built on it.

A random-weight model generates gibberish that never repeats its prompt, so prompt lookup never
drafts on it and the pricing of drafted rows is never exercised by a rejected draft. The
successor head fixes the model's choice of next token without touching anything that is timed:
the token embedding of these files is 20x larger than the other matrices (make.py), so the last
layer's residual keeps a large component along the current token's embedding; an output head
whose row for token `succ(t)` is `t`'s embedding then makes `succ(t)` win the argmax by a wide
margin. `succ` walks one random cycle through the vocabulary's plain lowercase words (pieces
`Ġ[a-z]{3,}`, which decode to " word" and encode back to the same id), and `\n` (the last token
of a chat template's generation prompt) leads into the cycle. The experts, attention, routing
and sizes are make.py's; only the head's content changes (written as Q8_0, 1.13x Q6_K's bytes).

Workloads then set the acceptance of prompt-lookup drafts exactly, in Spec-Bench's format:
- `follow`: the prompt holds the cycle from its start, so every draft copied from it is right;
- `mislead`: every cycle word of the prompt is followed by a different random word, so every
  draft from a match (a one-token match: two-token matches do not occur) is wrong at its first
  token;
- `mixed`: the cycle with every fourth word replaced, so drafts are right for up to three tokens.

    /work/pyenv-moe/bin/python tools/synthetic/make.py --preset qwen3-30b-a3b --successor-head --out FILE
    /work/pyenv-moe/bin/python tools/synthetic/successor.py workload FILE --out successor.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

NEWLINE = "Ċ"  # byte-level BPE's piece for "\n"
WORD = re.compile(r"^Ġ[a-z]{3,}$")
HEAD_STD = 0.025  # the rows of tokens outside the cycle: make.py's usual spread


def cycle_path(model: Path) -> Path:
    return model.with_suffix(model.suffix + ".cycle.json")


def word_cycle(pieces: list[str], seed: int) -> list[int]:
    """The ids of the plain-word pieces, in a random order fixed by `seed`: `succ` maps each to
    the next, and the last to the first."""
    words = [i for i, p in enumerate(pieces) if WORD.match(p)]
    rng = np.random.default_rng(seed + 7919)
    return [words[i] for i in rng.permutation(len(words))]


def predecessors(pieces: list[str], cycle: list[int]) -> dict[int, list[int]]:
    """For each token the head makes reachable, the tokens whose embeddings its row sums."""
    pred = {cycle[(k + 1) % len(cycle)]: [cycle[k]] for k in range(len(cycle))}
    pred[cycle[0]].append(pieces.index(NEWLINE))
    return pred


def head_chunks(embedding_chunks, row_bytes: int, embd_type: QT, vocab: int, pieces: list[str],
                cycle: list[int], seed: int, rows_per_chunk: int):
    """The successor head's Q8_0 bytes in chunks of whole rows. `embedding_chunks` are the
    token embedding's bytes as make.py writes them (regenerated from the same seed)."""
    pred = predecessors(pieces, cycle)
    wanted = {t for ts in pred.values() for t in ts}
    emb: dict[int, np.ndarray] = {}
    start = 0
    for c in embedding_chunks:
        rows = c.reshape(-1, row_bytes)
        values = gguf.quants.dequantize(rows, embd_type)
        for r in range(rows.shape[0]):
            if start + r in wanted:
                emb[start + r] = values[r].astype(np.float32)
        start += rows.shape[0]
    assert start == vocab, (start, vocab)
    hidden = next(iter(emb.values())).shape[0]
    rng = np.random.default_rng(seed + 104729)
    for first in range(0, vocab, rows_per_chunk):
        n = min(rows_per_chunk, vocab - first)
        block = (HEAD_STD * rng.standard_normal((n, hidden))).astype(np.float32)
        for j in range(first, first + n):
            if j in pred:
                block[j - first] = sum(emb[t] for t in pred[j])
        yield gguf.quants.quantize(block, QT.Q8_0)


def _pieces(model: Path) -> list[str]:
    r = gguf.GGUFReader(model)
    return list(r.fields["tokenizer.ggml.tokens"].contents())


def _text(pieces: list[str], ids: list[int]) -> str:
    return "".join(" " + pieces[i][1:] for i in ids)


def workload(model: Path, out: Path, words: int, rows: int, seed: int) -> None:
    """Rows of three categories (see the module's text), `rows` of each, prompts of `words`
    words. The model's answer starts at the cycle's first word whatever the prompt says."""
    pieces = _pieces(model)
    cycle = json.loads(cycle_path(model).read_text())["cycle"]
    rng = np.random.default_rng(seed)
    lines = []
    for i in range(rows):
        ask = f"Continue list {i + 1} of these words exactly:"
        chain = cycle[:words]
        decoys = [int(x) for x in rng.choice(cycle[words:], size=words, replace=False)]
        mislead = [t for pair in zip(chain, decoys) for t in pair]
        mixed = [d if k % 4 == 3 else c for k, (c, d) in enumerate(zip(chain, decoys))]
        for cat, ids in (("follow", chain), ("mislead", mislead), ("mixed", mixed)):
            lines.append({"question_id": f"{cat}-{i}", "category": cat,
                          "turns": [ask + _text(pieces, ids)]})
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))
    print(f"wrote {out}: {len(lines)} rows, {words}-word prompts; the answer starts"
          f"{_text(pieces, cycle[:6])} ...")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("workload", help="write follow / mislead / mixed rows for a successor-head file")
    w.add_argument("model", type=Path)
    w.add_argument("--out", type=Path, required=True)
    w.add_argument("--words", type=int, default=160)
    w.add_argument("--rows", type=int, default=3)
    w.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.cmd == "workload":
        workload(a.model, a.out, a.words, a.rows, a.seed)


if __name__ == "__main__":
    sys.exit(main())
