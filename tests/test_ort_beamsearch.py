"""scripts/ort_beamsearch.py: ONNX Runtime's BeamSearch operator (encoder-decoder mode) over
subgraphs traced from xform's model decodes the same tokens as xform's own beam search on the same
Marian directory: greedy, beams 2 and 4, a padded batch of sources of different lengths, exactly N
new tokens a hypothesis. The init subgraph's first logits and the decoder subgraph's next ones are
xform's; the pad id (and, before the length limit, end-of-sentence) is never generated even where
the model prefers it; bench_gpu's "ort-beamsearch fp32" engine runs. fp16: the operator's CPU kernel
refuses an fp16 model, which the last test records."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import bench_gpu  # noqa: E402
import ort_beamsearch  # noqa: E402

N = 12  # new tokens a hypothesis
LENGTHS = [7, 4, 9, 2, 6, 9]  # a padded batch: rows of different lengths, the longest 9


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    """A Marian directory briefly trained (tests/marian_fixtures.py's reversal task, 40 steps: the
    tokens depend on the source and beam search differs from greedy), its xform bundle and its
    BeamSearch model: (directory, xform run, BeamSearch path)."""
    pytest.importorskip("transformers", reason="transformers is a test dependency (pip install -e '.[dev]')")
    from tests.marian_fixtures import build_marian
    from xform.exporter.export import export_bundle

    d = tmp_path_factory.mktemp("ort-beamsearch")
    build_marian(d / "hf", "swish-scaled", steps=40)
    bundle = export_bundle(d / "hf", d / "bundle").path
    return d / "hf", bench_gpu.xform_engine(bundle, "cpu"), ort_beamsearch.build(d / "hf", d / "bs")


def sources(vocab: int, pad: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded ids (pad after each row's end-of-sentence, 0), their lengths."""
    rng = np.random.default_rng(seed)
    lens = np.array(LENGTHS)
    src = rng.integers(2, vocab - 1, (len(lens), max(LENGTHS)))
    src[np.arange(src.shape[1])[None, :] >= lens[:, None]] = pad
    src[np.arange(len(lens)), lens - 1] = 0
    return src, lens


def no_step(_step: int) -> None:
    pass


@pytest.mark.parametrize("beams", [1, 2, 4])
def test_tokens_equal_xform_beam_search(marian, beams):
    hf, xform_run, bs = marian
    run = ort_beamsearch.engine(bs)
    src, lens = sources(53, 52)
    ours = run(src, lens, beams, N, no_step)
    assert ours.shape == (len(LENGTHS), N)
    np.testing.assert_array_equal(ours, xform_run(src, lens, beams, N, no_step))
    if beams > 1:  # the search is not greedy's: some source's best hypothesis differs
        assert (ours != run(src, lens, 1, N, no_step)).any(axis=1).any()
    # two new tokens: the init subgraph's token, then one decoder step
    np.testing.assert_array_equal(run(src, lens, beams, 2, no_step), xform_run(src, lens, beams, 2, no_step))
    with pytest.raises(ValueError, match="2 new tokens or more"):  # max_length 2: ORT runs its decoder unfed
        run(src, lens, beams, 1, no_step)


def test_subgraph_logits_are_xform_step_logits(marian):
    """The init subgraph's logits are xform's decoder step at position 0 (decode_step, the decoder
    graph's math, over encode's output); the decoder subgraph's, fed the init's presents and a
    token, are xform's decode over [start, token] at its last position. Built from the
    Seq2SeqTransformer itself (the other entry point of `build`)."""
    import onnxruntime as ort

    from xform.models.importers import resolve_model

    hf, _, _ = marian
    model = resolve_model(hf).model.eval()
    path = ort_beamsearch.build(model, hf.parent / "bs-from-model")
    init = ort.InferenceSession(ort_beamsearch.subgraph(path, "encoder").SerializeToString())
    step = ort.InferenceSession(ort_beamsearch.subgraph(path, "decoder").SerializeToString())
    src, lens = sources(53, 52)
    mask = (np.arange(src.shape[1])[None, :] < lens[:, None]).astype(np.int32)
    B, start = len(lens), model.cfg.start_id
    out = init.run(None, {"encoder_input_ids": src.astype(np.int32), "encoder_attention_mask": mask,
                          "decoder_input_ids": np.full((B, 1), start, np.int32)})
    names = [o.name for o in init.get_outputs()]
    n = model.cfg.n_decoder_layers
    with torch.no_grad():
        enc = model.encode(torch.from_numpy(src), torch.from_numpy(lens))
        cache = [(torch.zeros(B, model.cfg.n_heads, 4, model.cfg.head_dim),) * 2 for _ in range(n)]
        want, _ = model.decode_step(torch.full((B, 1), start), enc, cache, torch.zeros(B, dtype=torch.long))
    assert out[0].shape == (B, 1, model.cfg.tgt_vocab_size)
    np.testing.assert_allclose(out[0][:, 0], want.numpy(), atol=1e-4, rtol=0)
    token = want.argmax(-1).numpy().astype(np.int32)[:, None]
    feed = {"input_ids": token, "encoder_attention_mask": mask}
    feed.update({k.replace("present", "past"): v for k, v in zip(names, out) if k.startswith("present")})
    logits = step.run(["logits"], feed)[0]
    with torch.no_grad():
        prefix = torch.cat([torch.full((B, 1), start), torch.from_numpy(token).long()], 1)
        want2 = model.decode(prefix, enc)[0][:, -1]
    np.testing.assert_allclose(logits[:, 0], want2.numpy(), atol=1e-4, rtol=0)


def test_pad_and_early_end_never_generated(marian, tmp_path):
    """A copy of the model whose output bias makes the pad id its favourite and end-of-sentence the
    next: xform bans the pad id always and end-of-sentence before min_new_tokens (= N), the operator
    through vocab_mask and min_length = max_length = N + 1. Neither appears, every hypothesis has N
    tokens, and the tokens are still xform's."""
    import onnxruntime as ort
    from transformers import MarianMTModel

    from xform.exporter.export import export_bundle

    hf, _, _ = marian
    m = MarianMTModel.from_pretrained(hf)
    pad, eos = m.config.pad_token_id, m.config.eos_token_id
    with torch.no_grad():
        m.final_logits_bias[0, pad] += 40.0
        m.final_logits_bias[0, eos] += 30.0
    m.save_pretrained(tmp_path / "hf")
    path = ort_beamsearch.build(tmp_path / "hf", tmp_path / "bs")
    src, lens = sources(53, pad, seed=2)
    # the test can fail: unbanned, the model's first choice is the pad id for every source
    init = ort.InferenceSession(ort_beamsearch.subgraph(path, "encoder").SerializeToString())
    mask = (np.arange(src.shape[1])[None, :] < lens[:, None]).astype(np.int32)
    first = init.run(["logits"], {"encoder_input_ids": src.astype(np.int32), "encoder_attention_mask": mask,
                                  "decoder_input_ids": np.full((len(lens), 1), pad, np.int32)})[0]
    assert (first[:, 0].argmax(-1) == pad).all()
    xform_run = bench_gpu.xform_engine(export_bundle(tmp_path / "hf", tmp_path / "bundle").path, "cpu")
    run = ort_beamsearch.engine(path)
    for beams in (1, 4):
        ours = run(src, lens, beams, N, no_step)
        assert ours.shape == (len(lens), N) and not np.isin(ours, [pad, eos]).any(), ours
        np.testing.assert_array_equal(ours, xform_run(src, lens, beams, N, no_step))


def test_bench_gpu_engine(marian, tmp_path):
    """bench_gpu's "ort-beamsearch fp32": built once (by a child process) under the work folder, then
    reused; its run is the engine's."""
    hf, xform_run, _ = marian
    paths = {"hf": hf, "work": tmp_path}
    run = bench_gpu.make_engine("ort-beamsearch fp32", paths, "cpu")
    built = tmp_path / "ort-beamsearch-fp32" / hf.name / ort_beamsearch.MODEL_FILE
    assert built.is_file()
    src, lens = sources(53, 52)
    np.testing.assert_array_equal(run(src, lens, 2, 5, no_step), xform_run(src, lens, 2, 5, no_step))
    stamp = built.stat().st_mtime_ns
    bench_gpu.make_engine("ort-beamsearch fp32", paths, "cpu")
    assert built.stat().st_mtime_ns == stamp  # cached


def test_fp16_builds_and_the_cpu_kernel_refuses_it(marian, tmp_path):
    """fp16: every float input and output of both subgraphs is fp16 (the operator requires one
    dtype), the rest of the model as xform's to_fp16 keeps it; ONNX Runtime's CPU kernel refuses to
    run it (its CUDA kernel is the one for fp16: bench_gpu on a GPU)."""
    import onnx
    import onnxruntime as ort

    hf, _, _ = marian
    path = ort_beamsearch.build(hf, tmp_path / "bs16", "fp16")
    for which in ("encoder", "decoder"):
        g = ort_beamsearch.subgraph(path, which).graph
        floats = [v.type.tensor_type.elem_type for v in (*g.input, *g.output)
                  if v.type.tensor_type.elem_type not in (onnx.TensorProto.INT32,)]
        assert floats and set(floats) == {onnx.TensorProto.FLOAT16}, (which, floats)
    if "CUDAExecutionProvider" in ort.get_available_providers():
        return  # the refusal below is the CPU kernel's
    run = ort_beamsearch.engine(path)
    src, lens = sources(53, 52)
    with pytest.raises(Exception, match="does not support float16 model on CPU"):
        run(src, lens, 2, 4, no_step)


def test_external_data(marian, tmp_path, monkeypatch):
    """A model over the size limit keeps its tensors in beamsearch.onnx.data (the subgraphs' and
    the shared ones) and decodes the same tokens."""
    hf, xform_run, _ = marian
    monkeypatch.setattr(ort_beamsearch, "PROTOBUF_LIMIT", 0)
    path = ort_beamsearch.build(hf, tmp_path / "bs")
    data = tmp_path / "bs" / ort_beamsearch.DATA_FILE
    assert data.stat().st_size > path.stat().st_size
    src, lens = sources(53, 52)
    np.testing.assert_array_equal(ort_beamsearch.engine(path)(src, lens, 4, N, no_step),
                                  xform_run(src, lens, 4, N, no_step))
