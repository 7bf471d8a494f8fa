#!/usr/bin/env python3
"""Lists the import circles between the modules of each crate under crates/*/src.

A module is one file (`a/b.rs` or `a/b/mod.rs` is `a::b`). Module A depends on module B where A's
file names a path into B: a `use` or an inline path (`crate::x::y`, `super::y`, `self::y`, or a
child module's name, or a module brought in by `use`). A path that names an item goes to the
module that defines it, followed through re-exports (`pub use`). A file's inline test module is
left out. A module and its ancestors are left out of each other's edges: a parent declares its
children and re-exports them, a child reaches its parent's items; that is how Rust nests
modules, not a circle. A circle is a set of modules that reach each other
(a strongly connected component of two or more). Exits with 1 when there is one.

    python3 tools/circles/circles.py [ROOT]
"""

import re
import sys
from pathlib import Path

PATH = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP = re.compile(r"\buse\s+(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{([^;]*)\};", re.S)


def modules(src: Path) -> dict:
    """Every module of a crate: its path (tuple of names) -> its file."""
    mods = {}
    for f in src.rglob("*.rs"):
        rel = f.relative_to(src).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "mod" or (len(parts) == 1 and parts[0] in ("lib", "main")):
            parts = parts[:-1]
        mods[tuple(parts)] = f
    return mods


def strip(text: str) -> str:
    """The code without comments, string literals and an inline test module (at the file's end:
    tests may use anything)."""
    text = re.split(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text)[0]
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


DEFINES = r"(?:fn|struct|enum|const|static|type|trait|union|mod)\s+{}\b|macro_rules!\s*{}\b"


def defining(module: tuple, name: str, mods: dict, seen=None) -> tuple:
    """The module that defines `name` as module `module` offers it: itself, or the module a
    `pub use` re-exports it from (named or by `*`), followed to the end."""
    seen = seen or set()
    if module in seen or module not in mods:
        return module
    seen.add(module)
    code = strip(mods[module].read_text())
    if re.search(DEFINES.format(name, name), code):
        return module
    for m in re.finditer(r"\bpub(?:\([a-z]+\))?\s+use\s+([^;]+);", code):
        spec = m.group(1).replace(" ", "").replace("\n", "")
        base, _, group = spec.partition("::{")
        members = group.rstrip("}").split(",") if group else [base.split("::")[-1]]
        prefix = base.split("::")[:-1] if not group else base.split("::")
        for member in members:
            parts = prefix + [p for p in member.split("::") if p]
            last = parts[-1].split("as")[0] if parts else ""
            if last == name or last == "*":
                root = parts[0] if parts[0] in ("crate", "super", "self") else "self"
                rest = parts[1:-1] if parts[0] in ("crate", "super", "self") else parts[:-1]
                target = resolve(module, root, rest, mods)
                if target != module and (last == name or re.search(DEFINES.format(name, name), strip(mods[target].read_text()) if target in mods else "")):
                    return defining(target, name, mods, seen)
    return module


def resolve(here: tuple, root: str, rest: list, mods: dict):
    """The module a path from module `here` lands in (the longest module prefix), or None."""
    if root == "crate":
        base = ()
    elif root == "self":
        base = here
    else:
        base = here[:-1]
        while rest and rest[0] == "super":
            base, rest = base[:-1], rest[1:]
    target = base
    for i, name in enumerate(rest):
        if target + (name,) in mods:
            target = target + (name,)
        else:
            return defining(target, name, mods)
    return target


def edges_of(here: tuple, text: str, mods: dict) -> set:
    code = strip(text)
    out = set()
    paths = [(m.group(1), m.group(2)) for m in PATH.finditer(code)]
    # `use super::x::{a, b::c}`: each member starts from the group's path.
    for m in USE_GROUP.finditer(code):
        for member in re.split(r"[,\s]+", m.group(3)):
            member = member.strip("{} ")
            if member and member not in ("self", "*"):
                paths.append((m.group(1), m.group(2) + "::" + member.split("::")[0]))
    for root, rest in paths:
        t = resolve(here, root, [p for p in rest.split("::") if p], mods)
        if t is not None:
            out.add(t)
    # Modules by a short name: children (`mod x;`) and modules brought in by `use` (`use
    # super::x;`), then each `x::item` path goes where `item` is defined.
    short = {name[-1]: name for name in mods if name and name[:-1] == here}
    for t in set(out):
        if t and t[-1] not in short:
            short[t[-1]] = t
    for m in re.finditer(r"(?<![:\w])([a-z_][a-z0-9_]*)::([A-Za-z_][A-Za-z0-9_]*)", code):
        if m.group(1) in short:
            module = short[m.group(1)]
            out.add(module if module + (m.group(2),) in mods else defining(module, m.group(2), mods))
    related = lambda a, b: a[: len(b)] == b or b[: len(a)] == a
    return {t for t in out if not related(here, t)}


def circles(mods: dict) -> list:
    graph = {m: edges_of(m, f.read_text(), mods) for m, f in mods.items()}
    # Tarjan's strongly connected components.
    index, low, stack, on, comps, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return comps


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    found = 0
    for src in sorted(root.glob("crates/*/src")):
        for comp in circles(modules(src)):
            found += 1
            names = ", ".join("::".join(m) or "(root)" for m in comp)
            print(f"{src.parent.name}: circle of {len(comp)}: {names}")
    print(f"{found} import circle(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
