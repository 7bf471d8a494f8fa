"""pld's drafter as vLLM's proposer, for models that need GPUs or several machines:

    from vllm import LLM

    llm = LLM(
        model="Qwen/Qwen2.5-Coder-7B-Instruct",
        speculative_config={"method": "custom_class", "model": "pld.vllm.Proposer",
                            "num_speculative_tokens": 8},
        additional_config={"pld": {"prompt_lookup_min": 1, "prompt_lookup_max": 4}},
    )

vLLM (0.32 and 0.33) builds the class in each worker with its `VllmConfig` and calls
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)` after every
step with the rows of its persistent batch: the tokens each row accepted this step, every row's
length, and the batch's token array. It names the class in `speculative_config["model"]` and sets
`prompt_lookup_min/max` to 0 for a custom class, so pld's own settings go in
`additional_config["pld"]` (vLLM's names: `prompt_lookup_min`, `prompt_lookup_max`,
`match_policy` (`scored`, the default here, `recent`, pld's own default, `earliest`, `longest`:
see `MatchPolicy` in the drafting crate), `adaptive`, which is off by default here: on a GPU a
drafted row is nearly free); K is vLLM's `num_speculative_tokens`.

`scored` is the default inside vLLM because on the recorded greedy outputs it replayed to more
tokens per step than vLLM's own `ngram` from fewer drafted tokens (docs/bench/vllm/README.md:
qwen-coder-0.5b in vLLM, 30 grounded and Spec-Bench rows, 1.66 tokens a step from 6,803 drafted
against 1.63 from 7,189; pld's 115 recorded turns, 1.82 from 46,713 against 1.76 from 50,112).
`recent`, pld's own default, accepted fewer on the code edits and summaries; `earliest` drafts
exactly what vLLM's `ngram` drafts.

vLLM's scheduler decides each step's draft length (`num_spec_tokens_to_schedule`: K, or with
`speculative_config["num_speculative_tokens_per_batch_size"]` the K its schedule gives the step's
batch size) and hands it to its own `ngram` and `suffix` proposers as their first argument; its
`custom_class` call passes no length (`gpu_model_runner.py` of vLLM 0.32). So the proposer builds
the same schedule with vLLM's own function and looks it up by the step's number of rows (vLLM
looks it up by the number of scheduled requests, which is the rows of its batch). `propose` also
takes the length as the keyword `num_speculative_tokens`, for a caller that passes it.

vLLM's own n-gram proposer rescans each row's whole context every step. This one keeps a pld
drafter per request, updated with the tokens each step accepted, so a proposal costs the same at
128k tokens as at 1k. vLLM passes no request ids and moves rows between steps (finished requests
leave holes that later rows fill; rows are reordered), so a row's drafter is found by what it
holds: the drafter whose sequence has the row's length before this step's tokens, the row's first
tokens and the tokens just before the new ones. A row that matches none (a new request, a
preempted one, one whose prompt was still being prefilled) gets a new drafter over its tokens, so
a row never drafts from another request's tokens.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from .drafting import Drafter

__all__ = ["Proposer"]

#: Tokens of a sequence's start and of its end (before the new tokens) that identify it.
HEAD = 32
TAIL = 16


def _slice(row: Any, start: int, end: int) -> List[int]:
    part = row[start:end]
    return part.tolist() if hasattr(part, "tolist") else list(part)


class _Tracked:
    """One request's drafter and what identifies its sequence."""

    __slots__ = ("drafter", "length", "head", "tail", "proposed")

    def __init__(self, drafter: Drafter, tokens_row: Any, n: int) -> None:
        self.drafter = drafter
        self.length = n
        self.head = tuple(_slice(tokens_row, 0, min(HEAD, n)))
        self.tail = tuple(_slice(tokens_row, max(0, n - TAIL), n))
        self.proposed = 0

    def holds(self, row: Any, before: int) -> bool:
        """Whether this is the sequence of `row` as it was `before` this step's tokens."""
        return (
            self.length == before
            and tuple(_slice(row, 0, min(HEAD, before))) == self.head
            and tuple(_slice(row, max(0, before - TAIL), before)) == self.tail
        )

    def extend(self, tokens: List[int]) -> None:
        self.drafter.push(tokens)
        self.length += len(tokens)
        self.tail = (self.tail + tuple(tokens))[-TAIL:]
        if len(self.head) < HEAD:
            self.head = (self.head + tuple(tokens))[:HEAD]


def _dynamic_schedule(vllm_config: Any, k: int) -> Optional[List[int]]:
    """vLLM's draft length by batch size (index: the number of rows), where the config sets
    `num_speculative_tokens_per_batch_size`; None otherwise."""
    spec = vllm_config.speculative_config
    schedule = getattr(spec, "num_speculative_tokens_per_batch_size", None)
    if not schedule:
        return None
    max_rows = int(getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", 0) or 256)
    try:
        from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup
    except ImportError:  # a vLLM without dynamic schedules would not have set one
        return None
    return build_dynamic_sd_schedule_lookup(
        schedule, vllm_max_batch_size=max_rows, vllm_num_speculative_tokens=k
    )


class Proposer:
    """vLLM's custom proposer (`speculative_config={"method": "custom_class", "model":
    "pld.vllm.Proposer", ...}`): one pld drafter per request of the persistent batch."""

    def __init__(self, vllm_config: Any) -> None:
        spec = vllm_config.speculative_config
        self.k = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        extra = getattr(vllm_config, "additional_config", None) or {}
        config: Dict[str, Any] = dict(extra.get("pld") or {}) if isinstance(extra, dict) else {}
        for name in ("prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(spec, name, None)
            if value and name not in config:
                config[name] = int(value)
        config["num_speculative_tokens"] = self.k
        # On a GPU a drafted row costs next to nothing, so drafts go out at full length unless
        # asked otherwise (pld's adaptive length is priced for its own CPU kernels).
        config.setdefault("adaptive", False)
        # What the earlier occurrences agree on, not one picked by position: more accepted from
        # fewer drafted tokens than vLLM's ngram on the recorded outputs (see above).
        config.setdefault("match_policy", "scored")
        Drafter([], config)  # a bad setting fails now, in the worker's start-up
        self.config = config
        self._k_by_batch = _dynamic_schedule(vllm_config, self.k)
        self._rows: List[Optional[_Tracked]] = []

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """vLLM hands over the target model; drafting needs none."""

    def propose(
        self,
        sampled_token_ids: Sequence[Sequence[int]],
        num_tokens_no_spec: Any,
        token_ids_cpu: Any,
        slot_mappings: Any = None,
        num_speculative_tokens: Optional[int] = None,
        **_: Any,
    ) -> List[List[int]]:
        """One draft per row (`[]` for none): the row's sequence is `token_ids_cpu[i,
        :num_tokens_no_spec[i]]`, of which `sampled_token_ids[i]` arrived this step (empty for a
        row still in prefill). `num_speculative_tokens` caps this step's drafts below K (vLLM's
        per-step draft length; None: K); the rows' drafters are updated whatever it is."""
        k = self.k
        if num_speculative_tokens is None and self._k_by_batch and sampled_token_ids:
            rows = min(len(sampled_token_ids), len(self._k_by_batch) - 1)
            num_speculative_tokens = self._k_by_batch[rows]
        if num_speculative_tokens is not None:
            k = max(0, min(k, int(num_speculative_tokens)))
        previous = self._rows
        spare: Dict[Any, List[_Tracked]] = {}
        for s in previous:
            if s is not None:
                spare.setdefault((s.length, s.head), []).append(s)
        rows: List[Optional[_Tracked]] = []
        drafts: List[List[int]] = []
        for i, sampled in enumerate(sampled_token_ids):
            n = int(num_tokens_no_spec[i])
            if not sampled or n >= self.max_model_len:
                rows.append(None)
                drafts.append([])
                continue
            new = [int(t) for t in sampled]
            row = token_ids_cpu[i]
            state = self._find(previous[i] if i < len(previous) else None, spare, row, n - len(new))
            if state is None:
                state = _Tracked(Drafter(row[:n], self.config), row, n)
            else:
                # The last draft's accepted tokens are the new ones but the model's own last.
                state.drafter.observe(min(state.proposed, len(new) - 1))
                state.extend(new)
            draft = state.drafter.propose(min(k, self.max_model_len - n))
            state.proposed = len(draft)
            rows.append(state)
            drafts.append(draft)
        self._rows = rows
        return drafts

    @staticmethod
    def _find(
        same_row: Optional[_Tracked], spare: Dict[Any, List[_Tracked]], row: Any, before: int
    ) -> Optional[_Tracked]:
        """The drafter of the request now in `row` (its row last step, or one that moved)."""
        candidates = [same_row] if same_row is not None else []
        head = tuple(_slice(row, 0, min(HEAD, before)))
        candidates += spare.get((before, head), [])
        for s in candidates:
            if s.holds(row, before):
                group = spare.get((s.length, s.head), [])
                if s in group:
                    group.remove(s)  # a drafter serves one row
                    return s
        return None
