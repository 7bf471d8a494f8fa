"""pld in Python: LLM inference on the CPU with prompt lookup decoding, under vLLM's offline API names.

    from pld import LLM, SamplingParams

    llm = LLM("qwen-coder-0.5b", speculative_config={"method": "ngram", "num_speculative_tokens": 8})
    for out in llm.generate(["def fib(n):"], SamplingParams(temperature=0, max_tokens=64)):
        print(out.outputs[0].text, out.metrics.mean_accepted_tokens)

Speculation is exact: greedy output is token for token what plain decoding gives, sampled output
has the same distribution. A list of prompts runs as one continuous batch; every prompt starts
from the prefix cache the earlier ones left (a conversation's later turns prefill only what is
new). The engine runs with the GIL released; Ctrl-C stops it with KeyboardInterrupt.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import _native

__all__ = [
    "LLM",
    "SamplingParams",
    "StructuredOutputsParams",
    "RequestOutput",
    "CompletionOutput",
    "Logprob",
    "RequestMetrics",
]

Prompt = Union[str, Sequence[int]]
Messages = List[Dict[str, Any]]

# The engine's defaults (`engine::SamplingSettings`, `DEFAULT_MAX_NUM_SEQS`,
# `DEFAULT_PREFIX_CACHE_DIR_BYTES`), shown as the defaults of `SamplingParams` and `LLM`.
_DEFAULTS: Dict[str, Any] = json.loads(_native.defaults())
_SAMPLING: Dict[str, Any] = _DEFAULTS["sampling"]


@dataclass
class StructuredOutputsParams:
    """What the output must be, as vLLM's `StructuredOutputsParams` names it: `json` (a JSON
    schema, as a dict or its text), `json_object` (any JSON object) or `grammar` (llama.cpp's
    GBNF, start rule `root`). One of them."""

    json: Optional[Union[Dict[str, Any], str]] = None
    json_object: Optional[bool] = None
    #: llama.cpp's GBNF (`root ::= ...`) or llguidance's Lark (`start: ...`).
    grammar: Optional[str] = None


@dataclass
class SamplingParams:
    """vLLM's sampling settings. `temperature=0` is greedy decoding; `max_tokens` defaults to 16
    as in vLLM (`None`: up to the context); `top_k` -1 or 0 is off; `logprobs` asks for each
    generated token's log-probability with that many alternatives. A value out of range raises
    `ValueError` naming the field, as the server answers 400."""

    n: int = 1
    temperature: float = _SAMPLING["temperature"]
    top_p: float = _SAMPLING["top_p"]
    top_k: int = _SAMPLING["top_k"]
    min_p: float = _SAMPLING["min_p"]
    repetition_penalty: float = _SAMPLING["repetition_penalty"]
    seed: Optional[int] = None
    max_tokens: Optional[int] = 16
    stop: Optional[Union[str, List[str]]] = None
    logprobs: Optional[int] = None
    structured_outputs: Optional[StructuredOutputsParams] = None

    def __post_init__(self) -> None:
        _native.check_sampling(self._json())

    def _json(self) -> str:
        d = asdict(self)
        if isinstance(self.stop, str):
            d["stop"] = [self.stop]
        elif self.stop is None:
            d["stop"] = []
        if self.structured_outputs is None:
            d.pop("structured_outputs")
        else:
            d["structured_outputs"] = {
                k: v for k, v in asdict(self.structured_outputs).items() if v is not None
            }
        return json.dumps(d)


@dataclass
class Logprob:
    """A token's log-probability under the model, its rank among the alternatives (1 is the most
    likely; None for the sampled token when it is not among them) and its text."""

    logprob: float
    rank: Optional[int]
    decoded_token: str


@dataclass
class CompletionOutput:
    """One choice of a request, as vLLM's `CompletionOutput`. `finish_reason` is `"stop"` (an end
    token or a stop string), `"length"` or `"abort"`."""

    index: int
    text: str
    token_ids: List[int]
    finish_reason: str
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[List[Dict[int, Logprob]]] = None
    stop_reason: Optional[Union[int, str]] = None
    #: From `LLM.chat(..., tools=...)`: the function calls parsed out of `text` (OpenAI's
    #: `tool_calls` objects), else None.
    tool_calls: Optional[List[Dict[str, Any]]] = None
    #: From `LLM.chat` on a model that reasons apart (gpt-oss's analysis channel): its reasoning,
    #: else None.
    reasoning_content: Optional[str] = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestMetrics:
    """What speculation did for the request (its choices together) and where the time went.
    `mean_accepted_tokens` is tokens per decoding forward pass (plain decoding: 1.0)."""

    first_token_s: Optional[float]
    prefill_s: float
    decode_s: float
    steps: int
    draft_tokens: int
    accepted_tokens: int
    decode_tokens: int
    mean_accepted_tokens: float
    acceptance_rate: float


@dataclass
class RequestOutput:
    """A request's result, as vLLM's `RequestOutput`: the prompt, its token ids, the choices, and
    `num_cached_tokens` (prompt tokens served from the prefix cache)."""

    request_id: str
    prompt: Optional[str]
    prompt_token_ids: List[int]
    outputs: List[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    num_cached_tokens: int = 0


def _logprobs(entries: Optional[List[Dict[str, Any]]]) -> Optional[List[Dict[int, Logprob]]]:
    if entries is None:
        return None
    out = []
    for e in entries:
        at: Dict[int, Logprob] = {}
        for rank, (tid, lp, text) in enumerate(e["top"], start=1):
            at[tid] = Logprob(lp, rank, text)
        if e["token"] not in at:
            at[e["token"]] = Logprob(e["logprob"], None, e["text"])
        out.append(at)
    return out


def _request_output(i: int, prompt: Optional[str], r: Dict[str, Any]) -> RequestOutput:
    outputs = [
        CompletionOutput(
            index=o["index"],
            text=o["text"],
            token_ids=o["token_ids"],
            finish_reason=o["finish_reason"],
            cumulative_logprob=o["cumulative_logprob"],
            logprobs=_logprobs(o["logprobs"]),
        )
        for o in r["outputs"]
    ]
    return RequestOutput(
        request_id=str(i),
        prompt=prompt,
        prompt_token_ids=r["prompt_token_ids"],
        outputs=outputs,
        finished=True,
        metrics=RequestMetrics(**r["metrics"]),
        num_cached_tokens=r["num_cached_tokens"],
    )


class LLM:
    """A model loaded in this process, with vLLM's offline `LLM` names.

    `model` is an alias (`smollm2-135m`, `qwen-coder-0.5b`, `qwen-coder-1.5b`, `gemma3-270m`,
    fetched on first use as `pld fetch` does) or a path to a `.gguf` file. `speculative_config`
    is vLLM's dict (`method` "ngram" or "tree", `num_speculative_tokens`, `prompt_lookup_max`,
    `prompt_lookup_min`, ...; Hugging Face's `prompt_lookup_num_tokens` is an alias); None keeps
    pld's defaults and `{"num_speculative_tokens": 0}` turns speculation off. `max_model_len`
    caps each sequence's context; `threads` sizes the compute pool (all cores by default; the
    first LLM of a process sets it); `max_num_seqs` caps the sequences of one batch (the default is
    `pld serve --max-num-seqs`'s);
    `prefix_cache_bytes` bounds the prefix cache (0: off; default an eighth of memory);
    `prefix_cache_dir` also keeps its blocks as files there, so that a later process starts from
    them (at most `prefix_cache_dir_bytes`, least recently used first; one process per directory);
    `kv_cache_dtype` is what the KV cache stores keys and values as: "bf16" or "f16" (half the
    memory and the bytes attention reads; on AMX, bf16's attention runs on tiles), "f32", or
    "auto" (bf16 where attention over it is the faster: AMX tiles, AVX-512; else f32);
    `kv_cache_bytes` bounds the bytes the batch's KV caches reserve together (`pld serve
    --kv-cache-bytes`): a prompt waits until its cache fits, the newest sequence is preempted and
    resumed later (its output unchanged) when an older one must grow past it, and a request that
    could never fit raises `ValueError` naming the budget (default: the machine's memory less the
    model file and the prefix cache's budget).
    """

    def __init__(
        self,
        model: str,
        speculative_config: Optional[Dict[str, Any]] = None,
        max_model_len: Optional[int] = None,
        threads: Optional[int] = None,
        max_num_seqs: int = _DEFAULTS["max_num_seqs"],
        prefix_cache_bytes: Optional[int] = None,
        kv_cache_dtype: str = "auto",
        prefix_cache_dir: Optional[str] = None,
        prefix_cache_dir_bytes: int = _DEFAULTS["prefix_cache_dir_bytes"],
        kv_cache_bytes: Optional[int] = None,
    ) -> None:
        spec = None if speculative_config is None else json.dumps(speculative_config)
        self._engine = _native.Engine(
            model, spec, max_model_len, threads, max_num_seqs, prefix_cache_bytes, kv_cache_dtype,
            prefix_cache_dir, prefix_cache_dir_bytes, kv_cache_bytes,
        )

    @property
    def model_name(self) -> str:
        return self._engine.name

    @property
    def kv_cache_dtype(self) -> str:
        """What the KV cache stores keys and values as: "bf16", "f16" or "f32"."""
        return self._engine.kv_cache_dtype

    @property
    def speculative_config(self) -> Dict[str, Any]:
        """The speculation settings in use (pld's defaults merged with what was given)."""
        return json.loads(self._engine.speculative_config)

    def get_tokenizer(self) -> "_Tokenizer":
        return _Tokenizer(self._engine)

    def generate(
        self,
        prompts: Union[Prompt, Sequence[Prompt]],
        sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None,
        use_tqdm: bool = True,
    ) -> List[RequestOutput]:
        """Generates for a prompt or a list of them (strings, or lists of token ids), all in one
        continuous batch; one `SamplingParams` for all or one per prompt."""
        items = _prompt_list(prompts)
        params = _params_list(sampling_params, len(items))
        ids = [self._engine.encode(p) if isinstance(p, str) else list(p) for p in items]
        progress = _progress(len(items)) if use_tqdm else None
        try:
            raw = self._engine.generate(
                ids, [p._json() for p in params], progress.update if progress else None
            )
        finally:
            if progress:
                progress.close()
        return [
            _request_output(i, p if isinstance(p, str) else None, r)
            for i, (p, r) in enumerate(zip(items, json.loads(raw)))
        ]

    def chat(
        self,
        messages: Union[Messages, Sequence[Messages]],
        sampling_params: Optional[Union[SamplingParams, Sequence[SamplingParams]]] = None,
        use_tqdm: bool = True,
        tools: Optional[List[Dict[str, Any]]] = None,
        tool_choice: Union[str, Dict[str, Any]] = "auto",
    ) -> List[RequestOutput]:
        """Generates replies to a conversation (OpenAI-style messages) or a list of them, rendered
        by the model's chat template. Each reply is read as pld's server reads it: with `tools`
        (OpenAI function objects), the model's calls (`<tool_call>` blocks, or gpt-oss's harmony
        messages to `functions.NAME`) come back parsed, each choice's `tool_calls` (OpenAI's
        objects) and its `text` without them; a harmony model's reasoning is the choice's
        `reasoning_content` and its `text` the final answer. `tool_choice` is OpenAI's: "auto",
        "none" (no call is parsed), "required" or `{"type": "function", "function": {"name":
        ...}}`; the last two force a call by grammar. Structured output applies to the answer
        (for harmony, after the model's reasoning, in its final channel)."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        rendered = [self._render(c, tools, tool_choice) for c in conversations]  # type: ignore[arg-type]
        prompts = [prompt for prompt, _, _ in rendered]
        params = _params_list(sampling_params, len(prompts))
        for i, (_, grammar, _) in enumerate(rendered):
            if grammar is not None and params[i].structured_outputs is not None:
                raise ValueError("tool_choice: forcing a call cannot be combined with structured_outputs")
            if grammar is None and params[i].structured_outputs is not None:
                grammar = self._engine.chat_grammar(params[i]._json())
            if grammar is not None:
                forced = dataclasses.replace(params[i])
                forced.structured_outputs = StructuredOutputsParams(grammar=grammar)
                params[i] = forced
        outs = self.generate(prompts, params, use_tqdm)
        for out, (_, _, calls_allowed) in zip(outs, rendered):
            for o in out.outputs:
                content, reasoning, calls = _native.parse_reply(
                    o.text, f"call-{out.request_id}-{o.index}", self._engine.harmony, calls_allowed
                )
                o.text = content
                o.reasoning_content = reasoning or None
                o.tool_calls = json.loads(calls) if tools else None
        return outs

    def stream(
        self,
        prompt: Union[Prompt, Messages],
        sampling_params: Optional[SamplingParams] = None,
    ) -> Iterator[str]:
        """Yields the text of one generation piece by piece as it is verified. `prompt` is a
        string, token ids, or a conversation (rendered by the chat template)."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            prompt = self._render(prompt, None, "auto")[0]  # type: ignore[arg-type]
        ids = self._engine.encode(prompt) if isinstance(prompt, str) else list(prompt)
        params = sampling_params or SamplingParams()
        return iter(self._engine.stream(ids, params._json()))

    def _render(
        self,
        messages: Messages,
        tools: Optional[List[Dict[str, Any]]],
        tool_choice: Union[str, Dict[str, Any]],
    ) -> Tuple[str, Optional[str], bool]:
        """The prompt, the grammar of a forced call (when `tool_choice` forces one), and whether
        the reply may make calls."""
        if not tools:
            return self._engine.render_chat(json.dumps(messages), None, None)
        return self._engine.render_chat(json.dumps(messages), json.dumps(tools), json.dumps(tool_choice))


class _Tokenizer:
    """The model's tokenizer: `encode` (BOS added where the model wants one) and `decode`."""

    def __init__(self, engine: "_native.Engine") -> None:
        self._engine = engine

    def encode(self, text: str) -> List[int]:
        return self._engine.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._engine.decode(list(ids))


def _prompt_list(prompts: Union[Prompt, Sequence[Prompt]]) -> List[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    items = list(prompts)
    if items and all(isinstance(t, int) for t in items):
        return [items]  # one prompt of token ids
    return items


def _params_list(
    params: Optional[Union[SamplingParams, Sequence[SamplingParams]]], n: int
) -> List[SamplingParams]:
    if params is None:
        return [SamplingParams()] * n
    if isinstance(params, SamplingParams):
        return [params] * n
    params = list(params)
    if len(params) != n:
        raise ValueError(f"sampling_params: {len(params)} given for {n} prompts")
    return params


class _progress:
    """A tqdm bar over prompts when tqdm is installed; nothing otherwise."""

    def __init__(self, total: int) -> None:
        try:
            from tqdm import tqdm  # type: ignore[import-not-found]
        except ImportError:
            self._bar = None
            return
        self._bar = tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)
        self._done = 0

    def update(self, done: int) -> None:
        if self._bar is not None and done > self._done:
            self._bar.update(done - self._done)
            self._done = done

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __bool__(self) -> bool:
        return self._bar is not None
