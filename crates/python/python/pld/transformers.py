"""pld's drafter inside Hugging Face transformers' assisted generation, in one argument:

    import pld.transformers

    out = model.generate(**inputs, max_new_tokens=128, custom_generate=pld.transformers.prompt_lookup)

`prompt_lookup` is a `custom_generate` callable (transformers 5): `generate` prepares everything
as usual and hands over to it; it runs transformers' own assisted decoding with a pld drafter as
the candidate generator instead of `PromptLookupCandidateGenerator` (which unfolds the whole
sequence for every n-gram size each step, copies the earliest match and never adapts its length).
Verification is transformers': greedy output is its greedy output token for token, and sampling
is exact. Pass pld's settings as `pld_config={...}` (vLLM's names: `num_speculative_tokens`,
`prompt_lookup_max`, `prompt_lookup_min`, `match_policy`, `adaptive`, off by default here); a
`prompt_lookup_num_tokens` in the generation config is taken as K. Batch size 1, as transformers'
assisted decoding requires. Needs torch and transformers (not needed by the rest of pld).
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from .drafting import Drafter

__all__ = ["prompt_lookup", "candidate_generator"]


def _base():
    from transformers.generation.candidate_generator import CandidateGenerator as Base

    return Base


_GENERATOR = None


def _generator_class():
    global _GENERATOR
    if _GENERATOR is not None:
        return _GENERATOR
    import torch

    class PldCandidateGenerator(_base()):
        def __init__(self, config: Dict[str, Any], max_length: int) -> None:
            self.config = config
            self.k = int(config.get("num_speculative_tokens", 8))
            self.max_length = max_length
            self.drafter: Optional[Drafter] = None
            self.proposed = 0

        def get_candidates(self, input_ids, **kwargs):
            ids = input_ids[0].tolist()
            if self.drafter is None:
                self.drafter = Drafter(ids, self.config)
            else:
                self.drafter.push(ids[len(self.drafter):])
            room = self.max_length - len(ids) - 1  # the model adds one token of its own
            draft = self.drafter.propose(min(self.k, room)) if room > 0 else []
            self.proposed = len(draft)
            if not draft:
                return input_ids, None
            tail = torch.tensor([draft], dtype=input_ids.dtype, device=input_ids.device)
            return torch.cat([input_ids, tail], dim=1), None

        def update_candidate_strategy(self, input_ids, scores, num_matches):
            if self.drafter is not None:
                self.drafter.observe(min(int(num_matches), self.proposed))

    _GENERATOR = PldCandidateGenerator
    return _GENERATOR


def candidate_generator(config: Optional[Dict[str, Any]] = None, max_length: int = 2**31):
    """A transformers `CandidateGenerator` over a pld drafter (made from the first `input_ids`
    it sees): `get_candidates` returns the sequence with the draft appended and no logits,
    `update_candidate_strategy` tells the drafter how many were accepted."""
    return _generator_class()(dict(config or {}), max_length)


def prompt_lookup(
    model,
    input_ids,
    logits_processor=None,
    stopping_criteria=None,
    generation_config=None,
    pld_config: Optional[Dict[str, Any]] = None,
    **model_kwargs,
):
    """`model.generate(..., custom_generate=pld.transformers.prompt_lookup)`: transformers'
    assisted decoding with pld's drafter proposing the candidates."""
    from transformers.generation.utils import GenerationMixin

    if input_ids.shape[0] != 1:
        raise ValueError("pld.transformers.prompt_lookup: batch size 1 (as assisted decoding)")
    config = dict(pld_config or {})
    # A drafted row costs transformers little next to a pass: full-length drafts unless asked.
    config.setdefault("adaptive", False)
    k = getattr(generation_config, "prompt_lookup_num_tokens", None)
    if k and "num_speculative_tokens" not in config:
        config["num_speculative_tokens"] = int(k)
    generator = candidate_generator(config, generation_config.max_length)
    model._get_candidate_generator = lambda *a, **kw: generator
    try:
        return GenerationMixin._assisted_decoding(
            model,
            input_ids,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            generation_config=generation_config,
            **model_kwargs,
        )
    finally:
        del model._get_candidate_generator
