"""A pytest plugin that points llama.cpp's server test suite at a running `pld serve`.

llama.cpp's tests (tools/server/tests/unit in its repository; they also ship in the
llama-cpp-python sdist on PyPI under vendor/llama.cpp/tools/server/tests) start their own server
and call it on llama.cpp's paths. This plugin makes them talk to an external pld server instead,
the way a new user would try it:

- the tests' own external-server switch (DEBUG_EXTERNAL) keeps them from starting or stopping
  a server, on the port given by PLD_PORT;
- OpenAI paths get pld's /v1 prefix (/chat/completions -> /v1/chat/completions, /completions ->
  /v1/completions, /models -> /v1/models); llama.cpp's native paths (/completion, /tokenize,
  /apply-template, ...) are left as they are, so they fail as they would for a user;
- requests without a "model" get the served model's name (PLD_MODEL).

Nothing else is translated: whatever pld refuses or answers differently shows up as a failure.

    PLD_PORT=8090 PLD_MODEL=smollm2-135m python3 -m pytest -p pld_plugin unit/test_chat_completion.py
(run from the tests folder, with this file's folder on PYTHONPATH).
"""

import os

os.environ.setdefault("DEBUG_EXTERNAL", "1")
os.environ["PORT"] = os.environ.get("PLD_PORT", "8090")

import utils  # noqa: E402  (llama.cpp's test helpers, importable from the tests folder)

MODEL = os.environ.get("PLD_MODEL", "smollm2-135m")
OPENAI_PATHS = {
    "/chat/completions": "/v1/chat/completions",
    "/completions": "/v1/completions",
    "/models": "/v1/models",
    "/embeddings": "/v1/embeddings",
}

_make_url = utils.ServerProcess.make_url


def make_url(self, path, host=None):
    self.server_port = int(os.environ["PORT"])
    return _make_url(self, OPENAI_PATHS.get(path, path), host)


def with_model(method):
    def wrapped(self, verb, path, data=None, *args, **kwargs):
        if isinstance(data, dict) and "model" not in data:
            data = {**data, "model": MODEL}
        return method(self, verb, path, data, *args, **kwargs)

    return wrapped


utils.ServerProcess.make_url = make_url
utils.ServerProcess.make_request = with_model(utils.ServerProcess.make_request)
utils.ServerProcess.make_stream_request = with_model(utils.ServerProcess.make_stream_request)
