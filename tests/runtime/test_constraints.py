"""Lexically constrained beam search (constraints.py, constrained.py): the state of each hypothesis
against fairseq's, and the search on a trained test Marian model on every CPU backend.

The state is fairseq's UnorderedConstraintState (token_generation_constraints.py) in arrays: its
own tests' cases (tests/test_constraints.py) are ported here, and random token streams are
checked against a transcription of its classes. The search must return, for every source with
constraints, hypotheses that contain each phrase contiguously (`contains`), say which it could
not meet within the length limit, and leave a source without constraints as plain beam search
decodes it: the same tokens and scores, where both read the same log-probs.
"""
from collections import Counter

import numpy as np
import pytest

import xform
from tests.marian_fixtures import sources
from xform.errors import SettingError
from xform.runtime.decoding.constrained import ConstrainedBeamSearch
from xform.runtime.decoding.constraints import Constraints, smallest_beam
from xform.runtime.decoding.generation import GenerationConfig
from xform.runtime.decoding.loop import Batch
from xform.runtime.decoding.processors import Special

pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")
MAX_NEW = 14
MODEL = "swish-scaled"  # target vocabulary 53: eos 0, pad 52


# --- the state: fairseq's cases, and fairseq's classes as the reference -----------------------

class Node:
    """fairseq's ConstraintNode, transcribed: a trie node with its terminal count and the number
    of constraints through it."""

    def __init__(self, token=None, parent=None):
        self.token, self.parent, self.terminal, self.children, self.num_constraints = token, parent, 0, {}, 0

    @staticmethod
    def create(constraints):
        root = Node()
        for seq in constraints:
            node = root
            for tok in seq:
                node = node.children.setdefault(tok, Node(tok, node))
            node.terminal += 1
            while node is not None:
                node.num_constraints += 1
                node = node.parent
        return root


class Reference:
    """fairseq's UnorderedConstraintState, transcribed (advance, rewind, bank, num_completed). With
    `again` (xform's rule), whether a phrase can start at the token that broke one off is read
    after the rewind, not before it."""

    def __init__(self, node, root=None, completed=None, generated=None, again=True):
        self.node, self.root, self.again = node, root or node, again
        self.completed, self.generated = Counter(completed or {}), Counter(generated or {})
        if self.node is not self.root:
            self.generated[node] += 1

    def copy_to(self, node):
        return Reference(node, self.root, self.completed, self.generated, self.again)

    @property
    def bank(self):
        return sum(self.generated.values())

    @property
    def num_completed(self):
        in_final = bool(self.node.terminal and self.completed[self.node] < self.node.terminal)
        return sum(self.completed.values()) + in_final

    @property
    def finished(self):
        return self.root.num_constraints == self.num_completed

    def next_tokens(self):
        return set(self.root.children) | (set(self.node.children) if self.node is not self.root else set())

    def advance(self, token):
        child = self.node.children.get(token)
        if child is not None and self.generated[child] < child.num_constraints:
            return self.copy_to(child)
        child = self.root.children.get(token)
        rewound = self.copy_to(self.root)
        node = self.node
        while node is not self.root:
            if node.terminal and self.completed[node] < node.terminal:
                rewound.completed[node] += 1
                break
            rewound.generated[node] -= 1
            node = node.parent
        counts = rewound.generated if self.again else self.generated
        if child is not None and counts[child] < child.num_constraints:
            return rewound.copy_to(child)
        return rewound


EX0 = [[1, 2, 3], [1, 3], [1, 4], [4, 5, 6, 7], [1], [4, 5]]
# fairseq's tests/test_constraints.py TestUnorderedConstraintState.sequences
FAIRSEQ_SEQUENCES = [
    (EX0, [], dict(bank=0, num_completed=0, finished=False, is_root=True)),
    (EX0, [1, 2], dict(bank=2, num_completed=0, finished=False, is_root=False)),
    (EX0, [1, 2, 94], dict(bank=1, num_completed=1, finished=False, is_root=True)),
    (EX0, [1, 3, 999, 1, 4], dict(bank=4, num_completed=2, finished=False, is_root=False)),
    (EX0, [1, 3, 999, 1, 4, 999], dict(bank=4, num_completed=2, finished=False, is_root=True)),
    (EX0, [4, 5, 6, 8], dict(bank=2, num_completed=1, finished=False, is_root=True)),
    # down [1 -> 4] in the last three: could miss [1] and [4 -> 5]
    (EX0, [1, 2, 3, 1, 3, 1, 4, 4, 5, 6, 7, 1, 4, 5], dict(bank=14, num_completed=6, finished=True, is_root=False)),
    (EX0, [1, 2, 3, 999, 1, 3, 1, 4, 4, 5, 6, 7, 1, 4, 5, 117],
     dict(bank=14, num_completed=6, finished=True, is_root=True)),
    ([[1], [2, 3]], [1, 1], dict(bank=1, num_completed=1, finished=False, is_root=True)),  # no credit for 1 twice
    ([[1, 2], [1, 2]], [1, 2, 1, 2], dict(bank=4, num_completed=2, finished=True, is_root=False)),
    ([[1, 2], [1, 2]], [1, 2, 1, 2, 1], dict(bank=4, num_completed=2, finished=True, is_root=True)),
    ([[1, 2], [3, 4]], [1, 2, 3, 4, 5], dict(bank=4, num_completed=2, finished=True, is_root=True)),
]


def walk(phrases, tokens):
    """One hypothesis of one source through `tokens`: its state, the tables and the source index."""
    cons = Constraints([phrases])
    src = np.zeros(1, np.int64)
    state = cons.start(1)
    for tok in tokens:
        state = cons.advance(state, src, np.array([tok]))
    return cons, state, src


def described(cons, state, src):
    return dict(bank=int(state.bank[0]), num_completed=int(cons.num_completed(state, src)[0]),
                finished=bool(cons.finished(state, src)[0]), is_root=bool(state.node[0] == 0))


@pytest.mark.parametrize("phrases,tokens,want", FAIRSEQ_SEQUENCES)
def test_state_after_fairseqs_sequences(phrases, tokens, want):
    assert described(*walk(phrases, tokens)) == want


def test_trie_counts_constraints_through_each_node_as_fairseq():
    """fairseq's test_graphs token counts: each node's count of constraints through it, summed by token."""
    for phrases, counts in [(EX0, {1: 4, 2: 1, 3: 2, 4: 3, 5: 2, 6: 1, 7: 1}), ([[1, 2], [1, 2]], {1: 2, 2: 2}),
                            ([[1, 2], [3, 4]], {1: 1, 2: 1, 3: 1, 4: 1}), ([[100000, 1, 2]], {100000: 1, 1: 1, 2: 1})]:
        cons = Constraints([phrases])
        got = Counter()
        for tok, n in zip(cons.token[0, 1:], cons.count[0, 1:]):
            if tok >= 0:
                got[int(tok)] += int(n)
        assert got == counts and cons.count[0, 0] == len(phrases)


def test_next_tokens_start_a_phrase_or_continue_the_current_one():
    """fairseq's test_next_tokens: the root's children, and the current node's."""
    for phrases in (EX0, [[1, 2], [3, 4]], [[1, 2], [1, 2]]):
        root = Node.create(phrases)
        for phrase in phrases:
            cons, state, src = walk(phrases, [])
            ref = Reference(root)
            for tok in phrase:
                got = set(cons.next_tokens(state, src)[0].tolist()) - {-1}
                assert got == ref.next_tokens()
                state, ref = cons.advance(state, src, np.array([tok])), ref.advance(tok)


def occurrences(ids, phrase) -> int:
    """How many times `phrase` appears contiguously in `ids` (overlaps counted)."""
    n = len(phrase)
    return sum(tuple(ids[i:i + n]) == tuple(phrase) for i in range(len(ids) - n + 1))


def test_random_streams_track_fairseqs_state_and_what_is_met_is_there():
    """Many sources advanced at once, token by token, equal fairseq's state of each (bank, phrases
    completed, finished; with xform's restart rule); a phrase said met is in the stream, a phrase
    given twice twice."""
    rng = np.random.default_rng(0)
    sets = [[[1, 2]], [[1, 2], [1, 2]], [[1, 2], [2, 3]], [[3], [3, 1, 3]], EX0, [[2, 2, 1], [2]], [],
            [[1, 1, 2]], [[4, 5], [5, 4], [4]]]
    cons = Constraints(sets)
    streams = rng.integers(1, 8, (len(sets), 12, 40))  # 12 streams a source, 40 tokens each
    src = np.repeat(np.arange(len(sets)), 12)
    tokens = streams.reshape(len(src), -1)
    state = cons.start(len(src))
    refs = [Reference(Node.create(sets[s])) for s in src]
    for step in range(tokens.shape[1]):
        state = cons.advance(state, src, tokens[:, step])
        refs = [r.advance(int(t)) for r, t in zip(refs, tokens[:, step])]
        assert state.bank.tolist() == [r.bank for r in refs]
        assert cons.num_completed(state, src).tolist() == [r.num_completed for r in refs]
        assert cons.finished(state, src).tolist() == [r.finished for r in refs]
        met = cons.met(state, src)
        for row, s in enumerate(src):
            seen = tokens[row, :step + 1].tolist()
            wanted = Counter(tuple(p) for p, m in zip(sets[s], met[row]) if m)
            assert all(occurrences(seen, p) >= n for p, n in wanted.items())
    assert cons.finished(state, src).any() and not cons.finished(state, src).all()


def test_a_phrase_twice_needs_two_occurrences():
    cons, state, src = walk([[1, 2], [1, 2], [3]], [1, 2, 3])
    assert not cons.finished(state, src)[0] and cons.met(state, src)[0].tolist() == [True, False, True]
    cons, state, src = walk([[1, 2], [1, 2], [3]], [1, 2, 3, 1, 2])
    assert cons.finished(state, src)[0]


def test_progress_resets_when_a_phrase_breaks_off():
    """Inside a phrase, a token that does not continue it gives its tokens back (bank 0 again);
    the token that starts it starts it again, where fairseq's state would miss the phrase (a
    SentencePiece term's word-start piece repeated)."""
    cons, state, src = walk([[1, 2, 3]], [1, 2, 5])
    assert described(cons, state, src) == dict(bank=0, num_completed=0, finished=False, is_root=True)
    for tokens in ([1, 2, 1, 2, 3], [1, 1, 2, 3]):
        cons, state, src = walk([[1, 2, 3]], tokens)
        assert described(cons, state, src)["finished"]
        fairseq = Reference(Node.create([[1, 2, 3]]), again=False)
        for tok in tokens:
            fairseq = fairseq.advance(tok)
        assert not fairseq.finished


def test_smallest_beam_is_one_more_than_the_most_phrases():
    assert smallest_beam((((5,),),)) == 2
    assert smallest_beam((((5,), (6, 7)), (), ((8,), (9,), (10,)))) == 4


# --- the search on a trained model ------------------------------------------------------------

def contains(ids, phrase) -> bool:
    return occurrences([int(i) for i in ids], phrase) > 0


def assert_met(result, constraints, n=1):
    """Every hypothesis (n a source) contains each phrase of its source, as often as given, and
    reports none unmet."""
    assert result.unmet is not None
    for r, ids in enumerate(result.ids):
        phrases = constraints[r // n]
        for phrase, times in Counter(phrases).items():
            assert occurrences(ids.tolist(), phrase) >= times, f"hypothesis {r} {ids.tolist()} lacks {phrase}"
        assert result.unmet[r] == []


def load(bundle, backend, monkeypatch):
    """A session on `backend`: "ort", "torch", or "ort-cuda" (ONNX Runtime's device branch on the
    CPU doubles of tests/runtime/cuda_double.py)."""
    if backend == "ort-cuda":
        from tests.runtime.cuda_double import emulate_cuda
        emulate_cuda(monkeypatch)
        return xform.load(bundle, backend="ort", device="cuda", cache_capacity=3)
    return xform.load(bundle, backend=backend)


@pytest.fixture(scope="module")
def model(marians):
    _, model, bundle = marians[MODEL]
    return model, bundle


@pytest.fixture(scope="module")
def ort(model):
    return xform.load(model[1], backend="ort")


def absent(ids, src, count=1) -> list[int]:
    """Target ids an output row lacks: the source's own first (the model reverses its source), then
    any ordinary id."""
    have = set(ids.tolist())
    pool = [int(i) for i in src if 2 <= i < 50] + list(range(2, 50))
    return list(dict.fromkeys(i for i in pool if i not in have))[:count]


def batch(model, seed=1):
    src, _ = sources(model.config, [7, 3, 9, 5], seed=seed)
    return src.numpy()


@pytest.mark.parametrize("backend", ["ort", "torch", "ort-cuda"])
def test_greedy_is_promoted_and_contains_a_term_it_lacked(model, backend, monkeypatch):
    s = load(model[1], backend, monkeypatch)
    src = batch(model[0])
    plain = s.run(s.request(src, max_new_tokens=MAX_NEW))
    terms = tuple(((absent(row, src[r])[0],),) for r, row in enumerate(plain.ids))
    req = s.request(src, max_new_tokens=MAX_NEW, constraints=terms)
    assert req.generation.num_beams == 2 == req.promoted_beams and req.rows == 2 * len(src)
    got = s.run(req)
    assert got.promoted_beams == 2
    assert_met(got, terms)
    assert all(not contains(row, t[0]) for row, t in zip(plain.ids, terms))
    assert s.run(s.request(src, max_new_tokens=MAX_NEW)).promoted_beams is None


@pytest.mark.parametrize("backend", ["ort", "torch", "ort-cuda"])
def test_beams_meet_several_phrases_multi_token_and_twice_in_one_batch(model, backend, monkeypatch):
    """Different constraints a source, one source without: each of the 4 hypotheses of each source
    holds them; the source without is plain beam search's."""
    s = load(model[1], backend, monkeypatch)
    src = batch(model[0], seed=2)
    kw = dict(max_new_tokens=MAX_NEW, num_beams=4, num_return_sequences=4, return_scores=True)
    plain = s.run(s.request(src, **kw))
    a, b, c = absent(plain.ids[0], src[0], 3)
    d, e = absent(plain.ids[8], src[2], 2)
    terms = (((a,), (b, c)),  # several, one of two tokens
             ((d, e),),
             (),  # none
             ((a,), (a,)))  # twice
    got = s.run(s.request(src, constraints=terms, **kw))
    assert got.promoted_beams is None
    assert_met(got, terms, n=4)
    if backend == "torch":  # plain beams read the same log-probs there (no ranking graph): exactly equal
        np.testing.assert_array_equal(got.ids[8:12, :plain.ids.shape[1]], plain.ids[8:12])
        np.testing.assert_array_equal(got.scores[8:12], plain.scores[8:12])


def run_strategy(session, request, strategy):
    """`request` decoded with `strategy` in its place, through the one loop."""
    item = session.decode_item(request)
    item.strategy = strategy
    loop = Batch(session.backend, session.start_id)
    loop.admit(item)
    while not item.done:
        loop.step()
    return item.output


@pytest.mark.parametrize("kw", [
    dict(num_beams=2),
    dict(num_beams=4, num_return_sequences=4, length_penalty=0.6, early_stopping="never"),
    dict(num_beams=5, num_return_sequences=2, early_stopping=True, min_new_tokens=5),
    dict(num_beams=4, num_return_sequences=3, length_penalty=-0.5, target_prefix=[[5], [], [7, 8], []]),
])
def test_without_constraints_it_is_plain_beam_search(ort, model, kw):
    """Sources without constraints are plain beam search's hypotheses, token scores and scores,
    exactly, where both read the step's log-probs on the host (on ONNX Runtime, plain beams take
    the candidates graph's, equal within float32 rounding: test_beam_search)."""
    s = ort
    src = batch(model[0], seed=3)
    req = s.request(src, max_new_tokens=MAX_NEW, return_scores=True, return_token_scores=True, **kw)
    plain = s.decode_item(req).strategy
    plain.host = True  # the log-probs path
    want = run_strategy(s, req, plain)
    got = run_strategy(s, req, ConstrainedBeamSearch(len(src), plain.gen, s.special, True, req.prefixes(), s.start_id,
                                                     constraints=[()] * len(src)))
    np.testing.assert_array_equal(got.ids, want.ids)
    np.testing.assert_array_equal(got.scores, want.scores)
    np.testing.assert_array_equal(got.token_scores, want.token_scores)
    assert got.unmet == [[]] * len(want.ids)


def test_prefix_length_penalty_min_new_tokens_and_token_scores(ort, model):
    """A target prefix stays the hypotheses' start (a phrase may run across it); min_new_tokens
    holds; each score is the length-penalized sum of the token scores."""
    s = ort
    src = batch(model[0], seed=4)
    plain = s.run(s.request(src, max_new_tokens=MAX_NEW, num_beams=3))
    prefix = [[5, 6], [], [9], []]
    terms = (((6, 7),), ((absent(plain.ids[1], src[1])[0],),), (), ((11,), (12,)))
    got = s.run(s.request(src, max_new_tokens=MAX_NEW, num_beams=3, num_return_sequences=2, target_prefix=prefix,
                          constraints=terms, length_penalty=0.7, min_new_tokens=6, return_scores=True,
                          return_token_scores=True))
    assert_met(got, terms, n=2)
    pad = model[0].config.pad_token_id
    for r, ids in enumerate(got.ids):
        p = prefix[r // 2]
        assert ids[:len(p)].tolist() == p
        n = int((ids != pad).sum()) - len(p)  # new tokens, end-of-sentence included
        assert n >= 7  # 6 new tokens and end-of-sentence at least
        np.testing.assert_allclose(got.token_scores[r].sum() / n ** 0.7, got.scores[r], rtol=1e-5)


def test_a_constraint_that_cannot_fit_is_reported_never_dropped(ort, model):
    """Phrases of 5 tokens in all within 4 new tokens: no hypothesis meets them; the ones returned
    are the best found (most phrases met), ran to the length limit (an unmet hypothesis may not
    end), and say which phrases they miss. The other source is unaffected."""
    s = ort
    src = batch(model[0], seed=5)[:2]
    terms = (((20, 21, 22), (23, 24)), ((30,),))
    got = s.run(s.request(src, max_new_tokens=4, num_beams=3, num_return_sequences=3, constraints=terms,
                          return_scores=True))
    eos = model[0].config.eos_token_id
    for r in range(3):
        ids = got.ids[r].tolist()
        assert got.unmet[r] and all(not contains(ids, terms[0][i]) for i in got.unmet[r])
        assert all(contains(ids, terms[0][i]) for i in set(range(2)) - set(got.unmet[r]))
        assert len(ids) == 4 and eos not in ids
    assert len(got.unmet[0]) == 1  # the best meets one of the two
    assert_met(got.rows(3, 6), terms[1:], n=3)


def test_end_of_sentence_is_masked_until_every_phrase_is_met():
    """The rule itself, on one step of made-up logits where end-of-sentence is best: the source
    with a phrase to meet cannot end (its phrase takes a beam); the one without ends at once."""
    special = Special(pad=5, eos=0, blocked=(5,), vocab=6)
    gen = GenerationConfig(max_new_tokens=6, num_beams=2)
    search = ConstrainedBeamSearch(2, gen, special, constraints=[((3,),), ()])
    logits = np.tile(np.array([4.0, 1.0, 0.5, 0.0, 0.2, 0.0], np.float32), (4, 1))
    tokens, beam_idx = search.advance(0, logits.argmax(1), logits)
    assert search.finished.tolist() == [[False, False], [True, False]]
    assert not search.pooled.any()  # no hypothesis ended with its phrase unmet
    assert 3 in search.running[0, :, 0]  # the term took a beam
    assert tokens is not None and len(tokens) == 4


def test_constraints_are_checked_at_the_request(ort, model):
    s = ort
    src = batch(model[0])
    bad = [
        ([((5,),)], "1 entries for 4 sources"),
        ([((5,),), (), ((53,),), ()], "outside the target vocabulary"),
        ([((5,),), ((),), (), ()], "is empty"),
        ([((5,),), (), ((0,),), ()], "never generated"),  # end-of-sentence
        ([((5,),), (), (tuple(range(2, 20)),), ()], "more than max_new_tokens 14"),
        ([("hello",), (), (), ()], "expected a list of token ids"),
        ("5 6", "must be a list of phrase lists"),
    ]
    for constraints, said in bad:
        with pytest.raises(SettingError, match=said) as e:
            s.request(src, max_new_tokens=MAX_NEW, constraints=constraints)
        assert "constraints" in e.value.settings and "constraints" in str(e.value)
    with pytest.raises(SettingError, match="beam search: not with do_sample"):
        s.request(src, max_new_tokens=MAX_NEW, do_sample=True, constraints=[((5,),), (), (), ()])
    assert s.request(src, max_new_tokens=MAX_NEW, constraints=[(), (), (), ()]).constraints is None  # none given
