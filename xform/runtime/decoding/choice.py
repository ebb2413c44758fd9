"""Which strategy decodes a request: greedy, sampling, alternatives, beam search, or the
constrained beam search (constrained.py, built on BeamSearch) where a request has constraints.
A module of its own so that the strategies never import the constrained search built on them."""
from __future__ import annotations

from xform.runtime.decoding.constrained import ConstrainedBeamSearch
from xform.runtime.decoding.generation import GenerationConfig
from xform.runtime.decoding.processors import Special
from xform.runtime.decoding.strategies import Alternatives, BeamSearch, Greedy, Sample, Strategy


def make_strategy(batch: int, gen: GenerationConfig, special: Special, want_scores: bool = False,
                  prefix=None, start_id: int = 0, attention_len: int = 0, constraints=None) -> Strategy:
    """The strategy of a decode; with `constraints` (per source its phrases: Request.constraints)
    a beam search that meets them (constrained.py; a greedy request is promoted to beams before)."""
    args = (batch, gen, special, want_scores, prefix, start_id, attention_len)
    if constraints is not None:
        if gen.strategy != "beam":
            raise ValueError(f"constraints need beam search, not {gen.strategy} (constraints.constrained_generation)")
        return ConstrainedBeamSearch(*args, constraints=constraints)
    if gen.strategy == "beam":
        return BeamSearch(*args)
    kinds: dict[str, type[Greedy]] = {"greedy": Greedy, "sample": Sample, "alternatives": Alternatives}
    return kinds[gen.strategy](*args)
