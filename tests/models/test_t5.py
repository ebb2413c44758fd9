"""The T5 family (T5 / Flan-T5: relu, tied and scaled output; T5 v1.1 / mT5 / MADLAD-400: gated-gelu,
untied) imported from directories transformers itself saves: tiny models whose sizes differ on
every axis (num_heads x d_kv != d_model, encoder and decoder depths, a vocabulary of no round
size) and whose relative position bias has few buckets and a short max distance, so that the test
sources and targets run past it; trained briefly on a task whose output depends on the source.
Batched, padded decoding on ONNX Runtime equals transformers' `generate` token for token (greedy,
beams 2 and 4); teacher-forced logits agree within the fp32 tolerance; each mapping, mutated,
breaks that; fp16 and int8 exports verify.
"""
import json
import shutil

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import xform
from xform.cli import main
from xform.errors import CheckpointError, ConfigError
from xform.exporter.export import export_bundle
from xform.models import position_bias
from xform.models.importers import resolve_model
from xform.runtime.compare import tolerance_for

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")

V, PAD, EOS, FIRST = 53, 0, 1, 3  # T5: pad 0 (also the decoder start), eos 1, unk 2
WORDS = 23  # sources and targets use ids FIRST .. FIRST + WORDS - 1: fewer to learn in a brief training
MAX_DISTANCE = 10  # test sources and targets of up to 14 tokens pass it
MAX_NEW = 18
COMMON = dict(vocab_size=V, d_model=40, d_kv=12, num_heads=3, d_ff=56, num_layers=2, num_decoder_layers=3,
              relative_attention_num_buckets=8, relative_attention_max_distance=MAX_DISTANCE, dropout_rate=0.0,
              pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD, initializer_factor=0.5)
KINDS = {  # T5 / Flan-T5, and T5 v1.1 / mT5 / MADLAD-400
    "t5": ("T5Config", dict(feed_forward_proj="relu", tie_word_embeddings=True)),
    "mt5": ("MT5Config", dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
}


def target(src_row):
    """Each source token mapped to another, in order, then end-of-sentence."""
    return [FIRST + (5 * (s - FIRST) + 2) % WORDS for s in src_row] + [EOS]


def train(model, steps=500, seed=0):
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=4e-3)
    model.train()
    for _ in range(steps):
        n = int(rng.integers(2, 15))
        src = rng.integers(FIRST, FIRST + WORDS, (24, n))
        labels = np.array([target(list(r)) for r in src])
        src = np.concatenate([src, np.full((24, 1), EOS)], 1)
        loss = model(input_ids=torch.from_numpy(src), labels=torch.from_numpy(labels)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def make(kind, seed=0):
    cfg_name, extra = KINDS[kind]
    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(getattr(transformers, cfg_name)(**{**COMMON, **extra}))
    return train(model)


def sources(seed=3, lengths=(14, 3, 11, 6)):
    """A right-padded batch of sources of different lengths, eos-terminated, the longest past
    the bias's max distance."""
    rng = np.random.default_rng(seed)
    src = np.full((len(lengths), max(lengths) + 1), PAD, np.int64)
    for i, n in enumerate(lengths):
        src[i, :n] = rng.integers(FIRST, FIRST + WORDS, n)
        src[i, n] = EOS
    return src


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One torch thread: on a shared 2-core machine two made each training step 50x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def t5(tmp_path_factory):
    """kind -> (transformers model, its directory, fp32 bundle)."""
    out = {}
    for kind in KINDS:
        d = tmp_path_factory.mktemp(kind)
        model = make(kind)
        model.save_pretrained(d / "hf")
        out[kind] = (model, d / "hf", export_bundle(d / "hf", d / "fp32").path)
    return out


def hf_generate(model, src, **kw):
    """transformers' ids without its decoder start, pad after end-of-sentence, MAX_NEW wide. (Its
    own cache is given: 4.57's default one has the encoder's depth, too few for a deeper decoder.)"""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache
    out = model.generate(torch.from_numpy(src), attention_mask=torch.from_numpy((src != PAD).astype(np.int64)),
                         max_new_tokens=MAX_NEW, do_sample=False, pad_token_id=PAD,
                         past_key_values=EncoderDecoderCache(DynamicCache(), DynamicCache()), **kw)[:, 1:].numpy()
    full = np.full((out.shape[0], MAX_NEW), PAD, np.int64)
    full[:, :out.shape[1]] = out
    # after end-of-sentence: pad (4.57's beam search fills a finished hypothesis with eos instead)
    full[np.cumsum(np.cumsum(full == EOS, axis=1), axis=1) > 1] = PAD
    return full


@pytest.mark.parametrize("kind", list(KINDS))
def test_ort_decoding_equals_transformers_generate(t5, kind):
    model, _, bundle = t5[kind]
    session = xform.load(bundle, backend="ort", threads=1)
    src = sources()
    for beams in (1, 2, 4):
        kw = dict(num_beams=beams, early_stopping=True, length_penalty=1.0)
        want = hf_generate(model, src, **kw)
        got = session.generate(src, max_new_tokens=MAX_NEW, **kw)
        full = np.full_like(want, PAD)
        full[:, :got.shape[1]] = got
        np.testing.assert_array_equal(full, want, err_msg=f"{kind} beams {beams}")
        if beams == 1:
            greedy = want
    # the task was learned, past the bias's max distance too: most target tokens right
    right = total = 0
    for row, out in zip(src, greedy):
        want = target([int(t) for t in row if t not in (PAD, EOS)])
        right += sum(int(a == b) for a, b in zip(out, want))
        total += len(want)
    assert right / total >= 0.4, f"the model did not learn the task ({right} of {total} tokens right)"


def eager_logits(model, src, dec_in):
    with torch.no_grad():
        return model(input_ids=torch.from_numpy(src), attention_mask=torch.from_numpy((src != PAD).astype(np.int64)),
                     decoder_input_ids=torch.from_numpy(dec_in)).logits.numpy()


def excess(got, ref, tol):
    """Worst |got - ref| beyond atol + rtol x the step's scale: <= 0 passes."""
    scale = np.abs(ref).max(-1, keepdims=True)
    return float((np.abs(got - ref) - (tol.atol + tol.rtol * scale)).max())


def teacher_forced_inputs(model):
    src = sources()
    return src, np.concatenate([np.full((len(src), 1), PAD), hf_generate(model, src)], 1)


@pytest.mark.parametrize("kind", list(KINDS))
def test_teacher_forced_logits_within_fp32_tolerance(t5, kind):
    model, _, bundle = t5[kind]
    src, dec_in = teacher_forced_inputs(model)
    ref = eager_logits(model, src, dec_in)[:, :-1]
    _, got = xform.load(bundle, backend="ort", threads=1).teacher_forced(src, None, dec_in[:, 1:])
    assert excess(got, ref, tolerance_for("fp32")) <= 0


def xform_logits(m, src, dec_in):
    with torch.no_grad():
        s = torch.from_numpy(src)
        return m.decode(torch.from_numpy(dec_in), m.encode(s, (s != PAD).sum(1)))[0].numpy()


def off_by_one(monkeypatch):
    real = position_bias.relative_bucket

    def shifted(distance, bidirectional, buckets, max_distance):
        return (real(distance, bidirectional, buckets, max_distance) + 1).clamp(max=buckets - 1)
    monkeypatch.setattr(position_bias, "relative_bucket", shifted)


def bidirectional_decoder(m):
    m.tgt_bias.buckets = m.src_bias.buckets.clone()


def unscaled_output(m):
    m.output_scale = None


def scaled_attention(m):
    for layer in (*m.encoder_layers, *m.decoder_layers):
        for attention in (layer.self_attn, getattr(layer, "cross_attn", None)):
            if attention is not None:
                attention.scale = attention.head_dim ** -0.5


MUTATIONS = {"bucket off by one": ("mt5", None), "bidirectional buckets in the decoder": ("mt5", bidirectional_decoder),
             "no output scaling": ("t5", unscaled_output), "1/sqrt(d) attention scaling": ("t5", scaled_attention)}


@pytest.mark.parametrize("name", list(MUTATIONS))
def test_each_mapping_mutated_breaks_parity(t5, name, monkeypatch):
    kind, mutate = MUTATIONS[name]
    model, directory, _ = t5[kind]
    src, dec_in = teacher_forced_inputs(model)
    ref = eager_logits(model, src, dec_in)
    tol = tolerance_for("fp32")
    assert excess(xform_logits(resolve_model(directory).model, src, dec_in), ref, tol) <= 0  # the mapping as built
    if mutate is None:
        off_by_one(monkeypatch)  # the bucket table is built with the model
    m = resolve_model(directory).model
    if mutate is not None:
        mutate(m)
    assert excess(xform_logits(m, src, dec_in), ref, tol) > 0, f"{name} left the logits within tolerance"


def test_buckets_equal_transformers_past_the_max_distance():
    from xform.config import TransformerConfig
    bucket = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket
    for buckets, max_distance in ((8, MAX_DISTANCE), (32, 128), (6, 4)):  # the tests', T5's, and a small one
        cfg = TransformerConfig(src_vocab_size=7, tgt_vocab_size=7, d_model=8, n_heads=2, positions="relative",
                                relative_attention_buckets=buckets, relative_attention_max_distance=max_distance)
        for bidirectional in (True, False):
            table = position_bias.RelativePositionBias(cfg, bidirectional)
            d = torch.arange(-4 * max_distance, 4 * max_distance + 1)
            index = d.clamp(-max_distance, max_distance) + max_distance
            want = bucket(d, bidirectional=bidirectional, num_buckets=buckets, max_distance=max_distance)
            assert torch.equal(table.buckets[index], want), (buckets, max_distance, bidirectional)


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_reduced_precision_exports_verify_and_decode(t5, tmp_path, precision):
    model, directory, _ = t5["mt5"]
    bundle = export_bundle(directory, tmp_path / precision, precision=precision)  # raises unless verified
    manifest = json.loads((bundle.path / "manifest.json").read_text())
    assert manifest["model"]["config"]["fp32_ffn_output"] is True
    src = sources()
    got = xform.load(bundle.path, backend="ort", threads=1).generate(src, max_new_tokens=MAX_NEW)
    want = hf_generate(model, src)
    full = np.full_like(want, PAD)
    full[:, :got.shape[1]] = got
    assert (full == want).mean() >= 0.9


def test_config_maps_each_difference(t5):
    cfg = {kind: resolve_model(d).model.cfg for kind, (_, d, _) in t5.items()}
    assert (cfg["t5"].scale_output, cfg["t5"].tie_output, cfg["t5"].ffn_gated) == (True, True, False)
    assert (cfg["mt5"].scale_output, cfg["mt5"].tie_output, cfg["mt5"].ffn_gated) == (False, False, True)
    for c in cfg.values():
        assert (c.norm_kind, c.positions, c.scale_attention, c.head_dim, c.start_id) == ("rms", "relative", False, 12,
                                                                                         PAD)
        assert c.n_heads * c.head_dim != c.d_model and c.n_encoder_layers != c.n_decoder_layers
    assert cfg["mt5"].activation == "gelu_tanh"


def write_config(directory, **changes):
    cfg = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**cfg, **changes}))


@pytest.mark.parametrize("changes, fragment", [
    (dict(model_type="umt5"), "UMT5 learns a relative position bias in every layer"),
    (dict(feed_forward_proj="gated-tanh"), "activation 'tanh' is not one of"),
    (dict(feed_forward_proj="gelu-relu"), "is not `ACT` or `gated-ACT`"),
    (dict(is_encoder_decoder=False), "a decoder-only T5"),
])
def test_unmappable_configs_are_refused_by_name(t5, tmp_path, changes, fragment):
    import shutil
    d = shutil.copytree(t5["t5"][1], tmp_path / "model")
    write_config(d, **changes)
    with pytest.raises((CheckpointError, ConfigError), match=fragment):
        resolve_model(d)
    result = CliRunner().invoke(main, ["export", str(d), "-o", str(tmp_path / "out")])
    assert result.exit_code != 0 and fragment.split("'")[0] in result.output


@pytest.mark.parametrize("kind,precision", [("t5", "fp32"), ("mt5", "fp16")])
def test_tensorrt_rtx_builds_the_t5_engines(t5, tmp_path, kind, precision):
    """TensorRT-RTX (it builds without a GPU) parses and builds every graph of a T5 bundle: the
    relative position bias's bucket table Gather, the RMS norms, and in fp16 the fp32 feed-forward
    outputs beside fp16 layers; the manifest records each engine against its graph's hash."""
    trt = pytest.importorskip("tensorrt_rtx", reason="tensorrt-rtx is not installed (pip install -e '.[dev]')")
    from xform.exporter.engine import build_engines
    from xform.runtime.bundle import Bundle

    _, directory, fp32 = t5[kind]
    path = fp32 if precision == "fp32" else export_bundle(directory, tmp_path / precision, precision=precision).path
    if precision == "fp32":
        path = tmp_path / "b"
        shutil.copytree(fp32, path)
    engines = build_engines(path, "tensorrt_rtx", max_batch=4, max_new_tokens=12, opt_batch=2, opt_src_len=9)
    manifest = Bundle.open(path).manifest
    for graph in ("encoder", "decoder", "reorder"):
        e = manifest.engines[f"{graph}.tensorrt_rtx"]
        assert e == engines[f"{graph}.tensorrt_rtx"] and e.tensorrt_version == trt.__version__
        assert (path / e.file).stat().st_size > 0
