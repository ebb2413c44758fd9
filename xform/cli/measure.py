"""`xform run --check` and `--benchmark`: the backend against eager PyTorch on the lines run
translated, and the decode timed on random sources; their flags as objects and their printing."""
from __future__ import annotations

import dataclasses

from rich.table import Table

from xform.cli import err, out

RANDOM_CHECK_TOKENS = 32  # run --check without text: new tokens a random source, unless --max-new-tokens
@dataclasses.dataclass(frozen=True)
class CheckFlags:
    """run --check and its flags: --check-lines, --atol, --rtol."""
    on: bool = False
    lines: int = 32
    atol: float | None = None
    rtol: float | None = None

    @classmethod
    def of(cls, check: bool, check_lines: int, atol: float | None, rtol: float | None) -> "CheckFlags":
        return cls(check, check_lines, atol, rtol)


@dataclasses.dataclass(frozen=True)
class BenchmarkFlags:
    """run --benchmark and its flags: --batch, --src-len, --new-tokens, --warmup, --iters."""
    on: bool = False
    batch: int = 1
    src_len: int = 32
    new_tokens: int = 64
    warmup: int = 2
    iters: int = 10

    @classmethod
    def of(cls, benchmark: bool, batch: int, src_len: int, new_tokens: int, warmup: int,
           iters: int) -> "BenchmarkFlags":
        return cls(benchmark, batch, src_len, new_tokens, warmup, iters)


def run_check(session, bundle, gen, max_new_tokens, checked, flags: CheckFlags, src_lang, report: dict) -> bool:
    """run --check: the translated lines (else sources of its own) against eager PyTorch. Lines
    are decoded again with the very settings that printed them, so the check compares every step
    of the translations shown (and, with beams, the same search); random sources stop at
    RANDOM_CHECK_TOKENS new tokens unless --max-new-tokens says otherwise."""
    import xform

    check_gen, steps = gen, "every step of the translations printed"
    if not checked.texts:
        cap = max_new_tokens or RANDOM_CHECK_TOKENS
        check_gen = gen.updated(max_new_tokens=min(gen.max_new_tokens, cap),
                                min_new_tokens=min(gen.min_new_tokens, cap))
        steps = f"random sources: up to {check_gen.max_new_tokens} new tokens each (--max-new-tokens N for more)"
    with err.status("checking against eager PyTorch"):
        rep = xform.check(bundle, session=session, texts=checked.texts or None, atol=flags.atol, rtol=flags.rtol,
                          generation=check_gen, src_lang=src_lang)
    if checked.texts:
        out.print(f"check on {len(checked.texts)} of the {checked.translated} translated lines (the first; "
                  "--check-lines N for more)" if len(checked.texts) < checked.translated else
                  f"check on all {checked.translated} translated lines")
    print_check(rep, steps)
    report["check"] = {**rep.to_dict(), "lines_compared": len(checked.texts), "lines_translated": checked.translated,
                       "steps_compared": steps}
    return rep.passed


def run_benchmark(session, backend: str, gen, flags: BenchmarkFlags) -> dict:
    """run --benchmark: fixed-length decodes of random sources, timed."""
    from rich.progress import Progress

    from xform.runtime.bench import benchmark

    new_tokens = flags.new_tokens
    with Progress(console=err, transient=True) as progress:
        task = progress.add_task(f"benchmark {backend}", total=flags.warmup + flags.iters)
        res = benchmark(session, flags.batch, flags.src_len, new_tokens, flags.warmup, flags.iters,
                        on_iter=lambda i: progress.advance(task),
                        generation=gen.updated(max_new_tokens=new_tokens, min_new_tokens=new_tokens))
    print_bench(res)
    return res.to_dict()


def print_check(report, steps: str = "") -> None:
    from xform.runtime.compare import GROSS_TOKEN_AGREEMENT
    t = Table(title=f"check: {report.backend} ({report.precision}, {report.strategy}) vs eager PyTorch, "
                    "teacher-forced on its best hypothesis")
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_column("tolerance", justify="right")
    by_decodes = report.judged_by == "decodes"
    gross = report.gross_only  # random sources: a reduced precision is judged for gross breakage only
    t.add_row("sources", "random token ids" if report.sources == "random" else "given sentences",
              "gross breakage only" if gross else "")
    if report.tf32:  # what TF32 costs: fp32 alone would be judged by atol 1e-4
        t.add_row("TF32 matmuls (--allow-tf32)", f"on: max abs logit error {report.max_abs_err:.1e}",
                  "fp16's tolerance; fp32 alone holds atol 1e-4")
    if by_decodes:  # a reduced precision is judged by its translations; logit errors are reported
        t.add_row("decodes alike (edits)", f"{report.decode_agreement:.2%} of {report.decodes_compared}",
                  "reported" if gross else f">= {report.min_decode_agreement:.0%}")
        t.add_row("decodes identical", f"{report.decodes_identical:.2%}", "reported")
        t.add_row("log-prob drop", f"{report.logprob_drop:.4f} nats/tok", f"<= {report.max_logprob_drop:g}")
    if report.bleu_vs_eager is not None:  # a reduced precision's translations (int8; fp16 on sentences)
        t.add_row("BLEU / chrF vs eager", f"{report.bleu_vs_eager:.1f} / {report.chrf_vs_eager:.1f}", "reported")
    t.add_row("max abs logit error", f"{report.max_abs_err:.3e}",
              "reported" if by_decodes else f"atol {report.atol:g}, rtol {report.rtol:g}")
    t.add_row("max rel logit error", f"{report.max_rel_err:.3e}", "")
    if report.min_passing_atol == 0 and report.max_abs_err > 0:  # rtol alone covers every difference
        t.add_row("smallest passing atol", "none needed", f"rtol {report.rtol:g} x the step's largest logit covers "
                  "every difference" + (" (reported)" if by_decodes else ""))
    else:
        t.add_row("smallest passing atol", f"{report.min_passing_atol:.3e}",
                  "reported" if by_decodes else f"at rtol {report.rtol:g}")
    t.add_row("steps compared", f"{report.steps} (longest decode)", steps)
    t.add_row("token agreement", f"{report.token_agreement:.2%} of {report.tokens_compared}",
              f">= {GROSS_TOKEN_AGREEMENT if gross else report.min_token_agreement:.0%}")
    t.add_row("first divergence (row, step)", str(report.first_divergence) if report.first_divergence else "none", "")
    t.add_row("non-finite values", "yes" if report.nonfinite else "no", "none")
    if report.beam_hypotheses_identical is not None:
        t.add_row("beam hypotheses = eager's", f"{report.beam_hypotheses_identical:.2%} of {report.beam_hypotheses}",
                  "reported" if gross else f">= {report.min_token_agreement:.0%}")
        t.add_row("max abs beam score error", f"{report.beam_score_max_abs_err:.3e}",
                  "reported" if by_decodes else report.beam_score_tolerance)
    out.print(t)
    out.print("[bold green]check passed[/]" if report.passed else "[bold red]check FAILED[/]")


def print_bench(r) -> None:
    t = Table(title=f"benchmark: {r.backend} {r.precision}, {r.strategy}, batch {r.batch}, src_len {r.src_len}, "
                    f"{r.new_tokens} new tokens, median of {r.iters}")
    # one decoder step makes one token a row: its time is the per-token latency a user waits
    for col in ("tokens/s", "per-token latency p50 ms", "p90 ms", "p99 ms", "peak RSS MiB"):
        t.add_column(col, justify="right")
    t.add_row(f"{r.tokens_per_s:,.1f}", f"{r.latency_ms_p50:.2f}", f"{r.latency_ms_p90:.2f}",
              f"{r.latency_ms_p99:.2f}", f"{r.peak_rss_mib:,.0f}")
    out.print(t)
    out.print(f"on {r.machine}")
