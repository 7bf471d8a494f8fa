#!/usr/bin/env python3
"""Checks pld's documentation.

    python3 tools/docs/check_docs.py [PLD_BINARY] [--links-only]

1. Every relative Markdown link in README.md, ARCHITECTURE.md and docs/**/*.md resolves to an
   existing file or folder, and a `#anchor` into a Markdown file (or into the page itself) names
   one of its headings, slugged as GitHub slugs them.
2. Every `pld SUBCOMMAND ... --flag` in a shell code block of README.md and docs/cli.md uses a
   subcommand and flags the binary accepts, as `PLD_BINARY SUBCOMMAND --help` lists them (a flag
   the help does not list, such as a hidden alias, is asked of the binary itself). PLD_BINARY
   defaults to target/release/pld; `--links-only` skips this check.

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
LINK_FILES = ["README.md", "ARCHITECTURE.md"]
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


def main(argv: list[str]) -> int:
    args = [a for a in argv[1:] if not a.startswith("--")]
    links_only = "--links-only" in argv[1:]
    problems: list[str] = []
    links = check_links(problems)
    commands = 0
    if not links_only:
        binary = args[0] if args else "target/release/pld"
        bin_path = Path(binary) if Path(binary).is_absolute() else ROOT / binary
        if not bin_path.is_file():
            problems.append(
                f"{binary}: no such binary (build it with `cargo build --release -p pld-cli`,"
                " pass its path, or use --links-only)"
            )
        else:
            commands = check_commands(Cli(str(bin_path)), problems)
    for p in problems:
        print(p)
    summary = f"{links} links, {commands} pld commands checked: {len(problems)} problem(s)"
    print(summary, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
