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
`match_policy` (`evidence`, the default, `scored`, `recent`, `earliest`,
`longest`: see `MatchPolicy` in the drafting crate), `adaptive`, which is off by default here: on
a GPU a drafted row is nearly free), and the proposer's own `corpus_tokens` (below); K is vLLM's
`num_speculative_tokens`.

`evidence` is the default inside vLLM, with a corpus: on the recorded greedy outputs
(docs/bench/vllm/README.md: qwen-coder-0.5b in vLLM, 30 grounded and Spec-Bench rows; pld's 115
recorded turns; K = 8 and 4) it replayed to more tokens per step in total than vLLM's `ngram` and
`suffix` and than pld's `scored`, from 56-63% of the tokens `ngram` and `scored` draft at K = 8
and 80-86% at K = 4 (K = 8:
1.694 tokens a step from 4,030 drafted, against `ngram`'s 1.628 from 7,189 and `suffix`'s 1.630
from 2,377; on the 115 turns 1.826 from 29,320 against 1.763 from 50,112 and 1.729 from 18,311).
It still drafts more than `suffix` (1.3-1.7 times in total) and loses tokens per step to `ngram`
on the summaries.

The corpus: each proposer keeps the outputs of the requests it has seen leave the batch, up to
`corpus_tokens` tokens (default 262,144, some 25 MB of index; the oldest go first; 0 turns it
off), and the `scored` and `evidence` policies draft from it too, as vLLM's `suffix` drafts from
its cache of earlier responses. It is shared by every request this proposer serves (one proposer
per vLLM worker): a draft never changes an output under greedy or rejection sampling, but
requests that must not even steer each other's drafts need `corpus_tokens: 0`. A request that
leaves the batch and comes back (preempted) counts as finished, and starts over with a new
drafter.

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
a row's sequence never mixes with another request's (the corpus is the one way other requests'
tokens reach a draft).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from .drafting import Corpus, Drafter

__all__ = ["Proposer"]

#: Tokens of a sequence's start and of its end (before the new tokens) that identify it.
HEAD = 32
TAIL = 16

#: Default most tokens of a proposer's corpus of finished outputs (`corpus_tokens`).
CORPUS_TOKENS = 1 << 18


def _slice(row: Any, start: int, end: int) -> List[int]:
    part = row[start:end]
    return part.tolist() if hasattr(part, "tolist") else list(part)


class _Tracked:
    """One request's drafter and what identifies its sequence."""

    __slots__ = ("drafter", "length", "head", "tail", "proposed", "prompt")

    def __init__(self, drafter: Drafter, tokens_row: Any, n: int, prompt: int) -> None:
        self.drafter = drafter
        self.length = n
        self.prompt = prompt  # the tokens before the first sampled one this proposer saw
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
        # Drafts sized by how many earlier occurrences agree and how long: more accepted per step
        # than vLLM's ngram and suffix on the recorded outputs, from far fewer drafted tokens than
        # ngram (see above).
        config.setdefault("match_policy", "evidence")
        corpus_tokens = config.pop("corpus_tokens", CORPUS_TOKENS)
        if isinstance(corpus_tokens, bool) or not isinstance(corpus_tokens, int) or corpus_tokens < 0:
            raise ValueError(
                "additional_config['pld']['corpus_tokens'] must be a whole number of tokens "
                f"(0: no corpus), not {corpus_tokens!r}"
            )
        Drafter([], config)  # a bad setting fails now, in the worker's start-up
        self.config = config
        self.corpus: Optional[Corpus] = Corpus(corpus_tokens) if corpus_tokens else None
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
                drafter = Drafter(row[:n], self.config, self.corpus)
                state = _Tracked(drafter, row, n, n - len(new))
            else:
                # The last draft's accepted tokens are the new ones but the model's own last.
                state.drafter.observe(min(state.proposed, len(new) - 1))
                state.extend(new)
            draft = state.drafter.propose(min(k, self.max_model_len - n))
            state.proposed = len(draft)
            rows.append(state)
            drafts.append(draft)
        if self.corpus is not None:
            kept = {id(s) for s in rows if s is not None}
            for s in previous:
                if s is not None and id(s) not in kept:
                    self._retire(s)
        self._rows = rows
        return drafts

    def _retire(self, state: _Tracked) -> None:
        """Adds the output of a request that left the batch (as far as it went) to the corpus."""
        assert self.corpus is not None
        output = state.drafter.tokens()[state.prompt:]
        if output:
            self.corpus.add(output)

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
