"""The eager PyTorch backend: the model itself behind the runtime's numpy backend interface.

It lives in models/ (it needs torch) and speaks xform.runtime.backends.backend.Backend (a Protocol), so the
runtime never imports torch. It is the reference `--check` compares other backends with.
"""
from __future__ import annotations

import numpy as np
import torch

from xform.contract import Capabilities
from xform.errors import JoinRefused, XformError
from xform.models.layers import LayerKV
from xform.models.transformer import EncoderOutput, Seq2SeqTransformer, recording


class TorchBackend:
    name = "torch"

    def __init__(self, model: Seq2SeqTransformer, device: str = "cpu", threads: int | None = None,
                 attention_layer: int | None = None):
        if device == "cuda" and not torch.cuda.is_available():
            from xform.errors import BackendUnavailableError
            raise BackendUnavailableError("--device cuda: torch sees no CUDA GPU (torch.cuda.is_available() is False)")
        if device == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False  # the reference never uses TF32
            torch.backends.cudnn.allow_tf32 = False
        if threads:
            torch.set_num_threads(threads)
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.enc: EncoderOutput | None = None
        self.past: list[LayerKV] | None = None
        self.n_steps = 0
        self.attention_layer = attention_layer
        self.last_attention: np.ndarray | None = None
        self.has_attention = attention_layer is not None

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(attention=self.has_attention)

    def gather(self, rows: np.ndarray) -> None:
        raise XformError("the torch backend reorders rows in step(beam_idx=...) only")

    def join(self, src_ids: np.ndarray, src_lengths: np.ndarray, group: int = 1) -> None:
        raise JoinRefused("the torch backend cannot add rows to a running batch (capabilities.join)")

    @classmethod
    def for_bundle(cls, bundle, device: str = "cpu", threads: int | None = None) -> "TorchBackend":
        """The reference of a bundle (its `reference` checkpoint), with its attention layer; the
        bundle is the runtime's Bundle, read here by its manifest and files only."""
        from xform.models.checkpoint import load_checkpoint
        return cls(load_checkpoint(bundle.file(bundle.manifest.reference_dir)), device, threads,
                   bundle.manifest.attention_layer)

    @torch.no_grad()
    def start(self, src_ids: np.ndarray, src_lengths: np.ndarray, group: int = 1) -> None:
        """The reference encodes every row's source, as transformers does for beams: no sharing."""
        self.enc = self.model.encode(torch.from_numpy(np.repeat(src_ids, group, 0)).to(self.device),
                                     torch.from_numpy(np.repeat(src_lengths, group, 0)).to(self.device))
        self.past, self.n_steps = None, 0

    @torch.no_grad()
    def step(self, input_ids, min_new_tokens, want_logits=False, beam_idx=None, candidates: int = 0):
        # candidates: capabilities.candidates is False, so the loop never asks for them
        enc = self.enc
        if enc is None:
            raise XformError("step(): no decode is running (start() first)")
        tok = torch.from_numpy(np.ascontiguousarray(input_ids)).to(self.device).view(-1, 1)
        reorder = None if beam_idx is None else torch.from_numpy(np.ascontiguousarray(beam_idx)).to(self.device)
        if reorder is not None and len(reorder) < enc.src_mask.shape[0]:  # rows left the batch
            enc = self.enc = EncoderOutput([(k.index_select(0, reorder), v.index_select(0, reorder))
                                            for k, v in enc.cross_kv], enc.src_mask.index_select(0, reorder))
        with recording(self.model, self.attention_layer) as attention:
            logits, self.past = self.model.decode(tok, enc, self.past, reorder)
        if attention:
            self.last_attention = attention[0][:, -1].float().cpu().numpy()
        logits = logits[:, -1]
        nxt = self.model.suppress(logits, self.n_steps, min_new_tokens).argmax(-1)
        self.n_steps += 1
        return nxt.cpu().numpy(), (logits.cpu().numpy() if want_logits else None)

    def attention(self) -> np.ndarray:
        """The last step's cross-attention of the bundle's attention layer, averaged over heads."""
        if self.last_attention is None:
            raise XformError("no attention to return: this reference has no attention layer, or no step ran")
        return self.last_attention.copy()
