"""`pld.drafting` over token ids, and `pld.vllm.Proposer` called as vLLM 0.33 calls it on a
simulated persistent batch (rows added, prefilled in chunks, finished, moved into holes and
swapped): every draft equals what a fresh pld drafter proposes on that row's own sequence."""

import random
from types import SimpleNamespace

import pytest

from pld.drafting import Corpus, Drafter
from pld.vllm import Proposer

# The most recent occurrence (the default is `evidence`), full-length drafts.
FIXED = {"num_speculative_tokens": 4, "adaptive": False, "prompt_lookup_min": 1, "prompt_lookup_max": 3,
         "match_policy": "recent"}


def test_a_draft_copies_what_followed_the_latest_match():
    d = Drafter([1, 2, 3, 4, 5, 9, 1, 2, 3, 7, 8, 6, 1, 2, 3], FIXED)
    assert d.propose(8) == [7, 8, 6, 1]
    assert d.parents() == [-1, 0, 1, 2]
    assert d.propose(2) == [7, 8], "the limit caps the draft"
    d.push([7, 8])
    assert len(d) == 17 and d.tokens()[-2:] == [7, 8]
    d.truncate(15)
    assert d.tokens()[-1] == 3
    assert Drafter([5, 6, 7], FIXED).propose(8) == [], "no earlier match, no draft"


def test_arrays_and_lists_give_the_same_drafts():
    np = pytest.importorskip("numpy")
    ids = [random.Random(1).randrange(50) for _ in range(2000)]
    a, b = Drafter(ids, FIXED), Drafter(np.array(ids, dtype=np.int64), FIXED)
    assert a.tokens() == b.tokens()
    a.push(np.array([3, 4], dtype=np.int32))
    b.push([3, 4])
    assert a.propose(4) == b.propose(4)


def test_bad_settings_raise_value_errors():
    with pytest.raises(ValueError, match="speculative_config"):
        Drafter([1, 2], {"num_speculative_tokens": 4, "nonsense": True})
    with pytest.raises(ValueError, match="prompt_lookup"):
        Drafter([1, 2], {"prompt_lookup_min": 5, "prompt_lookup_max": 2})


def test_adaptive_drafts_grow_when_accepted_and_shrink_when_not():
    pattern = [1, 2, 3, 4, 5, 6, 7, 8]
    good, bad = Drafter(pattern * 50, {"num_speculative_tokens": 8}), Drafter(pattern * 50, {"num_speculative_tokens": 8})
    for _ in range(60):
        draft = good.propose(8)
        good.observe(len(draft))
        good.push(draft + [pattern[(len(good) + len(draft)) % 8]])
        bad.propose(8)
        bad.observe(0)
        bad.push([pattern[len(bad) % 8]])
    assert len(good.propose(8)) == 8
    assert len(bad.propose(8)) < 8

def test_trees_draw_on_a_corpus():
    corpus = Corpus(1000)
    corpus.add([10, 11, 12, 13, 14, 15, 16])
    tree = {"method": "tree", "num_speculative_tokens": 4, "adaptive": False, "tree_sources": ["corpus"]}
    d = Drafter([1, 10, 11, 12], tree, corpus=corpus)
    assert d.propose(8)[:2] == [13, 14]
    assert len(corpus) == 7


class Batch:
    """vLLM's persistent batch as the proposer sees it: a token array with a row per request,
    each row's length, and what each row accepted in the last step."""

    def __init__(self, rows, max_len, np):
        self.np = np
        self.tokens = np.zeros((rows, max_len), dtype=np.int32)
        self.lengths = np.zeros(rows, dtype=np.int32)
        self.requests = []  # per row: [truth, prompt_len, prefilled]

    def add(self, truth, prompt_len):
        i = len(self.requests)
        self.requests.append([truth, prompt_len, 0])
        self.lengths[i] = 0
        return i

    def remove(self, i):
        """A finished request: the last row moves into its hole (vLLM's condense)."""
        last = len(self.requests) - 1
        if i != last:
            self.tokens[i] = self.tokens[last]
            self.lengths[i] = self.lengths[last]
            self.requests[i] = self.requests[last]
        self.requests.pop()
        self.tokens[last] = 0
        self.lengths[last] = 0

    def swap(self, a, b):
        self.tokens[[a, b]] = self.tokens[[b, a]]
        self.lengths[[a, b]] = self.lengths[[b, a]]
        self.requests[a], self.requests[b] = self.requests[b], self.requests[a]


def truth_sequence(rng, length):
    """Tokens that repeat earlier runs often, as grounded outputs do."""
    out = [rng.randrange(40) for _ in range(24)]
    while len(out) < length:
        if rng.random() < 0.6:
            start = rng.randrange(len(out) - 8)
            out.extend(out[start:start + rng.randrange(3, 12)])
        else:
            out.append(rng.randrange(40))
    return out[:length]


@pytest.mark.parametrize("adaptive", [False, True])
def test_the_vllm_proposer_drafts_each_row_from_its_own_tokens(adaptive):
    np = pytest.importorskip("numpy")
    rng = random.Random(7)
    max_len, rows, k = 2048, 6, 5
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k, prompt_lookup_min=0, prompt_lookup_max=0, method="custom_class"),
        model_config=SimpleNamespace(max_model_len=max_len),
        scheduler_config=SimpleNamespace(max_num_seqs=rows),
        additional_config={"pld": {"prompt_lookup_min": 1, "prompt_lookup_max": 3, "adaptive": adaptive,
                                   "match_policy": "recent"}},
    )
    proposer = Proposer(config)
    assert proposer.config["num_speculative_tokens"] == k
    default = Proposer(SimpleNamespace(**{**vars(config), "additional_config": None}))
    assert default.config["adaptive"] is False, "full-length drafts by default inside vLLM"
    assert default.config["match_policy"] == "evidence", "vLLM's default policy (docs/bench/vllm)"
    assert default.corpus is not None and "corpus_tokens" not in default.config
    with pytest.raises(ValueError, match="speculative_config"):
        Proposer(SimpleNamespace(**{**vars(config), "additional_config": {"pld": {"bogus": 1}}}))
    for bad in (-1, 1.5, "many", True):
        with pytest.raises(ValueError, match="corpus_tokens"):
            Proposer(SimpleNamespace(**{**vars(config), "additional_config": {"pld": {"corpus_tokens": bad}}}))
    batch = Batch(rows, max_len, np)
    waiting = [truth_sequence(rng, rng.randrange(300, 1500)) for _ in range(20)]
    drafts = []
    checked = accepted_total = 0
    for step in range(3000):
        if not waiting and not batch.requests:
            break
        while waiting and len(batch.requests) < rows:
            truth = waiting.pop()
            batch.add(truth, rng.randrange(40, 200))
            drafts.append([])
        if rng.random() < 0.05 and len(batch.requests) > 1:
            a, b = rng.sample(range(len(batch.requests)), 2)
            batch.swap(a, b)
            drafts[a], drafts[b] = drafts[b], drafts[a]
        sampled = []
        for i, (truth, prompt_len, prefilled) in enumerate(batch.requests):
            n = int(batch.lengths[i])
            if n < prompt_len:  # prefill in chunks of 64; the last chunk samples a token
                end = min(prompt_len, n + 64)
                batch.tokens[i, n:end] = truth[n:end]
                batch.lengths[i] = end
                sampled.append([int(truth[end])] if end == prompt_len else [])
                if end == prompt_len:
                    batch.tokens[i, end] = truth[end]
                    batch.lengths[i] = end + 1
                continue
            draft = drafts[i]
            accepted = 0
            while accepted < len(draft) and n + accepted < len(truth) and draft[accepted] == truth[n + accepted]:
                accepted += 1
            accepted_total += accepted
            new = truth[n:n + accepted + 1]
            batch.tokens[i, n:n + len(new)] = new
            batch.lengths[i] = n + len(new)
            sampled.append(list(new))
        drafts = proposer.propose(sampled, batch.lengths.copy(), batch.tokens)
        assert len(drafts) == len(batch.requests)
        for i, draft in enumerate(drafts):
            n = int(batch.lengths[i])
            if not sampled[i]:
                assert draft == []
                continue
            fresh = Drafter(batch.tokens[i, :n], {**FIXED, "num_speculative_tokens": k})
            want = fresh.propose(k)
            if adaptive:
                assert draft == want[:len(draft)], f"step {step} row {i}"
            else:
                assert draft == want, f"step {step} row {i}"
            checked += 1
        for i in reversed(range(len(batch.requests))):
            if int(batch.lengths[i]) >= len(batch.requests[i][0]) - 1:
                batch.remove(i)
                last = len(drafts) - 1
                drafts[i] = drafts[last]
                drafts.pop()
    assert not waiting and not batch.requests, "the simulation ran out of steps"
    assert checked > 1000 and accepted_total > 1000


def test_the_vllm_proposer_takes_a_per_step_draft_length():
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=6, prompt_lookup_min=0, prompt_lookup_max=0, method="custom_class"),
        model_config=SimpleNamespace(max_model_len=64),
        additional_config={"pld": {"prompt_lookup_max": 3}},
    )
    proposer = Proposer(config)
    row = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2] + [0] * 53
    assert proposer.propose([[2]], [11], [row]) == [[3, 4, 5, 6, 7, 8]], "K without a length"
    row[11] = 3
    assert proposer.propose([[3]], [12], [row], num_speculative_tokens=2) == [[4, 5]]
    row[12] = 4
    assert proposer.propose([[4]], [13], [row], num_speculative_tokens=0) == [[]]
    row[13] = 5
    assert proposer.propose([[5]], [14], [row], num_speculative_tokens=99) == [[6, 7, 8, 9, 1, 2]], "never past K"


def test_the_vllm_proposer_follows_a_batch_size_schedule(monkeypatch):
    # vLLM's own expansion of `num_speculative_tokens_per_batch_size`, stood in: 1 row drafts
    # up to 6 (K), 2 or more rows 2.
    import sys
    import types

    utils = types.ModuleType("vllm.v1.spec_decode.dynamic.utils")
    utils.build_dynamic_sd_schedule_lookup = lambda schedule, vllm_max_batch_size, vllm_num_speculative_tokens: [
        0, *[min(vllm_num_speculative_tokens, 6 if rows == 1 else 2) for rows in range(1, vllm_max_batch_size + 1)]
    ]
    for name in ("vllm", "vllm.v1", "vllm.v1.spec_decode", "vllm.v1.spec_decode.dynamic"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, utils.__name__, utils)
    config = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=6, prompt_lookup_min=0, prompt_lookup_max=0,
                                           method="custom_class",
                                           num_speculative_tokens_per_batch_size=[(1, 1, 6), (2, 4, 2)]),
        model_config=SimpleNamespace(max_model_len=64),
        scheduler_config=SimpleNamespace(max_num_seqs=4),
        additional_config={"pld": {"prompt_lookup_max": 3}},
    )
    proposer = Proposer(config)
    row = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2] + [0] * 53
    assert proposer.propose([[2]], [11], [row]) == [[3, 4, 5, 6, 7, 8]], "one row: K"
    row[11] = 3
    other = [5, 6, 7, 5, 6] + [0] * 59
    assert proposer.propose([[3], [6]], [12, 5], [row, other]) == [[4, 5], [7, 5]], "two rows: 2 each"
    row[12] = 4
    assert proposer.propose([[4], []], [13, 5], [row, other], num_speculative_tokens=1) == [[5], []], \
        "a length passed in wins"


def test_the_vllm_proposer_drafts_from_finished_outputs():
    def proposer(pld):
        return Proposer(SimpleNamespace(
            speculative_config=SimpleNamespace(num_speculative_tokens=4, prompt_lookup_min=0, prompt_lookup_max=0,
                                               method="custom_class"),
            model_config=SimpleNamespace(max_model_len=64),
            additional_config={"pld": {"prompt_lookup_max": 3, **pld}},
        ))

    def run(p):
        # Request A: prompt 1 2 3, then the output 50..55, one token a step (nothing to draft).
        row = [1, 2, 3] + [0] * 61
        for i, t in enumerate(range(50, 56)):
            row[3 + i] = t
            p.propose([[t]], [4 + i], [row])
        p.propose([], [], [])  # A has left the batch
        # Request B ends with "51 52", which only A's output continued.
        other = [9, 8, 51, 52] + [0] * 60
        return p.propose([[52]], [4], [other])

    assert run(proposer({})) == [[53, 54, 55]], "drafted from A's output"
    assert run(proposer({"corpus_tokens": 0})) == [[]], "no corpus, no match"
    assert run(proposer({"match_policy": "recent"})) == [[]], "only the scored policies read it"
