"""A recorded agent request continued into a multi-turn session, in the agent's own request shapes.

The 1.5B model does not call Claude Code's or Codex's tools, so a real session of theirs ends after
its first request. This script takes that first request, as `pld serve --record-requests` wrote it
(real: the agent's own system prompt, tools and first message), and appends the turns a session
of that task would add: the assistant's tool call and the tool's result, step by step. The steps
run for real in the agent's repository (the files are read, grepped and edited there, the help
text and the diff are the real ones), and each is written the way the agent writes it:

- Claude Code (Messages): an assistant message of a short text and a `tool_use` block (`Bash`,
  `Read`, `Edit`), then a user message of its `tool_result`; `Read` results in `cat -n` form,
  `Edit` results as Claude Code words them; the `cache_control` mark moves to the last block.
- Codex CLI (Responses): a `function_call` item to `exec_command` (`{"cmd": ...}`), then its
  `function_call_output` in Codex's unified-exec form (chunk id, wall time, exit code, token
  count, output); edits go through `apply_patch` as Codex sends them.

Request 1 of each output file is the recorded one; requests 2.. are the continuations. Output:
the recording's JSONL format, one request per line, for `pld bench replay`.

    python3 tools/agents/continue_session.py --recorded DIR/requests.jsonl --api messages \
        --repo /tmp/sess/repo --out /tmp/sess/claude-session.jsonl

The repository must be the one the agent was recorded in (its path is in the prompt), holding
tools/agents/subject/load.py (a frozen copy of an early tools/serve_load/load.py) as committed; it is reset with `git checkout` first.
"""

import argparse
import copy
import hashlib
import json
import os
import subprocess
import sys

# The task both agents were given: "Add a --timeout flag to load.py that sets the HTTP timeout in
# seconds (default 600), and use it where requests are sent." Each step: what the assistant says,
# then the tool call.
EDITS = [
    ("import urllib.request\n",
     "import urllib.request\n\nHTTP_TIMEOUT = 600.0  # seconds, set by --timeout\n"),
    ("urlopen(req, timeout=3600)", "urlopen(req, timeout=HTTP_TIMEOUT)"),
    ('    ap.add_argument("--max-tokens", type=int, default=96)\n',
     '    ap.add_argument("--max-tokens", type=int, default=96)\n'
     '    ap.add_argument("--timeout", type=float, default=600.0, help="HTTP timeout in seconds")\n'),
    ("    args = ap.parse_args()\n",
     "    args = ap.parse_args()\n    global HTTP_TIMEOUT\n    HTTP_TIMEOUT = args.timeout\n"),
]
STEPS = [
    ("I'll start by looking at the repository.", ("shell", "ls -la", "List the repository's files")),
    ("Let me read load.py.", ("read", "load.py")),
    ("Now let me find where requests are sent.",
     ("shell", "grep -n 'urlopen\\|timeout' load.py", "Find the HTTP calls and timeouts")),
    ("I'll add a module-level timeout.", ("edit", "load.py") + EDITS[0]),
    ("Use it where the request is sent.", ("edit", "load.py") + EDITS[1]),
    ("Add the flag.", ("edit", "load.py") + EDITS[2]),
    ("Set the timeout from the flag.", ("edit", "load.py") + EDITS[3]),
    ("Let me check that the flag shows up.",
     ("shell", "python3 load.py --help", "Show load.py's help")),
    ("And review the change.", ("shell", "git diff", "Show the diff")),
]


def run(repo, cmd):
    p = subprocess.run(["bash", "-c", cmd], cwd=repo, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def cat_n(lines, first=1):
    return "\n".join(f"{i:>6}\t{line}" for i, line in enumerate(lines, first))


def do_edit(repo, name, old, new):
    """Applies the edit; the edited file's lines around it (1-based start) for Claude's answer."""
    path = os.path.join(repo, name)
    text = open(path).read()
    if text.count(old) != 1:
        sys.exit(f"{name}: the edit's old text is not there exactly once")
    at = text.index(old)
    text = text.replace(old, new)
    open(path, "w").write(text)
    lines = text.split("\n")
    line = text[:at].count("\n")
    lo, hi = max(0, line - 4), min(len(lines), line + new.count("\n") + 5)
    return lines[lo:hi], lo + 1


def ident(prefix, api, n):
    return prefix + hashlib.sha256(f"{api}-{n}".encode()).hexdigest()[:24]


def claude_turn(repo, n, say, step):
    kind = step[0]
    if kind == "shell":
        call = {"name": "Bash", "input": {"command": step[1], "description": step[2]}}
        result = run(repo, step[1])[1].rstrip("\n") or "(No content)"
    elif kind == "read":
        path = os.path.join(repo, step[1])
        call = {"name": "Read", "input": {"file_path": path}}
        result = cat_n(open(path).read().rstrip("\n").split("\n"))
    else:
        path = os.path.join(repo, step[1])
        call = {"name": "Edit", "input": {"file_path": path, "old_string": step[2], "new_string": step[3]}}
        lines, first = do_edit(repo, *step[1:])
        result = (f"The file {path} has been updated. Here's the result of running `cat -n` on a "
                  f"snippet of the edited file:\n{cat_n(lines, first)}")
    tid = ident("toolu_", "claude", n)
    assistant = {"role": "assistant", "content": [
        {"type": "text", "text": say}, {"type": "tool_use", "id": tid, **call}]}
    user = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tid, "content": result}]}
    return [assistant, user]


def codex_output(code, out, n):
    return "\n".join([
        f"Chunk ID: {hashlib.sha256(str(n).encode()).hexdigest()[:6]}",
        "Wall time: 0.0100 seconds",
        f"Process exited with code {code}",
        f"Original token count: {(len(out) + 3) // 4}",
        "Output:",
        out,
    ])


def codex_turn(repo, n, step):
    kind = step[0]
    if kind == "shell":
        cmd = step[1]
        code, out = run(repo, cmd)
    elif kind == "read":
        cmd = f"sed -n '1,200p' {step[1]}"
        code, out = run(repo, cmd)
    else:
        name, old, new = step[1:]
        minus = "".join(f"-{line}\n" for line in old.rstrip("\n").split("\n"))
        plus = "".join(f"+{line}\n" for line in new.rstrip("\n").split("\n"))
        cmd = (f"apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: {name}\n@@\n{minus}{plus}"
               "*** End Patch\nEOF\n")
        do_edit(repo, name, old, new)
        code, out = 0, f"Success. Updated the following files:\nM {name}\n"
    cid = ident("call_", "codex", n)
    args = json.dumps({"cmd": cmd, "yield_time_ms": 10000})
    return [{"type": "function_call", "name": "exec_command", "arguments": args, "call_id": cid},
            {"type": "function_call_output", "call_id": cid, "output": codex_output(code, out, n)}]


def move_cache_mark(messages):
    """Claude Code marks the last block of the conversation for caching, and only that one."""
    for m in messages:
        if isinstance(m["content"], list):
            for block in m["content"]:
                block.pop("cache_control", None)
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recorded", required=True, help="a requests.jsonl from --record-requests")
    ap.add_argument("--api", required=True, choices=["messages", "responses"])
    ap.add_argument("--repo", required=True, help="the repository the agent was recorded in")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    recorded = [json.loads(line) for line in open(a.recorded) if line.strip()]
    first = next((r for r in recorded if r["api"] == a.api and r["body"].get("stream")), None)
    if first is None:
        sys.exit(f"{a.recorded}: no streamed {a.api} request")
    code, out = run(a.repo, "git checkout -q -- . && git status --porcelain")
    if code != 0 or out.strip():
        sys.exit(f"{a.repo}: not a clean git repository: {out}")
    requests = [first]
    body = copy.deepcopy(first["body"])
    for n, (say, step) in enumerate(STEPS, 1):
        if a.api == "messages":
            body["messages"] += claude_turn(a.repo, n, say, step)
            move_cache_mark(body["messages"])
        else:
            body["input"] += codex_turn(a.repo, n, step)
        requests.append({"time": first["time"] + n, "api": a.api, "tenant": first["tenant"],
                         "continued": True, "body": copy.deepcopy(body)})
    run(a.repo, "git checkout -q -- .")
    with open(a.out, "w") as f:
        for r in requests:
            f.write(json.dumps(r) + "\n")
    print(f"{a.out}: 1 recorded request and {len(STEPS)} continued")


if __name__ == "__main__":
    main()
