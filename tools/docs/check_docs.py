#!/usr/bin/env python3
"""Checks pld's documentation.

    python3 tools/docs/check_docs.py [PLD_BINARY] [--links-only]

1. Every relative Markdown link in README.md, ARCHITECTURE.md and docs/**/*.md resolves to an
   existing file or folder, and a `#anchor` into a Markdown file (or into the page itself) names
   one of its headings, slugged as GitHub slugs them.
2. Every `pld SUBCOMMAND ... --flag` in a shell code block of README.md and docs/cli.md uses a
   subcommand and flags the binary accepts, as `PLD_BINARY SUBCOMMAND --help` lists them (a flag
   the help does not list, such as a hidden alias, is asked of the binary itself). PLD_BINARY
   defaults to target/release/pld; `--links-only` skips this check and check 3's first part.
3. Defaults stated in the docs agree with the code:
   - every `| flag | default | meaning |` table of docs/cli.md: where a row states a value (a
     number or a code span, not words such as "all cores"), it is the `[default: X]` that
     `PLD_BINARY CMD --help` prints for that flag (the command is the section's `pld CMD`; in
     "Flags every model command takes", every command that has the flag, with the row's
     "(`CMD`: `X`)" exceptions). A flag with no clap default (the speculation flags, which only
     override the settings) is checked against the code's constant instead;
   - the speculation settings' defaults, in docs/cli.md's speculation flags and the settings
     table of docs/speculation.md, against crates/drafting/src/spec_config.rs (`DEFAULT_*`,
     `DEFAULT_MATCH_POLICY`, `SpecMethod`'s `#[default]`, `adaptive` in `SpecConfig::default`),
     and the default that `--match-policy`'s help names;
   - docs/models.md's aliases, stored file names and SHA-256 against crates/models/src/lib.rs.

Prints one line per problem and exits 1 if there is any. Python 3.11, standard library only.
"""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[2]
LINK_FILES = ["README.md", "ARCHITECTURE.md", "fixtures/README.md", "workloads/README.md"]
CLI_FILES = ["README.md", "docs/cli.md"]
SHELL_LANGS = {"", "sh", "bash", "shell", "console", "zsh"}


# ---------------------------------------------------------------------------------------------
# Markdown structure


class Block:
    """A code block: its language ('' for none or an indented block) and (line number, text)."""

    def __init__(self, lang: str, lines: list[tuple[int, str]]):
        self.lang = lang
        self.lines = lines


def split_markdown(text: str) -> tuple[list[tuple[int, str]], list[Block]]:
    """The prose lines (number, text) outside code blocks, and the code blocks."""
    prose: list[tuple[int, str]] = []
    blocks: list[Block] = []
    lines = text.split("\n")
    i = 0
    prev_blank = True
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)", line)
        if fence:
            marker = fence.group(2)
            lang = fence.group(3).lower()
            body = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith(marker):
                body.append((i + 1, lines[i]))
                i += 1
            blocks.append(Block(lang, body))
            i += 1
            prev_blank = False
            continue
        if prev_blank and re.match(r"^( {4}|\t)", line) and line.strip():
            body = []
            while i < len(lines) and (re.match(r"^( {4}|\t)", lines[i]) or not lines[i].strip()):
                if lines[i].strip():
                    body.append((i + 1, lines[i]))
                elif i + 1 < len(lines) and not re.match(r"^( {4}|\t)", lines[i + 1]):
                    break
                i += 1
            blocks.append(Block("", body))
            prev_blank = False
            continue
        prose.append((i + 1, line))
        prev_blank = not line.strip()
        i += 1
    return prose, blocks


def strip_code_spans(line: str) -> str:
    return re.sub(r"(`+)(.+?)\1", lambda m: " " * len(m.group(0)), line)


def github_slug(text: str) -> str:
    """GitHub's anchor for a heading's rendered text (github-slugger's rules)."""
    out = []
    for ch in text.lower():
        cat = unicodedata.category(ch)
        if ch in " -_" or cat[0] in "LNM" or cat == "Pc":
            out.append(ch)
    return "".join(out).replace(" ", "-")


def heading_text(raw: str) -> str:
    """A heading's text as GitHub renders it: no markup, link texts kept, code kept."""
    t = re.sub(r"!\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    t = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", t)
    t = re.sub(r"\[([^\]]*)\]\[[^\]]*\]", r"\1", t)
    t = re.sub(r"<[^>]+>", "", t)
    t = t.replace("`", "")
    t = re.sub(r"\\(.)", r"\1", t)
    t = t.replace("*", "")
    t = re.sub(r"(?<![A-Za-z0-9])_+|_+(?![A-Za-z0-9])", "", t)
    return t.strip()


_anchor_cache: dict[Path, set[str]] = {}


def anchors_of(path: Path) -> set[str]:
    if path in _anchor_cache:
        return _anchor_cache[path]
    prose, _ = split_markdown(path.read_text(encoding="utf-8"))
    seen: dict[str, int] = {}
    anchors: set[str] = set()

    def add(slug: str) -> None:
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")

    prev = ""
    for _, line in prose:
        m = re.match(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m:
            add(github_slug(heading_text(m.group(2))))
        elif re.match(r"^ {0,3}(=+|-+)\s*$", line) and prev.strip() and "|" not in prev:
            add(github_slug(heading_text(prev)))
        for m in re.finditer(r"<a\s+(?:name|id)=\"([^\"]+)\"", line):
            anchors.add(m.group(1))
        prev = line
    _anchor_cache[path] = anchors
    return anchors


# ---------------------------------------------------------------------------------------------
# 1. Links

LINK_RE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+[\"'(][^)]*)?\)")
REF_DEF_RE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
HTML_RE = re.compile(r"<(?:a|img)\s[^>]*?(?:href|src)=\"([^\"]+)\"")


def link_files() -> list[Path]:
    files = [ROOT / f for f in LINK_FILES if (ROOT / f).exists()]
    files += sorted((ROOT / "docs").rglob("*.md"))
    return files


def check_link(source: Path, lineno: int, target: str, problems: list[str]) -> None:
    if not target or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith("//"):
        return
    rel = source.relative_to(ROOT)
    path_part, _, anchor = target.partition("#")
    path_part = unquote(path_part.split("?")[0])
    if path_part:
        dest = (ROOT / path_part.lstrip("/")) if path_part.startswith("/") else (source.parent / path_part)
        dest = Path(*dest.parts)
        if not dest.exists():
            problems.append(f"{rel}:{lineno}: broken link {target}: no such file {path_part}")
            return
    else:
        dest = source
    if anchor and dest.is_file() and dest.suffix.lower() == ".md":
        if unquote(anchor) not in anchors_of(dest.resolve()):
            where = "this page" if dest == source else str(dest.resolve().relative_to(ROOT))
            problems.append(f"{rel}:{lineno}: broken link {target}: no heading #{anchor} in {where}")


def check_links(problems: list[str]) -> int:
    count = 0
    for path in link_files():
        prose, _ = split_markdown(path.read_text(encoding="utf-8"))
        for lineno, line in prose:
            text = strip_code_spans(line)
            targets = [m.group(1) for m in LINK_RE.finditer(text)]
            targets += [m.group(1) for m in HTML_RE.finditer(text)]
            m = REF_DEF_RE.match(text)
            if m:
                targets.append(m.group(1))
            for target in targets:
                count += 1
                check_link(path, lineno, target, problems)
    return count


# ---------------------------------------------------------------------------------------------
# 2. Commands shown in the README and docs/cli.md


class Cli:
    """What the binary accepts, asked of the binary itself."""

    def __init__(self, binary: str):
        self.binary = binary
        self.helps: dict[tuple[str, ...], tuple[set[str], set[str]] | None] = {}
        self.probed: dict[tuple[tuple[str, ...], str], bool] = {}

    def run(self, args: list[str]) -> subprocess.CompletedProcess:
        return subprocess.run([self.binary, *args], capture_output=True, text=True, timeout=60)

    def help(self, path: tuple[str, ...]) -> tuple[set[str], set[str]] | None:
        """(subcommands, flags) of `binary PATH --help`, or None when the path is not a command."""
        if path not in self.helps:
            p = self.run([*path, "--help"])
            if p.returncode != 0:
                self.helps[path] = None
            else:
                subs: set[str] = set()
                flags: set[str] = {"--help"}
                section = ""
                for line in p.stdout.split("\n"):
                    if re.match(r"^\S.*:\s*$", line):
                        section = line.strip().rstrip(":").lower()
                        continue
                    if section == "commands":
                        m = re.match(r"^ {2}(\S+)", line)
                        if m and m.group(1) != "help":
                            subs.add(m.group(1))
                    elif section == "options":
                        m = re.match(r"^\s+(?:-\w,\s+)?(--[A-Za-z0-9][A-Za-z0-9-]*)", line)
                        if m:
                            flags.add(m.group(1))
                self.helps[path] = (subs, flags)
        return self.helps[path]

    def defaults(self, path: tuple[str, ...]) -> dict[str, str | None]:
        """Each flag of `binary PATH --help` and the `[default: X]` clap prints for it (None when
        it prints none)."""
        p = self.run([*path, "--help"])
        out: dict[str, str | None] = {}
        current = None
        section = ""
        for line in p.stdout.split("\n"):
            if re.match(r"^\S.*:\s*$", line):
                section = line.strip().rstrip(":").lower()
                current = None
                continue
            if section != "options":
                continue
            m = re.match(r"^\s+(?:-\w,\s+)?(--[A-Za-z0-9][A-Za-z0-9-]*)", line)
            if m:
                current = m.group(1)
                out[current] = None
            d = re.search(r"\[default: ([^\]]*)\]", line)
            if d and current:
                out[current] = d.group(1)
        return out

    def help_text(self, path: tuple[str, ...]) -> str:
        return self.run([*path, "--help"]).stdout

    def accepts(self, path: tuple[str, ...], flag: str) -> bool:
        known = self.help(path)
        if known and flag in known[1]:
            return True
        key = (path, flag)
        if key not in self.probed:
            # Hidden flags (aliases) are not listed; clap says "unexpected argument" for unknown ones.
            p = self.run([*path, flag, "--help"])
            self.probed[key] = "unexpected argument" not in p.stderr
        return self.probed[key]


ENV_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
WRAPPERS = {"time", "exec", "env", "nohup", "sudo", "then", "do", "else", "!"}
FLAG_RE = re.compile(r"(?<![\w-])--[A-Za-z0-9][A-Za-z0-9-]*")


def logical_lines(block: Block) -> list[tuple[int, str]]:
    """Lines joined across trailing backslashes and synopsis continuations (lines that start
    with `[`, `(` or a flag), comments and quoted strings removed."""
    out: list[tuple[int, str]] = []
    joining = False
    for lineno, raw in block.lines:
        line = strip_comment(raw)
        stripped = line.strip()
        cont = stripped.endswith("\\")
        if cont:
            stripped = stripped[:-1]
        if out and (joining or re.match(r"^(\[|\(|--)", stripped)):
            out[-1] = (out[-1][0], out[-1][1] + " " + stripped)
        elif stripped:
            out.append((lineno, stripped))
        joining = cont
    return out


def strip_comment(line: str) -> str:
    """The line without a shell comment, and with quoted strings emptied."""
    out = []
    quote = ""
    prev = " "
    for ch in line:
        if quote:
            if ch == quote:
                quote = ""
                out.append(ch)
            continue
        if ch in "'\"":
            quote = ch
            out.append(ch)
        elif ch == "#" and prev.isspace():
            break
        else:
            out.append(ch)
        prev = ch
    return "".join(out)


def commands_in(line: str) -> list[list[str]]:
    """The simple commands of a shell line, as word lists."""
    parts = re.split(r"&&|\|\||;|\s&(?:\s|$)|\s\|\s+(?=[A-Za-z_./$])|\$\(|`", line)
    return [p.split() for p in parts if p.strip()]


def pld_invocation(words: list[str]) -> list[str] | None:
    """The words after `pld` when these words run it (pld, a path to it, or cargo run -p pld-cli --)."""
    i = 0
    while i < len(words) and (ENV_RE.match(words[i]) or words[i] in WRAPPERS):
        i += 1
    if i >= len(words):
        return None
    w = words[i]
    if w == "pld" or w.endswith("/pld"):
        return words[i + 1 :]
    if w == "cargo" and "pld-cli" in words and "--" in words:
        return words[words.index("--") + 1 :]
    return None


def check_commands(cli: Cli, problems: list[str]) -> int:
    count = 0
    top = cli.help(())
    if top is None:
        problems.append(f"{cli.binary}: `--help` failed; cannot check the commands")
        return 0
    for name in CLI_FILES:
        path = ROOT / name
        if not path.exists():
            problems.append(f"{name}: missing")
            continue
        _, blocks = split_markdown(path.read_text(encoding="utf-8"))
        for block in blocks:
            if block.lang not in SHELL_LANGS:
                continue
            for lineno, line in logical_lines(block):
                for words in commands_in(line):
                    rest = pld_invocation(words)
                    if rest is None:
                        continue
                    count += 1
                    cmd_path: tuple[str, ...] = ()
                    while rest and not rest[0].startswith(("-", "<", "[", "(")):
                        known = cli.help(cmd_path)
                        subs = known[0] if known else set()
                        if not subs:
                            break
                        if rest[0] not in subs:
                            shown = " ".join(("pld", *cmd_path, rest[0]))
                            problems.append(
                                f"{name}:{lineno}: `{shown}`: no such subcommand"
                                f" (pld {' '.join(cmd_path)} --help lists {', '.join(sorted(subs))})".replace("  ", " ")
                            )
                            cmd_path = ()
                            rest = []
                            break
                        cmd_path += (rest[0],)
                        rest = rest[1:]
                    if not cmd_path and not rest:
                        continue
                    shown = " ".join(("pld", *cmd_path))
                    for flag in FLAG_RE.findall(" ".join(rest)):
                        if not cli.accepts(cmd_path, flag):
                            problems.append(f"{name}:{lineno}: `{shown} {flag}`: `{shown}` does not accept {flag}")
    return count


# ---------------------------------------------------------------------------------------------
# 3. Defaults stated in the docs

SPEC_CONFIG = "crates/drafting/src/spec_config.rs"
DRAFTING_CONFIG = "crates/drafting/src/config.rs"
MODELS_RS = "crates/models/src/lib.rs"


def enum_name(text: str, enum: str, variant: str) -> str | None:
    """The name `ENUM::VARIANT => "name"` gives a variant in the code's name mapping."""
    m = re.search(rf"{enum}::{variant}\s*=>\s*\"([^\"]+)\"", text)
    return m.group(1) if m else None


def code_spec_defaults(problems: list[str]) -> dict[str, str]:
    """The speculation settings' defaults as the code states them, by `speculative_config` key,
    written as the docs write them."""
    spec = (ROOT / SPEC_CONFIG).read_text(encoding="utf-8")
    config = (ROOT / DRAFTING_CONFIG).read_text(encoding="utf-8")
    out: dict[str, str] = {}
    for m in re.finditer(r"pub const DEFAULT_([A-Z0-9_]+):\s*[\w:]+\s*=\s*([^;]+);", spec):
        key, value = m.group(1).lower(), m.group(2).strip()
        if re.fullmatch(r"\d+", value):
            out[key] = value
        elif v := re.fullmatch(r"MatchPolicy::(\w+)", value):
            name = enum_name(config, "MatchPolicy", v.group(1))
            if name is None:
                problems.append(f"{DRAFTING_CONFIG}: no name for MatchPolicy::{v.group(1)}")
            else:
                out[key] = name
    enum = re.search(r"pub enum SpecMethod \{(.*?)\n\}", spec, re.S)
    variant = re.search(r"#\[default\]\s*(\w+)", enum.group(1)) if enum else None
    name = enum_name(spec, "SpecMethod", variant.group(1)) if variant else None
    if name:
        out["method"] = name
    default_impl = re.search(r"impl Default for SpecConfig \{.*?\n\}", spec, re.S)
    adaptive = re.search(r"adaptive:\s*(true|false)", default_impl.group(0)) if default_impl else None
    if adaptive:
        out["adaptive"] = adaptive.group(1)
    for key in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "match_policy", "method", "adaptive"):
        if key not in out:
            problems.append(f"{SPEC_CONFIG}: cannot read the default of {key} (the check needs updating)")
    return out


def table_rows(text: str) -> list[tuple[int, str, list[str] | None]]:
    """(line number, the section's heading, cells) of every table row of a Markdown page, with
    `\\|` kept inside its cell; a header's separator row comes with None for its cells."""
    prose, _ = split_markdown(text)
    rows: list[tuple[int, str, list[str]]] = []
    heading = ""
    for lineno, line in prose:
        h = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if h:
            heading = h.group(1)
            continue
        if not line.lstrip().startswith("|"):
            continue
        if re.match(r"^\s*\|[\s:|-]+\|\s*$", line):
            rows.append((lineno, heading, None))
            continue
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        rows.append((lineno, heading, cells))
    return rows


def stated_value(cell: str) -> str | None:
    """The value a default cell states: its leading code span or number; None for words."""
    m = re.match(r"^`([^`]+)`", cell)
    if m:
        return m.group(1)
    m = re.match(r"^(-?\d[\d.,]*)(?:\s*\([^)]*\))?$", cell)
    return m.group(1) if m else None


def same_value(a: str, b: str) -> bool:
    if a == b:
        return True
    try:
        return float(a) == float(b)
    except ValueError:
        return False


def tables_of(text: str, first: str, second: str) -> list[tuple[int, str, list[str]]]:
    """The body rows of the tables whose header starts with `first | second`."""
    out = []
    keep = False
    header: list[str] = []
    prev_line = -2
    for lineno, heading, cells in table_rows(text):
        if cells is None:
            keep = lineno == prev_line + 1 and len(header) >= 2
            keep = keep and header[0].lower() == first and header[1].lower().startswith(second)
        elif lineno != prev_line + 1:
            header, keep = cells, False
        elif keep:
            out.append((lineno, heading, cells))
        prev_line = lineno
    return out


SPEC_FLAG_KEYS = {"--spec-method": "method"}


def check_cli_defaults(cli: Cli | None, code: dict[str, str], problems: list[str]) -> int:
    """docs/cli.md's flag tables against `--help`'s defaults and the code's constants."""
    name = "docs/cli.md"
    text = (ROOT / name).read_text(encoding="utf-8")
    count = 0
    commands: list[tuple[str, ...]] = []
    if cli is not None:
        top = cli.help(()) or (set(), set())
        for sub in sorted(top[0]):
            inner = cli.help((sub,))
            if inner and inner[0]:
                commands += [(sub, s) for s in sorted(inner[0])]
            else:
                commands.append((sub,))
    for lineno, heading, cells in tables_of(text, "flag", "default"):
        flags = FLAG_RE.findall(cells[0])
        value = stated_value(cells[1])
        if not flags or value is None:
            continue
        flag = flags[0]
        key = SPEC_FLAG_KEYS.get(flag, flag[2:].replace("-", "_"))
        m = re.match(r"^`pld ([a-z ]+)`$", heading)
        if m:
            paths = [tuple(m.group(1).split())]
        elif heading.lower().startswith("flags every model command"):
            paths = commands
        else:
            paths = []
        checked = False
        if cli is not None:
            overrides = {c: v for c, v in re.findall(r"`([a-z][a-z ]*)`:\s*`([^`]+)`", cells[1])}
            for path in paths:
                defaults = cli.defaults(path)
                if flag not in defaults:
                    continue
                want = overrides.get(" ".join(path), value)
                got = defaults[flag]
                if got is None:
                    if key in code:
                        continue
                    if m:
                        problems.append(f"{name}:{lineno}: {flag}: the docs say the default is {want}; `pld {' '.join(path)} --help` states none")
                        checked = True
                    continue
                checked = True
                if not same_value(want, got):
                    problems.append(f"{name}:{lineno}: {flag}: the docs say the default is {want}; `pld {' '.join(path)} --help` says {got}")
        if key in code:
            checked = True
            if not same_value(value, code[key]):
                problems.append(f"{name}:{lineno}: {flag}: the docs say the default is {value}; {SPEC_CONFIG} says {code[key]}")
        count += checked
    return count


def check_speculation_defaults(code: dict[str, str], problems: list[str]) -> int:
    """docs/speculation.md's settings table against the code's constants."""
    name = "docs/speculation.md"
    text = (ROOT / name).read_text(encoding="utf-8")
    count = 0
    for lineno, _, cells in tables_of(text, "setting (`speculative_config` key)", "default"):
        key = re.match(r"^`([a-z_]+)`", cells[0])
        value = stated_value(cells[1])
        if not key or value is None or key.group(1) not in code:
            continue
        count += 1
        if not same_value(value, code[key.group(1)]):
            problems.append(f"{name}:{lineno}: {key.group(1)}: the docs say the default is {value}; {SPEC_CONFIG} says {code[key.group(1)]}")
    if count == 0:
        problems.append(f"{name}: no settings table with defaults found (the check needs updating)")
    return count


def check_help_match_policy(cli: Cli, code: dict[str, str], problems: list[str]) -> int:
    """The default `--match-policy`'s help names, against the code's."""
    text = " ".join(cli.help_text(("generate",)).split())
    m = re.search(r"(\w+) \(the default", text)
    if not m:
        problems.append("`pld generate --help`: --match-policy's help no longer names its default (the check needs updating)")
        return 0
    if "match_policy" in code and m.group(1) != code["match_policy"]:
        problems.append(f"`pld generate --help`: --match-policy's help names {m.group(1)} the default; {SPEC_CONFIG} says {code['match_policy']}")
    return 1


def check_models(problems: list[str]) -> int:
    """docs/models.md's table against the aliases, file names and hashes `pld fetch` uses."""
    code = (ROOT / MODELS_RS).read_text(encoding="utf-8")
    sources = {
        m.group(1): (m.group(2), m.group(3))
        for m in re.finditer(
            r"\"([\w.-]+)\"\s*=>\s*ModelSource\s*\{.*?file_name:\s*\"([^\"]+)\".*?sha256:\s*\"([0-9a-f]{64})\"",
            code,
            re.S,
        )
    }
    name = "docs/models.md"
    documented: dict[str, tuple[int, str, str]] = {}
    for lineno, _, cells in tables_of((ROOT / name).read_text(encoding="utf-8"), "alias", "model"):
        alias = stated_value(cells[0])
        files = [c for c in cells if re.fullmatch(r"`[^`/]+\.gguf`", c)]
        shas = [c.strip("`") for c in cells if re.fullmatch(r"`[0-9a-f]{64}`", c)]
        if alias and files and shas:
            documented[alias] = (lineno, files[-1].strip("`"), shas[0])
    if not sources:
        problems.append(f"{MODELS_RS}: no ModelSource found (the check needs updating)")
    for alias, (file_name, sha) in sources.items():
        if alias not in documented:
            problems.append(f"{name}: `pld fetch` knows {alias} ({MODELS_RS}); the table does not list it")
            continue
        lineno, doc_file, doc_sha = documented[alias]
        if doc_file != file_name:
            problems.append(f"{name}:{lineno}: {alias} is stored as {doc_file} in the docs, {file_name} in {MODELS_RS}")
        if doc_sha != sha:
            problems.append(f"{name}:{lineno}: {alias}'s SHA-256 is {doc_sha} in the docs, {sha} in {MODELS_RS}")
    for alias, (lineno, _, _) in documented.items():
        if alias not in sources:
            problems.append(f"{name}:{lineno}: {alias} is not an alias `pld fetch` knows ({MODELS_RS})")
    return len(sources)


# ---------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    args = [a for a in argv[1:] if not a.startswith("--")]
    links_only = "--links-only" in argv[1:]
    problems: list[str] = []
    links = check_links(problems)
    commands = 0
    code = code_spec_defaults(problems)
    defaults = check_speculation_defaults(code, problems)
    models = check_models(problems)
    cli: Cli | None = None
    if not links_only:
        binary = args[0] if args else "target/release/pld"
        bin_path = Path(binary) if Path(binary).is_absolute() else ROOT / binary
        if not bin_path.is_file():
            problems.append(
                f"{binary}: no such binary (build it with `cargo build --release -p pld-cli`,"
                " pass its path, or use --links-only)"
            )
        else:
            cli = Cli(str(bin_path))
            commands = check_commands(cli, problems)
            defaults += check_help_match_policy(cli, code, problems)
    defaults += check_cli_defaults(cli, code, problems)
    for p in problems:
        print(p)
    summary = (
        f"{links} links, {commands} pld commands, {defaults} stated defaults, {models} models checked:"
        f" {len(problems)} problem(s)"
    )
    print(summary, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
