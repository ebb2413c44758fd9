"""Translator.translate_lines as a production engine reads a file: windows read ahead, sorted by
source length, batched by examples or by tokens, results in input order, bad lines failing alone."""
import numpy as np
import pytest

import xform
from xform.errors import InputError
from xform.runtime.scheduling.batching import Batching, plan
from xform.runtime.text.translator import Translator

MAX_NEW = 24


@pytest.fixture(scope="module")
def demo(demo_bundle):
    return xform.load(demo_bundle, backend="ort")


@pytest.fixture
def decoded(demo, monkeypatch):
    """The source lengths of every batch demo.run decodes (the translator's requests), in the order it runs them."""
    batches = []
    original = demo.run

    def spy(request, *args, **kwargs):
        batches.append((request.src_ids.shape, [int(n) for n in request.src_lengths]))
        return original(request, *args, **kwargs)

    monkeypatch.setattr(demo, "run", spy)
    return batches


def numbers(n: int, seed: int = 0) -> list[str]:
    """Numbers of 1 to 12 digits (2 to 13 source tokens with end-of-sentence), lengths mixed."""
    rng = np.random.default_rng(seed)
    return ["".join(map(str, [rng.integers(1, 10), *rng.integers(0, 10, k - 1)])) for k in rng.integers(1, 13, n)]


def with_bad_lines(lines: list[str]) -> list:
    """`lines` with a blank, a whitespace-only, a non-UTF-8, an out-of-vocabulary and a too-long line among them."""
    out = list(lines)
    for at, bad in [(3, ""), (9, "   "), (14, b"\xff\xfe 12"), (20, "1x2"), (27, "9" * 32)]:
        out.insert(at, bad)
    return out


def alone(demo, line) -> list[str]:
    return Translator(demo).translate([line], max_new_tokens=MAX_NEW)


def triple(result):
    """A LineResult as (text, translations or None, error or None)."""
    return result.text, None if result.error is not None else result.hypotheses, result.error


def check_results(demo, lines, results):
    """Input order; each translation that of its line alone; bad lines failed alone, blank ones blank."""
    assert len(results) == len(lines)
    for line, (text, targets, error) in zip(lines, map(triple, results)):
        if isinstance(line, bytes):
            assert text == "\ufffd\ufffd 12" and targets is None and error.startswith("not UTF-8")
        elif not line.strip():
            assert (text, targets, error) == (line, [""], None)
        elif line == "1x2":
            assert targets is None and "'x' is not in the source vocabulary" in error
        elif len(line) == 32:
            assert targets is None and "more than the model's max_len 32" in error
        else:
            assert (text, targets, error) == (line, alone(demo, line), None)


@pytest.fixture
def no_unk(demo, monkeypatch):
    monkeypatch.setattr(demo.tokenizer.src, "unk", None)


@pytest.mark.usefixtures("no_unk")
@pytest.mark.parametrize("batching", [dict(batch_size=4, read_ahead=2), dict(batch_size=5, read_ahead=1),
                                      dict(batch_type="tokens", max_batch_tokens=40, read_ahead=3)])
def test_results_come_in_input_order_each_as_its_line_alone(demo, batching):
    lines = with_bad_lines(numbers(60))
    results = list(Translator(demo).translate_lines(lines, demo.generation_config(MAX_NEW), Batching(**batching)))
    check_results(demo, lines, results)


@pytest.mark.usefixtures("no_unk")
def test_a_window_is_sorted_longest_first_and_cut_into_batch_size_lines(demo, decoded):
    lines = with_bad_lines(numbers(60, seed=1))
    list(Translator(demo).translate_lines(lines, demo.generation_config(MAX_NEW), Batching(batch_size=4, read_ahead=3)))
    window = 12  # read_ahead 3 x batch_size 4 lines, the bad and blank ones included
    expected = []
    for w in range(0, len(lines), window):
        good = [len(x) + 1 for x in lines[w:w + window] if isinstance(x, str) and x.strip() and x.isdigit()
                and len(x) < 32]
        good.sort(reverse=True)
        expected += [good[i:i + 4] for i in range(0, len(good), 4)]
    assert [lengths for _, lengths in decoded] == expected
    assert all(shape == (len(lengths), lengths[0]) for shape, lengths in decoded)


def padded(batches) -> int:
    return sum(rows * width for (rows, width), _ in batches)


def test_token_batches_stay_within_max_batch_tokens_and_pad_less_than_file_order(demo, decoded):
    lines = numbers(80, seed=2) + ["9" * 31] + numbers(20, seed=3)  # 32 tokens: more than 20, runs alone
    expected = [alone(demo, x) for x in lines]
    decoded.clear()
    results = list(Translator(demo).translate_lines(lines, demo.generation_config(MAX_NEW),
                                        Batching("tokens", max_batch_tokens=20, read_ahead=4)))
    assert [r.hypotheses for r in results] == expected
    sorted_batches = list(decoded)
    assert ((1, 32), [32]) in sorted_batches
    for (rows, width), lengths in sorted_batches:
        assert rows * width <= 20 or rows == 1, (rows, width)
        assert lengths == sorted(lengths, reverse=True)
    assert sum(len(lengths) for _, lengths in sorted_batches) == len(lines)
    in_order = [[]]  # the same limit on consecutive lines, unsorted
    for x in lines:
        batch = in_order[-1] + [len(x) + 1]
        if in_order[-1] and len(batch) * max(batch) > 20:
            in_order.append([len(x) + 1])
        else:
            in_order[-1] = batch
    real = sum(len(x) + 1 for x in lines)
    padding, file_order_padding = padded(sorted_batches) - real, sum(len(b) * max(b) for b in in_order) - real
    assert 2 * padding < file_order_padding and len(sorted_batches) < len(in_order)  # 32 vs 103, 57 vs 65


def test_a_window_is_read_ahead_batches_worth_and_no_more(demo):
    consumed = []

    def lines():
        for x in numbers(400, seed=4):
            consumed.append(x)
            yield x

    gen = demo.generation_config(MAX_NEW)
    next(Translator(demo).translate_lines(lines(), gen, Batching(batch_size=8, read_ahead=5)))
    assert len(consumed) == 40
    consumed.clear()
    next(Translator(demo).translate_lines(lines(), gen, Batching("tokens", max_batch_tokens=30, read_ahead=2)))
    tokens = [len(x) + 1 for x in consumed]
    assert sum(tokens) >= 60 and sum(tokens[:-1]) < 60  # the window closed on reaching 2 x 30 tokens


@pytest.mark.usefixtures("no_unk")
def test_on_batch_counts_every_line_and_the_generated_tokens(demo):
    calls = []
    lines = with_bad_lines(numbers(30, seed=5))
    results = list(map(triple, Translator(demo).translate_lines(lines, demo.generation_config(MAX_NEW), Batching(batch_size=6),
                                                    on_batch=lambda n, tokens: calls.append((n, tokens)))))
    assert sum(n for n, _ in calls) == len(lines)
    words = sum(len(t[0].split()) + 1 for _, t, e in results if t and t[0])  # a word a token, plus end-of-sentence
    assert sum(tokens for _, tokens in calls) == words
    assert calls[-1][1] == 0 and calls[-1][0] == 5  # the lines done without decoding


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(batch_size=0), "batch_size must be an integer >= 1"),
    (dict(read_ahead=0), "read_ahead must be an integer >= 1"),
    (dict(batch_type="words"), "must be examples or tokens, got 'words'"),
    (dict(batch_type="tokens"), "batch_type tokens needs max_batch_tokens"),
    (dict(batch_type="tokens", max_batch_tokens=0), "max_batch_tokens must be an integer >= 1"),
    (dict(max_batch_tokens=64), "max_batch_tokens goes with batch_type tokens"),
])
def test_bad_batching_fails_at_the_call(demo, kwargs, fragment):
    with pytest.raises(InputError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        Translator(demo).translate_lines(["12"], demo.generation_config(MAX_NEW), Batching(**kwargs))


def test_plan_ties_keep_input_order_and_batch_size_also_limits_token_batches():
    lengths = [3, 5, 3, 9, 5, 3]
    assert plan(lengths, Batching(batch_size=2)) == [[3, 1], [4, 0], [2, 5]]
    assert plan(lengths, Batching("tokens", max_batch_tokens=15)) == [[3], [1, 4, 0], [2, 5]]
    assert plan(lengths, Batching("tokens", 2, max_batch_tokens=15)) == [[3], [1, 4], [0, 2], [5]]
    assert plan([40, 2, 2], Batching("tokens", max_batch_tokens=8)) == [[0], [1, 2]]


def test_plan_counts_decoder_rows_lines_x_beams():
    """A token budget alone let short lines at beam 4 fill 1,024 rows; rows are counted as lines x
    the rows each decodes, a single line always runs."""
    from xform.runtime.scheduling.batching import DEFAULT_MAX_ROWS
    short = [3] * 1000
    assert max(map(len, plan(short, Batching("tokens", max_batch_tokens=4096), per_line=4))) == DEFAULT_MAX_ROWS // 4
    assert [len(b) for b in plan(short[:10], Batching("tokens", max_batch_tokens=4096, max_rows=8), 4)] == [2] * 5
    assert plan([5, 5], Batching(max_rows=3), per_line=4) == [[0], [1]]  # more rows than the limit: alone
    assert plan([5, 5, 5], Batching(batch_size=2, max_rows=100), per_line=4) == [[0, 1], [2]]  # lines still limit


def test_a_file_of_short_lines_at_beam_4_stays_within_the_row_budget(demo, monkeypatch):
    """Memory is bounded by the plan: the backend never holds more decoder rows (its logits and K/V
    buffers are allocated per row) than --max-batch-rows, however short the lines and large the
    token budget; the translations are still each line's alone."""
    backend = demo.backend
    rows_seen = []
    original = backend.buffers

    def spy(R, S, positions=None):
        rows_seen.append(R)
        return original(R, S, positions)

    monkeypatch.setattr(backend, "buffers", spy)
    lines = [str(n) for n in range(1, 61)]  # 60 short lines: 2 or 3 source tokens each
    gen = demo.generation_config(MAX_NEW, num_beams=4)
    results = list(map(triple, Translator(demo).translate_lines(lines, gen, Batching("tokens", max_batch_tokens=10_000,
                                                                         max_rows=24))))
    assert rows_seen and max(rows_seen) <= 24, rows_seen
    assert backend.logits_buf is None or backend.logits_buf.shape[0] <= 24
    for line, (_, targets, error) in zip(lines[:8], results):
        assert error is None and targets == Translator(demo).translate([line], max_new_tokens=MAX_NEW, num_beams=4)


def test_a_bad_row_limit_fails_at_the_call(demo):
    with pytest.raises(InputError, match=r"max_rows must be an integer >= 1"):
        Translator(demo).translate_lines(["12"], demo.generation_config(MAX_NEW), Batching(max_rows=0))
