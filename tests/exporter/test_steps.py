"""The decoder graphs' last computations (exporter/steps.py): the greedy choice and the beam
candidates equal their definitions (Seq2SeqTransformer.suppress, then ArgMax, or the log-softmax,
the suppression and the K best, ties to the lower id) on logits whose best ids are the suppressed
ones, with ties, rows before and after their min_new_tokens; with few never-generated ids (struck
among TopK's candidates) and with many (a bias over the vocabulary); in torch and as traced to
ONNX Runtime."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import make_model
from xform.exporter.steps import FEW_NEVER, greedy_choice, rank_candidates

K = 3


def models():
    few = make_model("seed-002", banned_ids=(5, 9))
    many = make_model("seed-002", banned_ids=tuple(range(10, 10 + FEW_NEVER + 4)))
    assert len(few.cfg.never_generated) <= FEW_NEVER < len(many.cfg.never_generated)
    return {"few never-generated ids": few, "many never-generated ids": many}


def hard_logits(model) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(R, V) logits, positions and min_new_tokens: row 0 has the pad id best, row 1 every
    never-generated id above all others, rows 2 and 3 end-of-sentence best (row 2 before its
    min_new_tokens, row 3 past it), row 4 ties between two ids at the top and at the K-th place,
    row 5 never-generated ids and end-of-sentence (early) above a tie."""
    cfg = model.cfg
    never = list(model.cfg.never_generated)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(6, cfg.tgt_vocab_size, generator=g)
    x[0, cfg.pad_id] = 9.0
    x[1, never] = torch.linspace(8.0, 6.0, len(never))
    x[2:4, cfg.eos_id] = 9.0
    x[4, [37, 33]] = 7.0  # ids no model here bans
    x[4, [39, 31]] = 5.0
    x[5, never] = 9.0
    x[5, cfg.eos_id] = 8.5
    x[5, [38, 34]] = 8.0
    positions = torch.tensor([4, 4, 1, 6, 4, 0])
    min_new = torch.tensor([2, 2, 3, 3, 2, 5])
    return x, positions, min_new


def expected(model, x, positions, min_new):
    """The definitions: suppress, then the first best id; log-softmax, suppress, then the K best by
    value, ties to the lower id."""
    suppressed = model.suppress(x, positions, min_new)
    greedy = suppressed.argmax(dim=-1)  # the first of the best
    scores = model.suppress(torch.log_softmax(x, dim=-1), positions, min_new).numpy()
    order = np.stack([np.lexsort((np.arange(s.size), -s))[:K] for s in scores])
    return greedy.numpy(), np.take_along_axis(scores, order, 1), order


@pytest.mark.parametrize("kind", ["few never-generated ids", "many never-generated ids"])
def test_greedy_and_candidates_equal_their_definitions(kind):
    """In torch, on the rows without ties (torch.topk orders equal values as it likes; what runs is
    the traced graph, whose ties the next test holds to the lower id)."""
    model = models()[kind]
    x, positions, min_new = (t[:4] for t in hard_logits(model))
    greedy, values, ids = expected(model, x, positions, min_new)
    np.testing.assert_array_equal(greedy_choice(model, x, positions, min_new).numpy(), greedy)
    top, got = rank_candidates(model, x, torch.tensor([K]), min_new, positions)
    np.testing.assert_array_equal(got.numpy(), ids)
    np.testing.assert_allclose(top.numpy(), values, rtol=0, atol=1e-6)
    # the rows are the hard cases they are meant to be: the best ids raw are not the choices
    assert greedy[0] != model.cfg.pad_id and greedy[1] not in model.cfg.never_generated and greedy[2] != model.cfg.eos_id
    assert greedy[3] == model.cfg.eos_id


class Tail(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, logits, num_candidates, min_new, positions):
        top, ids = rank_candidates(self.model, logits, num_candidates, min_new, positions)
        return greedy_choice(self.model, logits, positions, min_new), top, ids


@pytest.mark.parametrize("kind", ["few never-generated ids", "many never-generated ids"])
def test_as_onnx_runtime_runs_them(kind, tmp_path):
    """Traced (K a graph input, rows dynamic) and run on ONNX Runtime: its TopK's ties and ArgMax's
    first index give the definitions' ids, at other rows and K than traced."""
    import onnxruntime as ort
    model = models()[kind]
    x, positions, min_new = hard_logits(model)
    path = tmp_path / "tail.onnx"
    rows = {0: "rows"}
    torch.onnx.export(Tail(model), (x[:2], torch.tensor([2]), min_new[:2], positions[:2]), str(path),
                      input_names=["logits", "num_candidates", "min_new", "positions"],
                      output_names=["next_ids", "top", "ids"], opset_version=17, dynamo=False,
                      dynamic_axes={"logits": rows, "min_new": rows, "positions": rows, "next_ids": rows,
                                    "top": rows, "ids": rows})
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    greedy, values, ids = expected(model, x, positions, min_new)
    got_greedy, top, got = session.run(None, {"logits": x.numpy(), "num_candidates": np.array([K]),
                                              "min_new": min_new.numpy(), "positions": positions.numpy()})
    np.testing.assert_array_equal(got_greedy, greedy)
    assert greedy[4] == 33 and greedy[5] == 34 and list(ids[4]) == [33, 37, 31]  # ties: the lower id
    np.testing.assert_array_equal(got, ids)
    np.testing.assert_allclose(top, values, rtol=0, atol=1e-5)
