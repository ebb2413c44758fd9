"""`xform score`: the log-likelihood of given translations, teacher-forced, a line a pair."""
from __future__ import annotations

from pathlib import Path

import click

from xform.cli import handle_errors, main
from xform.cli.flags import said
from xform.cli.groups import Placement, pass_placement
from xform.cli.options import check_readable, progress_bar
from xform.errors import InputError, XformError


@main.command()
@click.argument("bundle", type=click.Path(path_type=Path))
@click.option("--source", "source_file", required=True, type=click.Path(path_type=Path),
              help="Source sentences, one a line.")
@click.option("--target", "target_file", required=True, type=click.Path(path_type=Path),
              help="Their translations, one a line, in the same order.")
@click.option("--backend", type=click.Choice(["torch", "ort", "trt"]), default="ort", show_default=True)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None)
@click.option("--threads", type=click.IntRange(min=1), default=None)
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--src-lang", default=None, help="A multilingual model's source language code (NLLB's fra_Latn).")
@click.option("--tgt-lang", default=None, help="A multilingual model's target language code: the targets' first token.")
@click.option("--tokens", "per_token", is_flag=True,
              help="Append each target token's log-probability (space-separated, end-of-sentence last).")
@pass_placement("backend", "device", "threads")
@handle_errors
def score(bundle, source_file, target_file, where: Placement, batch_size, src_lang, tgt_lang, per_token) -> None:
    """Score given translations: for each pair, the log-likelihood of the target under BUNDLE,
    teacher-forced. Prints `total<TAB>per-token<TAB>tokens<TAB>source<TAB>target` a line (what users
    filter parallel data and rerank by); with --tokens, a sixth column of each token's log-prob."""

    for flag, path in (("--source", source_file), ("--target", target_file)):
        check_readable(flag, path)
    sources = source_file.read_text(encoding="utf-8").splitlines()
    targets = target_file.read_text(encoding="utf-8").splitlines()
    if len(sources) != len(targets):
        raise XformError(f"--source {source_file} has {len(sources)} lines, --target {target_file} {len(targets)}: "
                         "expected one translation a source")
    translator = where.open(bundle)
    session, policy = translator.session, translator.policy
    if session.tokenizer is None:
        raise XformError(f"{bundle}: this bundle has no tokenizer to read text; score token ids with Session.score")
    try:
        # an unknown or missing language is refused before any work
        policy.encode_target("", tgt_lang)
        if src_lang is not None:
            policy.check_src_lang(src_lang)
    except InputError as e:
        raise click.UsageError(said(e)) from None
    with progress_bar(True, "pairs", "scored", lambda: len(sources)) as advance:
        for start in range(0, len(sources), batch_size):
            src, tgt = sources[start:start + batch_size], targets[start:start + batch_size]
            src_ids = policy.encode_texts(src, src_lang, tgt_lang)
            tgt_ids, _ = session.pad([policy.encode_target(t, tgt_lang) for t in tgt])
            result = session.score(src_ids, tgt_ids)
            for i, (s_text, t_text) in enumerate(zip(src, tgt)):
                line = (f"{result['total'][i]:.4f}\t{result['normalized'][i]:.4f}\t{int(result['lengths'][i])}\t"
                        f"{s_text}\t{t_text}")
                if per_token:
                    line += "\t" + " ".join(f"{v:.4f}" for v in result["tokens"][i][:int(result["lengths"][i])])
                click.echo(line)
            if advance is not None:
                advance(len(src), int(result["lengths"].sum()))
