"""pld's drafter over token ids only, for other engines: no model, no torch or numpy needed.

    from pld.drafting import Drafter

    d = Drafter(prompt_ids, {"num_speculative_tokens": 8, "prompt_lookup_max": 4})
    draft = d.propose(8)        # tokens that followed the latest earlier match of the suffix
    d.push(accepted_tokens)     # what the model emitted (accepted draft tokens and its own)
    d.observe(num_accepted)     # how many of `draft` were accepted (sizes later drafts)

Token ids may be any sequence of ints, or a numpy integer array (read in one copy, not converted to
Python ints). A proposal takes tens of nanoseconds to microseconds at any context length: the
index is updated as tokens are pushed, never rescanned.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Union

from . import _native

__all__ = ["Drafter", "Corpus"]

Ids = Union[Sequence[int], Any]


def _ids(tokens: Ids) -> Union[List[int], bytes]:
    """A list of ints, or the little-endian u32 bytes of an array-like (numpy) of ids."""
    if hasattr(tokens, "__array_interface__") and hasattr(tokens, "astype"):
        return tokens.astype("<u4", copy=False).tobytes()
    if isinstance(tokens, (bytes, bytearray)):
        raise TypeError("token ids: give a sequence of ints or an integer array, not bytes")
    return [int(t) for t in tokens] if not isinstance(tokens, list) else tokens


class Corpus:
    """Earlier sequences (prompts and outputs) that drafts may copy from, bounded in tokens:
    the `corpus` source of `method: "tree"` drafts, and further candidates of the `scored` and
    `evidence` chains."""

    def __init__(self, max_tokens: Optional[int] = None) -> None:
        self._native = _native.Corpus() if max_tokens is None else _native.Corpus(max_tokens)

    def add(self, tokens: Ids) -> None:
        self._native.add(_ids(tokens))

    def __len__(self) -> int:
        return len(self._native)


class Drafter:
    """One sequence's drafter. `speculative_config` is vLLM's dict (`method` "ngram" or "tree",
    `num_speculative_tokens`, `prompt_lookup_max`, `prompt_lookup_min`, `match_policy`
    "recent"/"earliest"/"longest"/"scored"/"evidence", `adaptive`; Hugging Face's `prompt_lookup_num_tokens` and
    `max_matching_ngram_size` are aliases) over pld's defaults; a bad value raises ValueError."""

    def __init__(
        self,
        prompt: Ids,
        speculative_config: Optional[Dict[str, Any]] = None,
        corpus: Optional[Corpus] = None,
    ) -> None:
        spec = None if speculative_config is None else json.dumps(speculative_config)
        self._native = _native.Drafter(_ids(prompt), spec, None if corpus is None else corpus._native)

    def propose(self, limit: int, price: Optional[float] = None) -> List[int]:
        """The next draft, at most `limit` tokens (and at most K). With adaptive drafting it is
        cut to what pays for its rows at `price` (a drafted row's cost in plain tokens; None:
        the drafter's own estimate). For `method: "tree"` these are the tree's nodes in order,
        with `parents()`."""
        return self._native.propose(limit, price)

    def parents(self) -> List[int]:
        """The last proposal's node parents: -1 for the root (the last token)."""
        return self._native.parents()

    def push(self, tokens: Union[int, Ids]) -> None:
        """Appends emitted tokens (one int or several)."""
        self._native.push([tokens] if isinstance(tokens, int) else _ids(tokens))

    def observe(self, accepted: int) -> None:
        """How many tokens of the last proposed chain the model accepted."""
        self._native.observe(accepted)

    def observe_path(self, path: Sequence[int]) -> None:
        """The accepted nodes of the last proposed tree, from the root's child down."""
        self._native.observe_path(list(path))

    def truncate(self, n: int) -> None:
        """Cuts the sequence back to `n` tokens."""
        self._native.truncate(n)

    def tokens(self) -> List[int]:
        return self._native.tokens()

    def __len__(self) -> int:
        return len(self._native)
