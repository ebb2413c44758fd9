"""Every text door on the same cases (issue 42): the CLI's `run` (--text and --input-file),
`translate_batch`, `translate_iterable`, `translate_file`, `score_batch`, the Triton handler,
`xform corpus` and `xform.ray.Translate`. Each case gives the same tokens at every door, or the
same refusal, each door naming the setting its own way (the CLI its flag, Python the keyword,
Triton the input)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pytest
from click.testing import CliRunner

import xform
from xform.cli import main
from xform.errors import InputError
from xform.runtime.text.translator import Translator
from xform.serving.handler import execute

LONG = "12345678" * 5  # 41 source tokens with end-of-sentence: over the demo's max_len 32


@dataclass(frozen=True)
class Case:
    """Sources and settings in one vocabulary the doors below translate into their own."""
    sources: tuple[str, ...]
    beams: int | None = None
    prefix: str | None = None  # one target prefix for every source
    max_new_tokens: int | None = None
    truncate: bool = False
    src_lang: str | None = None
    misspelt: bool = False  # the beams given under a misspelt name


@dataclass
class Outcome:
    translations: list[str] | None = None  # the best translation of each source
    error: str = ""  # the refusal as the door says it
    refused_kinds: set = field(default_factory=set)


def cli_flags(case: Case) -> list[str]:
    flags = []
    if case.beams is not None:
        flags += ["--num-beam" if case.misspelt else "--num-beams", str(case.beams)]
    if case.max_new_tokens is not None:
        flags += ["--max-new-tokens", str(case.max_new_tokens)]
    if case.truncate:
        flags.append("--truncate")
    if case.src_lang is not None:
        flags += ["--src-lang", case.src_lang]
    return flags


def invoked(args: list[str]) -> Outcome:
    r = CliRunner().invoke(main, args)
    if r.exit_code != 0:
        return Outcome(error=r.output)
    return Outcome([line.split("\t")[1] for line in r.stdout.splitlines()])


def cli_text(bundle, case: Case, tmp_path) -> Outcome:
    args = ["run", str(bundle)]
    for s in case.sources:
        args += ["--text", s]
    if case.prefix is not None:
        for _ in case.sources:
            args += ["--target-prefix", case.prefix]
    return invoked(args + cli_flags(case))


def input_file(case: Case, tmp_path) -> str:
    path = tmp_path / "in.txt"
    path.write_text("".join(s + (f"\t{case.prefix}" if case.prefix is not None else "") + "\n" for s in case.sources))
    return str(path)


def cli_file(bundle, case: Case, tmp_path) -> Outcome:
    args = ["run", str(bundle), "--input-file", input_file(case, tmp_path), "--output", str(tmp_path / "out.txt")]
    r = CliRunner().invoke(main, args + (["--prefix-column"] if case.prefix is not None else []) + cli_flags(case))
    if r.exit_code != 0:
        return Outcome(error=r.output)
    return Outcome((tmp_path / "out.txt").read_text().splitlines())


def corpus(bundle, case: Case, tmp_path) -> Outcome:
    source = input_file(case, tmp_path)
    args = ["corpus", str(bundle), source, "--output-dir", str(tmp_path / "out")]
    r = CliRunner().invoke(main, args + (["--prefix-column"] if case.prefix is not None else []) + cli_flags(case))
    if r.exit_code != 0:
        return Outcome(error=r.output)
    return Outcome((tmp_path / "out" / "in.txt").read_text().splitlines())


def python_options(case: Case) -> dict:
    """CTranslate2's names, as its users write them."""
    options: dict = {}
    if case.beams is not None:
        options["beam_sise" if case.misspelt else "beam_size"] = case.beams
    if case.max_new_tokens is not None:
        options["max_decoding_length"] = case.max_new_tokens
    if case.truncate:
        options["truncate"] = True
    if case.src_lang is not None:
        options["src_lang"] = case.src_lang
    return options


def raised(call) -> Outcome:
    try:
        return Outcome(call())
    except InputError as e:
        return Outcome(error=str(e))


def translate_batch(bundle, case: Case, tmp_path) -> Outcome:
    t = xform.Translator(bundle)
    prefix = None if case.prefix is None else [case.prefix] * len(case.sources)
    return raised(lambda: [r.hypotheses[0] for r in t.translate_batch(list(case.sources), prefix,
                                                                        **python_options(case))])


def translate_iterable(bundle, case: Case, tmp_path) -> Outcome:
    t = xform.Translator(bundle)
    prefix = None if case.prefix is None else iter([case.prefix] * len(case.sources))
    return raised(lambda: [r.hypotheses[0] for r in t.translate_iterable(iter(case.sources), prefix,
                                                                           **python_options(case))])


def translate_file(bundle, case: Case, tmp_path) -> Outcome:
    t = xform.Translator(bundle)
    source = tmp_path / "source.txt"
    source.write_text("".join(s + "\n" for s in case.sources))
    prefix = None
    if case.prefix is not None:
        prefix = tmp_path / "prefix.txt"
        prefix.write_text(f"{case.prefix}\n" * len(case.sources))
    out = tmp_path / "translated.txt"
    return raised(lambda: t.translate_file(source, out, prefix, **python_options(case))
                  and out.read_text().splitlines() or [])


def ray(bundle, case: Case, tmp_path) -> Outcome:
    from xform.ray import Translate
    options = python_options(case)
    batch = {"text": np.array(list(case.sources), dtype=object)}
    if case.prefix is not None:
        options["prefix_column"] = "prefix"
        batch["prefix"] = np.array([case.prefix] * len(case.sources), dtype=object)
    try:
        translate = Translate(bundle, error_column=None, **options)
        out = translate(batch)
    except InputError as e:
        return Outcome(error=str(e))
    return Outcome(list(out["translation"]))


def text(*texts):
    return np.array([[t.encode()] for t in texts], dtype=object)


def triton(bundle, case: Case, tmp_path) -> Outcome:
    session = xform.load(bundle)
    inputs: dict = {}
    if case.beams is not None:
        inputs["num_beam" if case.misspelt else "num_beams"] = np.array([[case.beams]], np.int32)
    if case.max_new_tokens is not None:
        inputs["max_new_tokens"] = np.array([[case.max_new_tokens]], np.int32)
    if case.truncate:
        inputs["truncate"] = np.array([[True]], bool)
    if case.src_lang is not None:
        inputs["src_lang"] = text(case.src_lang)
    if case.prefix is not None:
        inputs["target_prefix"] = text(case.prefix)
    outs = execute(Translator(session), [{"text": text(s), **inputs} for s in case.sources])
    errors = [o for o in outs if isinstance(o, str)]
    if errors:
        return Outcome(error=errors[0])
    return Outcome([o["translation"][0, 0].decode() for o in outs])


DOORS = {"cli_text": cli_text, "cli_file": cli_file, "translate_batch": translate_batch,
         "translate_iterable": translate_iterable, "translate_file": translate_file, "triton": triton,
         "corpus": corpus, "ray": ray}

# how each door names a setting: the CLI its flag, Python CTranslate2's keyword, Triton the input
NAMES = {
    "max_new_tokens": {"cli": "--max-new-tokens", "python": "max_decoding_length", "triton": "input 'max_new_tokens'"},
    "src_lang": {"cli": "--src-lang", "python": "src_lang", "triton": "input 'src_lang'"},
    "beams": {"cli": "--num-beams", "python": "beam_size", "triton": "input 'num_beam'"},
    "truncate": {"cli": "(--truncate to cut it)", "python": "(truncate to cut it)", "triton": "truncate=true"},
}
KIND = {"cli_text": "cli", "cli_file": "cli", "corpus": "cli", "translate_batch": "python",
        "translate_iterable": "python", "translate_file": "python", "ray": "python", "triton": "triton"}

SAME = {
    "greedy": Case(("40512", "7", "123456")),
    "beam 3": Case(("40512", "7", "123456"), beams=3),
    "prefix": Case(("40512", "7"), prefix="forty"),
    "empty source": Case(("40512", "", "7")),
    "truncated": Case((LONG, "7"), truncate=True),
}


@pytest.fixture(scope="module")
def want(demo_bundle):
    """Each case's translations as the session decodes them (Translator.translate, ids underneath)."""
    t = xform.Translator(demo_bundle)
    out = {}
    for name, case in SAME.items():
        sources = [s[:31] if case.truncate else s for s in case.sources]  # cut to max_len with end-of-sentence
        settings = {"num_beams": case.beams} if case.beams else {}
        if case.prefix is not None:
            settings["target_prefix"] = [case.prefix] * len(sources)
        blank = [i for i, s in enumerate(sources) if not s]
        got = t.translate([s for s in sources if s], **settings)
        for i in blank:
            got.insert(i, "")
        out[name] = got
    return out


@pytest.mark.parametrize("door", sorted(DOORS))
@pytest.mark.parametrize("name", sorted(SAME))
def test_every_door_gives_the_same_translations(demo_bundle, want, tmp_path, door, name):
    outcome = DOORS[door](demo_bundle, SAME[name], tmp_path)
    assert outcome.error == "", outcome.error
    assert outcome.translations == want[name]


REFUSED = {
    "max_new_tokens 0": (Case(("40512",), max_new_tokens=0), "max_new_tokens"),
    "unknown language": (Case(("40512",), src_lang="xx"), "src_lang"),
    "misspelt option": (Case(("40512",), beams=3, misspelt=True), "beams"),
    "over max_len": (Case((LONG,)), "truncate"),
}
SAID = {"max_new_tokens 0": r"(at least 1|>= ?1)", "unknown language": "no languages", "misspelt option": "",
        "over max_len": "more than the model's max_len 32"}


@pytest.mark.parametrize("door", sorted(DOORS))
@pytest.mark.parametrize("name", sorted(REFUSED))
def test_every_door_refuses_alike_naming_the_setting_its_way(demo_bundle, tmp_path, door, name):
    case, setting = REFUSED[name]
    outcome = DOORS[door](demo_bundle, case, tmp_path)
    if name == "over max_len" and door in ("cli_file", "corpus", "ray", "translate_iterable", "translate_file"):
        # a stream's line over max_len fails alone, named by its line (the others are translated)
        assert re.search(r"line 0|in\.txt:1", outcome.error), outcome.error
    assert outcome.translations is None, f"{door} translated {case}: {outcome.translations}"
    assert re.search(SAID[name], outcome.error), outcome.error
    if setting is not None:
        name_here = NAMES[setting][KIND[door]]
        if name == "misspelt option" and KIND[door] == "cli":
            name_here = "--num-beam"
        if name == "misspelt option" and KIND[door] == "python":
            name_here = "beam_sise"
        assert name_here in outcome.error, outcome.error
        others = {NAMES[setting][k] for k in ("cli", "python", "triton")} - {NAMES[setting][KIND[door]]}
        if name != "misspelt option":
            assert not any(o in outcome.error for o in others if o not in name_here), outcome.error


def test_a_misspelt_option_gets_the_nearest_name(demo_bundle, tmp_path):
    assert "did you mean 'beam_size'" in translate_batch(demo_bundle, REFUSED["misspelt option"][0], tmp_path).error
    assert "--num-beams" in cli_text(demo_bundle, REFUSED["misspelt option"][0], tmp_path).error
    assert "num_beams" in triton(demo_bundle, REFUSED["misspelt option"][0], tmp_path).error


def test_a_string_where_a_list_belongs_is_refused_at_every_python_door(demo_bundle):
    t = xform.Translator(demo_bundle)
    calls = [lambda: t.translate_batch("40512"), lambda: list(t.translate_iterable("40512")),
             lambda: t.score_batch("40512", "forty"), lambda: t.translate("40512")]
    for call in calls:
        with pytest.raises(InputError, match="got a str .it would translate each character"):
            call()


def test_score_batch_scores_what_translate_batch_returns_and_refuses_alike(demo_bundle):
    t = xform.Translator(demo_bundle)
    sources = ["40512", "7", ""]
    best = t.translate_batch(sources, return_scores=True)
    scored = t.score_batch(sources, [r.hypotheses[0] for r in best])
    for r, s in zip(best, scored):
        assert sum(s.log_probs) == pytest.approx(r.scores[0], abs=1e-4)  # greedy's score: the log-probs' sum
    assert scored[2].tokens == [] and scored[2].log_probs == []  # an empty source: nothing scored, as translated
    with pytest.raises(InputError, match="did you mean 'src_lang'"):
        t.score_batch(["7"], ["seven"], src_lng="xx")
    with pytest.raises(InputError, match="src_lang xx"):
        t.score_batch(["7"], ["seven"], src_lang="xx")
    with pytest.raises(InputError, match="more than the model's max_len 32"):
        t.score_batch([LONG], ["x"])
