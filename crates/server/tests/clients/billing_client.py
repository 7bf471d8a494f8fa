"""Claude Code's billing line through the official `anthropic` client: three requests that differ
only in the `x-anthropic-billing-header` text block that starts the system prompt (a new session's
version suffix, then a per-request `cch` nonce). Dropped (the default), each later request reads at
least 95% of its prompt from the prefix cache; kept (`--keep-volatile-lines`), the prompts part
at the header and almost nothing is read.
Usage: billing_client.py BASE_URL MODEL dropped|kept"""

import sys

import anthropic

base, model, mode = sys.argv[1], sys.argv[2], sys.argv[3]
c = anthropic.Anthropic(base_url=base, api_key="none")
preamble = "\n".join(
    f"Rule {i}: when the user asks about file number {i}, read it before editing it, keep its style, "
    f"and run the tests of module {i % 7} afterwards."
    for i in range(40)
)


def ask(header):
    system = [
        {"type": "text", "text": f"x-anthropic-billing-header: {header} cc_entrypoint=sdk-cli;"},
        {"type": "text", "text": "You are Claude Code, a coding agent.\n" + preamble,
         "cache_control": {"type": "ephemeral"}},
    ]
    m = c.messages.create(model=model, max_tokens=4, system=system, extra_body={"temperature": 0},
                          messages=[{"role": "user", "content": "Which rule covers file 12?"}])
    u = m.usage
    prompt = u.input_tokens + (u.cache_read_input_tokens or 0)
    return prompt, (u.cache_read_input_tokens or 0)


first, _ = ask("cc_version=2.1.197.58e;")
assert first > 600, first
headers = ["cc_version=2.1.197.f02;", "cc_version=2.1.150.a41; cch=9f3e2;", "cc_version=2.1.150.a41; cch=07bd1;"]
for header in headers if mode == "dropped" else headers[:1]:
    prompt, cached = ask(header)
    share = cached / prompt
    if mode == "dropped":
        assert share >= 0.95, (header, cached, prompt)
    else:
        assert share < 0.10, (header, cached, prompt)
    print(header, cached, "of", prompt, f"{share:.1%}")
