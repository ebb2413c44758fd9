"""Models users trained from their own code deploy with greedy parity to that code's own decoding:
PyTorch's nn.Transformer tutorial (post- / pre-LN, ReLU / GELU, sequence- / batch-first) and the
seed tutorials 003 (d2l) and 004 (nanoGPT), each trained a few hundred steps, exported with no
--arch (recognised from the keys), decoded batched and padded on ONNX Runtime and compared with
the model's own uncached greedy loop on each source alone.
"""
import json
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import xform
from tests import seed_modules as sm
from tests import torch_nn_modules as tn
from tests.test_tokenizer_spec import assert_round_trip
from tests.training import train
from xform.cli import main
from xform.exporter.export import export_bundle
from xform.models.backend import TorchBackend
from xform.models.importers import resolve_model
from xform.runtime.compare import tolerance_for
from xform.runtime.session import Session
from xform.runtime.text.translator import Translator

SRC_V, TGT_V, MAX_NEW = 37, 41, 10
LENGTHS = [7, 3, 6, 5, 2, 4]


@dataclass
class Case:
    make: Callable[[], torch.nn.Module]
    forward: Callable  # (model, src, tgt_in) -> logits, for training
    greedy: Callable  # (model, src_row, bos, eos, pad, max_new) -> (ids, logits)
    ids: dict[str, int]  # pad, bos, eos
    hparams: dict[str, Any]
    shared_vocab: bool = False


def nn_case(norm_first, activation, batch_first):
    return Case(lambda: tn.Seq2SeqTransformer(2, 3, 48, 3, SRC_V, TGT_V, dim_feedforward=72, dropout=0.0,
                                              norm_first=norm_first, activation=activation, batch_first=batch_first),
                lambda m, s, t: m.seq2seq(s, t), tn.tutorial_greedy, dict(pad=1, bos=2, eos=3),
                dict(n_heads=3, bos_id=2, eos_id=3, norm_first=norm_first or None, activation=activation))


def make004(bias):
    """Its N(0, 0.02) init leaves the token table drowned by the sinusoids for the first thousand
    steps; a N(0, 1) table learns the task in 250."""
    model = sm.Transformer004(sm.Config004(SRC_V, 64, 2, 3, 48, bias=bias))
    torch.nn.init.normal_(model.transformer.wte.weight, std=1.0)
    return model


CASES = {
    "nn-post-relu-seq-first": nn_case(False, "relu", False),
    "nn-pre-gelu-batch-first": nn_case(True, "gelu", True),
    "nn-post-gelu-batch-first": nn_case(False, "gelu", True),
    "nn-pre-relu-seq-first": nn_case(True, "relu", False),
    # query_size 12 x 3 heads = 36, not d_model 48: the notebook's widths are free
    "seed-003": Case(lambda: sm.Transformer003(SRC_V, TGT_V, 48, 12, 3, 72, 2, 3), lambda m, s, t: m(s, t),
                     sm.tutorial_greedy, dict(pad=0, bos=1, eos=2), dict(n_heads=3, bos_id=1, eos_id=2)),
    "seed-004": Case(lambda: make004(bias=False), lambda m, s, t: m(s, t),
                     sm.tutorial_greedy, dict(pad=0, bos=1, eos=2), dict(n_heads=3, bos_id=1, eos_id=2), shared_vocab=True),
    "seed-004-bias": Case(lambda: make004(bias=True), lambda m, s, t: m(s, t), sm.tutorial_greedy, dict(pad=0, bos=1, eos=2),
                          dict(n_heads=3, bos_id=1, eos_id=2), shared_vocab=True),
}
KIND = {name: "torch-nn-transformer" if name.startswith("nn-") else name[:8] for name in CASES}


def trained(name, seed=0):
    case = CASES[name]
    torch.manual_seed(seed)
    model = case.make()
    tgt_v = SRC_V if case.shared_vocab else TGT_V
    return train(model, lambda s, t: case.forward(model, s, t), SRC_V, tgt_v, steps=250, seed=seed, **case.ids)


def sources(case, seed=4):
    rng = np.random.default_rng(seed)
    allowed = [i for i in range(SRC_V) if i not in case.ids.values()]
    return [[int(x) for x in rng.choice(allowed, n)] for n in LENGTHS]


def padded(rows, pad):
    src = np.full((len(rows), max(map(len, rows))), pad, np.int64)
    for i, r in enumerate(rows):
        src[i, :len(r)] = r
    return src


def parity(model, case, session, tol) -> tuple[np.ndarray, np.ndarray, float]:
    """(batched tokens, the reference's, worst logit error beyond tolerance: <= 0 passes), where the
    logits are the session's teacher-forced on the reference tokens."""
    rows = sources(case)
    src = padded(rows, case.ids["pad"])
    got = session.generate(src, max_new_tokens=MAX_NEW)[:, :MAX_NEW]
    want = np.full((len(rows), MAX_NEW), case.ids["pad"], np.int64)
    refs = []
    for i, r in enumerate(rows):
        ids, logits = case.greedy(model, r, case.ids["bos"], case.ids["eos"], case.ids["pad"], MAX_NEW)
        want[i, :len(ids)] = ids
        refs.append(logits.numpy())
    _, ours = session.teacher_forced(src, None, want)
    excess = -np.inf
    for i, ref in enumerate(refs):
        scale = np.abs(ref).max(-1, keepdims=True)
        err = np.abs(ours[i, :len(ref)] - ref) - (tol.atol + tol.rtol * scale)
        excess = max(excess, float(err.max()))
    full = np.full_like(want, case.ids["pad"])
    full[:, :got.shape[1]] = got  # generation stops when every row has ended
    return full, want, excess


@pytest.fixture(scope="module")
def users(tmp_path_factory):
    """name -> (trained model, state dict path, fp32 bundle, fp16 bundle), exported without --arch."""
    out = {}
    for name, case in CASES.items():
        d = tmp_path_factory.mktemp(name)
        model = trained(name)
        torch.save(model.state_dict(), d / "model.pt")
        hp = {k: v for k, v in case.hparams.items() if v is not None}
        b32 = export_bundle(d / "model.pt", d / "fp32", hparams=hp).path
        b16 = export_bundle(d / "model.pt", d / "fp16", precision="fp16", hparams=hp).path
        out[name] = (model, d / "model.pt", b32, b16)
    return out


@pytest.mark.parametrize("name", sorted(CASES))
def test_ort_greedy_equals_the_models_own_loop(users, name):
    model, _, b32, b16 = users[name]
    case = CASES[name]
    assert json.loads((b32 / "manifest.json").read_text())["model"]["source"]["kind"] == KIND[name]
    got, want, excess = parity(model, case, xform.load(b32, backend="ort"), tolerance_for("fp32"))
    np.testing.assert_array_equal(got, want)
    assert excess <= 0, f"fp32 logits beyond tolerance by {excess:.3g}"
    assert len({tuple(r) for r in want.tolist()}) > 3, "outputs do not depend on the input"
    assert (want == case.ids["eos"]).any(axis=1).mean() >= 0.5, "training did not take: no end-of-sentence"
    _, _, excess16 = parity(model, case, xform.load(b16, backend="ort"), tolerance_for("fp16"))
    assert excess16 <= 0, f"fp16 logits beyond tolerance by {excess16:.3g}"


# Each mapping, mutated, must fail the parity check: the tests above can fail.
MUTATIONS = {
    "nn-pre-gelu-batch-first": [dict(final_norm=False), dict(norm_position="post"), dict(scale_embedding=False)],
    "nn-post-relu-seq-first": [dict(final_norm=False), dict(norm_position="pre"), dict(scale_embedding=False),
                               dict(activation="gelu")],
    "seed-003": [dict(norm_position="pre"), dict(scale_embedding=False)],
    "seed-004": [dict(final_norm=False), dict(encoder_norm_positions=("pre", "pre"), decoder_norm_positions=("pre",) * 3),
                 dict(decoder_norm_positions=("pre_normed_residual", "pre_normed_residual", "pre"))],
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_mutated_mapping_fails_parity(users, name):
    model, path, _, _ = users[name]
    case = CASES[name]
    hp = {k: v for k, v in case.hparams.items() if v is not None}
    loaded = resolve_model(path, None, hp)
    ok = parity(model, case, Session(TorchBackend(loaded.model), loaded.model.cfg), tolerance_for("fp32"))
    assert (ok[0] == ok[1]).all() and ok[2] <= 0
    for change in MUTATIONS[name]:
        from xform.models.checkpoint import canonical_state, load_state_into
        from xform.models.transformer import Seq2SeqTransformer

        cfg = loaded.model.cfg.replace(**change)
        mutant = Seq2SeqTransformer(cfg)
        state = {k: v for k, v in canonical_state(loaded.model).items() if k in canonical_state(mutant)}
        for k, v in canonical_state(mutant).items():  # a dropped final norm has no weights; an added one, ones
            state.setdefault(k, v)
        load_state_into(mutant, state, "mutant")
        got, want, excess = parity(model, case, Session(TorchBackend(mutant), cfg), tolerance_for("fp32"))
        assert excess > 0, f"{name}: mapping mutated by {change} still passes"


SPECIALS = ["<unk>", "<pad>", "<bos>", "<eos>"]  # the nn.Transformer tutorial's ids 0..3


def test_text_in_and_out_with_the_users_json_vocabularies(users, tmp_path):
    """torchtext's get_itos() list for the source, a token -> id dict for the target, whitespace
    words, the tutorial's <bos> ... <eos> source framing: `run --text` equals the model's own loop."""
    model, path, _, _ = users["nn-post-relu-seq-first"]
    src_itos = SPECIALS + [f"w{i}" for i in range(4, SRC_V)]
    tgt_stoi = {t: i for i, t in enumerate(SPECIALS + [f"T{i}" for i in range(4, TGT_V)])}
    (tmp_path / "src.json").write_text(json.dumps(src_itos))
    (tmp_path / "tgt.json").write_text(json.dumps(tgt_stoi))
    args = ["export", str(path), "-o", str(tmp_path / "b"), "--n-heads", "3", "--bos-id", "2", "--eos-id", "3",
            "--src-vocab", str(tmp_path / "src.json"), "--tgt-vocab", str(tmp_path / "tgt.json"), "--src-bos"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert assert_round_trip(tmp_path / "b").to_json() == {  # tokenizer.json as vocab.py wrote it before the spec
        "kind": "xform-vocab", "source": {"unit": "word", "tokens": src_itos, "unk": "<unk>"},
        "target": {"unit": "word", "tokens": list(tgt_stoi), "unk": "<unk>"}, "source_prefix": [2]}
    texts = ["w5 w9 w30 w12", "w7 w8", "w20 w21 w22 w23 w24 w25", "w6 nope w33"]
    r = CliRunner().invoke(main, ["run", str(tmp_path / "b"), "--max-new-tokens", str(MAX_NEW),
                                  *[a for t in texts for a in ("--text", t)]])
    assert r.exit_code == 0, r.output
    itos = {i: t for t, i in tgt_stoi.items()}
    for text, line in zip(texts, r.output.strip().splitlines()):
        ids = [2] + [src_itos.index(w) if w in src_itos else 0 for w in text.split()] + [3]
        ref, _ = tn.tutorial_greedy(model, ids, 2, 3, 1, MAX_NEW)
        assert line == f"{text}\t{' '.join(itos[i] for i in ref if i not in (1, 2, 3))}"
    assert len(set(r.output.splitlines())) == len(texts)


def spm_model(path, lines, size):
    import io

    import sentencepiece as spm
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=size,
                                   hard_vocab_limit=False, minloglevel=2)
    path.write_bytes(buf.getvalue())
    return spm.SentencePieceProcessor(model_file=str(path))


def test_text_in_and_out_with_sentencepiece_models(users, tmp_path):
    model, path, _, _ = users["nn-pre-relu-seq-first"]
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefgh"), rng.integers(2, 6))) for _ in range(400)]
    lines = [" ".join(rng.choice(words, 6)) for _ in range(200)]
    src_sp = spm_model(tmp_path / "src.model", lines, 30)
    tgt_sp = spm_model(tmp_path / "tgt.model", [line.upper() for line in lines], 40)
    out = tmp_path / "b"
    from xform.exporter.export import export_bundle
    from xform.models.vocab import VocabFiles
    hp = {k: v for k, v in CASES["nn-pre-relu-seq-first"].hparams.items() if v is not None}  # norm_first
    export_bundle(path, out, hparams=hp, vocab=VocabFiles(tmp_path / "src.model", tmp_path / "tgt.model"))
    assert assert_round_trip(out).to_json() == {"kind": "xform-vocab", "source": {"unit": "spm", "model": "source.model"},
                                                "target": {"unit": "spm", "model": "target.model"}}
    session = xform.load(out, backend="ort")
    texts = lines[:5]
    got = Translator(session).translate(texts, max_new_tokens=MAX_NEW)
    for text, g in zip(texts, got):
        ref, _ = tn.tutorial_greedy(model, src_sp.encode(text) + [3], 2, 3, 1, MAX_NEW)
        assert g == tgt_sp.decode([i for i in ref if i not in (1, 2, 3)])
    assert len(set(got)) > 1


@pytest.mark.parametrize("files, fragment", [
    (("src.json", "big.json"), "--tgt-vocab .*big.json: 50 tokens, but the model's target embedding has 41 rows"),
    (("t41.json", "s37.json"), "--src-vocab .*t41.json has 41 tokens, the rows of the model's target embedding, "
                               "and --tgt-vocab .*s37.json has 37, the source's: the two look swapped"),
    (("bad.json", "src.json"), "--src-vocab .*bad.json: not a JSON vocabulary"),
    (("dupe.json", "src.json"), "--src-vocab .*dupe.json: id 4 is given to both 'a' and 'b'"),
    (("src.json", "src.model"), "--tgt-vocab .*src.model: not a sentencepiece model"),
])
def test_bad_vocabularies_are_refused_by_name(users, tmp_path, files, fragment):
    _, path, _, _ = users["nn-post-relu-seq-first"]
    (tmp_path / "src.json").write_text(json.dumps(SPECIALS + [f"w{i}" for i in range(4, SRC_V)]))
    (tmp_path / "big.json").write_text(json.dumps([f"t{i}" for i in range(50)]))
    (tmp_path / "t41.json").write_text(json.dumps(SPECIALS + [f"T{i}" for i in range(4, TGT_V)]))
    (tmp_path / "s37.json").write_text(json.dumps(SPECIALS + [f"w{i}" for i in range(4, SRC_V)]))
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "dupe.json").write_text(json.dumps({"a": 4, "b": 4}))
    (tmp_path / "src.model").write_bytes(b"not a model")
    from xform.errors import CheckpointError
    from xform.exporter.export import export_bundle
    from xform.models.vocab import VocabFiles
    with pytest.raises(CheckpointError, match=fragment):
        export_bundle(path, tmp_path / "b", hparams=dict(n_heads=3, bos_id=2, eos_id=3),
                      vocab=VocabFiles(*(tmp_path / f for f in files)))
    assert not (tmp_path / "b").exists()


NN_FLAGS = ["--n-heads", "3", "--bos-id", "2", "--eos-id", "3"]


def test_the_default_cap_stops_a_model_that_never_ends(users, tmp_path):
    """A tutorial model keeps PositionalEncoding's 5,000 positions; one that never yields
    end-of-sentence stops at 256 new tokens by default, not at 5,000."""
    _, path, _, _ = users["nn-post-relu-seq-first"]
    state = torch.load(path)
    state["generator.bias"][3] = -1e4  # end-of-sentence never wins
    torch.save(state, tmp_path / "never.pt")
    export = ["export", str(tmp_path / "never.pt"), *NN_FLAGS]
    r = CliRunner().invoke(main, [*export, "-o", str(tmp_path / "b")])
    assert r.exit_code == 0, r.output
    assert ("decoding stops after 256 new tokens unless end-of-sentence comes first: xform's default 256"
            in r.output), r.output
    session = xform.load(tmp_path / "b")
    assert session.config.max_len == 5000
    src = padded(sources(CASES["nn-post-relu-seq-first"])[:3], 1)
    out = session.generate(src)
    assert out.shape == (3, 256) and not (out == 3).any()
    assert session.generate(src, max_new_tokens=7).shape == (3, 7)  # a run's own limit wins
    r = CliRunner().invoke(main, [*export, "-o", str(tmp_path / "b40"), "--max-new-tokens", "40"])
    assert "decoding stops after 40 new tokens unless end-of-sentence comes first: set at export" in r.output
    assert xform.load(tmp_path / "b40").generate(src).shape == (3, 40)
    r = CliRunner().invoke(main, [*export, "-o", str(tmp_path / "b6000"), "--max-new-tokens", "6000"])
    assert r.exit_code == 1 and "--max-new-tokens 6000: expected 1 to the model's max_len 5000" in r.output
    assert not (tmp_path / "b6000").exists()


CHARS = list("abcdefghijklmnopqrstuvwxyz0123456")  # 33 characters: with the 4 specials, SRC_V
TCHARS = list("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!")  # 37: TGT_V


def test_export_reports_how_text_is_split_and_infers_characters(users, tmp_path):
    """Single-character vocabularies are split into characters without --tokenize, export says
    so with a sample, and run --text equals the model's own loop on those ids."""
    model, path, _, _ = users["nn-post-relu-seq-first"]
    (tmp_path / "src.json").write_text(json.dumps(SPECIALS + CHARS))
    (tmp_path / "tgt.json").write_text(json.dumps(SPECIALS + TCHARS))
    vocab = ["--src-vocab", str(tmp_path / "src.json"), "--tgt-vocab", str(tmp_path / "tgt.json"), "--src-bos"]
    r = CliRunner().invoke(main, ["export", str(path), "-o", str(tmp_path / "b"), *NN_FLAGS, *vocab])
    assert r.exit_code == 0, r.output
    assert ("--src-vocab src.json: split into characters, inferred: 100% of its 33 plain tokens are single "
            "characters (--tokenize whitespace to override)") in r.output
    assert ("text in: characters of a 37-token vocabulary, then end-of-sentence <eos> (id 3); start-of-sentence "
            "<bos> (id 2) first") in r.output
    assert "text out: characters of a 41-token vocabulary, joined with nothing" in r.output
    assert "sample: 'abcdefgh' -> <bos> a b c d e f g h <eos> (ids 2 4 5 6 7 8 9 10 11 3)" in r.output
    assert "warning" not in r.output
    texts = ["hello", "abc def", "zz9"]
    r = CliRunner().invoke(main, ["run", str(tmp_path / "b"), "--max-new-tokens", str(MAX_NEW),
                                  *[a for t in texts for a in ("--text", t)]])
    assert r.exit_code == 0, r.output
    for text, line in zip(texts, r.output.strip().splitlines()):
        ids = [2] + [4 + CHARS.index(c) if c in CHARS else 0 for c in text if c != " "] + [3]  # 0: <unk>
        ref, _ = tn.tutorial_greedy(model, ids, 2, 3, 1, MAX_NEW)
        assert line == f"{text}\t{''.join((SPECIALS + TCHARS)[i] for i in ref if i not in (1, 2, 3))}"
    # told to split on whitespace, the export warns that the words will be unknown
    r = CliRunner().invoke(main, ["export", str(path), "-o", str(tmp_path / "w"), *NN_FLAGS, *vocab,
                                  "--tokenize", "whitespace"])
    assert r.exit_code == 0 and ("warning: --src-vocab src.json: --tokenize whitespace, but 100% of its 33 plain "
                                 "tokens are single characters") in r.output, r.output


def test_vocabularies_that_do_not_fit_the_models_roles_are_warned_of(users, tmp_path):
    _, path, _, _ = users["nn-post-relu-seq-first"]
    (tmp_path / "src.json").write_text(json.dumps(["<unk>", "<pad>", "<eos>", "<bos>"] + [f"w{i}" for i in range(4, 30)]))
    (tmp_path / "tgt.json").write_text(json.dumps(SPECIALS + [f"T{i}" for i in range(4, TGT_V)]))
    r = CliRunner().invoke(main, ["export", str(path), "-o", str(tmp_path / "b"), *NN_FLAGS,
                                  "--src-vocab", str(tmp_path / "src.json"), "--tgt-vocab", str(tmp_path / "tgt.json")])
    assert r.exit_code == 0, r.output
    warnings = [line for line in r.output.splitlines() if line.startswith("warning:")]
    assert any("--src-vocab src.json: '<bos>' is id 3, but the model's bos_id is 2 (--bos-id)" in w for w in warnings)
    assert any("--src-vocab src.json: '<eos>' is id 2, but the model's eos_id is 3 (--eos-id)" in w for w in warnings)
    assert any("--src-vocab src.json: 30 tokens for the source embedding's 37 rows" in w for w in warnings)
    assert not any("tgt.json" in w for w in warnings), warnings


def test_a_wrong_arch_names_the_layout_the_file_matches(users, tmp_path):
    _, path, _, _ = users["seed-003"]
    r = CliRunner().invoke(main, ["export", str(path), "-o", str(tmp_path / "b"), "--arch", "torch-nn-transformer",
                                  "--n-heads", "3", "--bos-id", "1", "--eos-id", "2"])
    assert r.exit_code == 1, r.output
    assert "its keys are a seed-003 model's; pass --arch seed-003, or leave --arch out" in r.output, r.output
