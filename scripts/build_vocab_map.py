"""A vocabulary map (CTranslate2's vmap, `xform run --vocab-map`) from a parallel corpus, by
co-occurrence: for each source token, the target tokens most often in the same sentence pair.

    python scripts/build_vocab_map.py BUNDLE --source train.src --target train.tgt -o vmap.txt
                                      [--per-token 20] [--always 100] [--min-share 0.05]

Both sides are split by the bundle's own tokenizers (the source into the pieces a map's keys are,
the target into the pieces its values are). A line of the map is `<source token> TAB <target
tokens>`: a source token's --per-token target tokens with the highest share of its sentence pairs
(at least --min-share of them), and one line with an empty key holding the --always most frequent
target tokens, which every batch may produce (punctuation, function words). Unigram keys only.

This is the simplest way to make a map: a lexical shortlist built from word alignments (Marian's
`extract_lex`, fast_align or eflomal probabilities) is tighter for the same quality. Whatever made a
map, judge it on held-out text with `xform eval BUNDLE --source S --reference R --vocab-map MAP
--against BUNDLE` (the same bundle without the map) before using it: docs/benchmarks.md, "A
vocabulary map on the file".
"""
from __future__ import annotations

import argparse
from collections import Counter, defaultdict
from pathlib import Path


def token_pairs(translator, sources: list[str], targets: list[str]):
    """Each pair's (set of source pieces, set of target pieces), by the bundle's tokenizers."""
    pieces = translator.pieces
    special = {translator.session.eos_id, translator.session.pad_id}
    for src, tgt in zip(sources, targets):
        # a map's key is split on spaces, and an empty key means "always": such pieces cannot be keys
        s = {p for p in translator.policy.text.source_pieces(src) if p.strip() and " " not in p}
        t = {pieces[i] for i in translator.policy.text.target_ids(tgt) if i not in special}
        yield s, t


def build(translator, sources: list[str], targets: list[str], per_token: int, always: int,
          min_share: float) -> tuple[dict[str, list[str]], list[str]]:
    """(source piece -> its target pieces, the always-allowed target pieces)."""
    together: dict[str, Counter] = defaultdict(Counter)
    seen: Counter = Counter()
    frequency: Counter = Counter()
    for s, t in token_pairs(translator, sources, targets):
        frequency.update(t)
        for piece in s:
            seen[piece] += 1
            together[piece].update(t)
    rules = {}
    for piece, counts in together.items():
        kept = [t for t, c in counts.most_common(per_token) if c / seen[piece] >= min_share]
        if kept:
            rules[piece] = kept
    return rules, [t for t, _ in frequency.most_common(always)]


def write(path: Path, rules: dict[str, list[str]], always: list[str]) -> None:
    lines = ["\t" + " ".join(always)] + [f"{k}\t{' '.join(v)}" for k, v in sorted(rules.items())]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(path)


def main() -> None:
    import xform
    from xform.runtime.text.translator import Translator

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--source", type=Path, required=True)
    ap.add_argument("--target", type=Path, required=True)
    ap.add_argument("-o", "--output", type=Path, required=True)
    ap.add_argument("--per-token", type=int, default=20)
    ap.add_argument("--always", type=int, default=100)
    ap.add_argument("--min-share", type=float, default=0.05)
    a = ap.parse_args()
    sources = a.source.read_text(encoding="utf-8").splitlines()
    targets = a.target.read_text(encoding="utf-8").splitlines()
    if len(sources) != len(targets):
        raise SystemExit(f"--source {a.source} has {len(sources)} lines, --target {a.target} {len(targets)}: "
                         "expected one translation a source line")
    translator = Translator(xform.load(a.bundle))
    rules, always = build(translator, sources, targets, a.per_token, a.always, a.min_share)
    write(a.output, rules, always)
    sizes = sorted(len(v) for v in rules.values())
    print(f"{a.output}: {len(rules)} source tokens, {sizes[len(sizes) // 2] if sizes else 0} target tokens each "
          f"(median), {len(always)} always allowed, from {len(sources)} sentence pairs")


if __name__ == "__main__":
    main()
