"""Weight bytes a forward pass over r rows reads from a mixture-of-experts GGUF, if each row picks
`used` of `experts` experts uniformly at random in every layer: the expected number of distinct
experts a layer touches is experts * (1 - (1 - used / experts)^r), and the pass reads every
non-expert matrix once (attention, router, norms, the output head), those experts' gate, up and
down slices in every layer, and r rows of the token embedding.

    /work/pyenv-moe/bin/python tools/synthetic/bytes_per_pass.py FILE [--rows 1,2,4,8,16,32,64] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gguf


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file", type=Path)
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = gguf.GGUFReader(a.file)
    arch = r.fields["general.architecture"].contents()
    experts = int(r.fields[f"{arch}.expert_count"].contents())
    used = int(r.fields[f"{arch}.expert_used_count"].contents())
    layers = int(r.fields[f"{arch}.block_count"].contents())
    expert_bytes = 0  # all experts of all layers
    dense = 0  # everything a pass reads whole
    embd_row = 0
    for t in r.tensors:
        n = int(t.n_bytes)
        if "_exps." in t.name and t.name.endswith(".weight"):
            expert_bytes += n
        elif t.name == "token_embd.weight":
            embd_row = n // int(t.shape[1])
        elif "_exps." in t.name:  # per-expert biases: small, read per touched expert too
            expert_bytes += n
        else:
            dense += n
    per_expert_all_layers = expert_bytes / experts
    rows = [int(x) for x in a.rows.split(",")]
    out = []
    for n in rows:
        touched = experts * (1 - (1 - used / experts) ** n)
        total = dense + touched * per_expert_all_layers + n * embd_row
        out.append({"rows": n, "experts_touched_per_layer": touched, "bytes": total})
    info = {"file": str(a.file), "arch": arch, "layers": layers, "experts": experts, "used": used,
            "file_bytes": a.file.stat().st_size, "dense_bytes": dense,
            "expert_bytes_per_expert_all_layers": per_expert_all_layers, "passes": out}
    if a.json:
        print(json.dumps(info, indent=1))
        return
    print(f"{a.file.name}: {arch}, {layers} layers, {experts} experts, {used} per row; "
          f"dense (attention, router, norms, output head) {dense / 1e9:.3f} GB, "
          f"one expert's gate+up+down over all layers {per_expert_all_layers / 1e6:.1f} MB")
    print("| rows | experts touched per layer | GB read per pass | ratio to 1 row |")
    print("|---:|---:|---:|---:|")
    for p in out:
        print(f"| {p['rows']} | {p['experts_touched_per_layer']:.1f} | {p['bytes'] / 1e9:.3f} | {p['bytes'] / out[0]['bytes']:.2f} |")


if __name__ == "__main__":
    main()
