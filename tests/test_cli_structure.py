"""The commands' shape: flags that go together reach a command as one object (cli/groups.py), so
that a command's function takes a few objects, not a parameter a flag."""
import inspect

import click
import pytest
from click.testing import CliRunner

from xform.cli import main

MAX_PARAMETERS = 15


def signature(command: str) -> inspect.Signature:
    """The signature of the function a command's click callback wraps (its option groups and
    error handling unwrapped)."""
    return inspect.signature(inspect.unwrap(main.commands[command].callback))


@pytest.mark.parametrize("command", ["run", "corpus", "eval"])
def test_a_command_takes_its_flags_in_groups(command):
    params = signature(command).parameters
    assert len(params) <= MAX_PARAMETERS, f"{command}: {len(params)} parameters: {list(params)}"
    assert not [p for p in params.values() if p.kind is p.VAR_KEYWORD], f"{command}: {list(params)}"


def test_the_groups_build_the_objects_the_runtime_takes():
    """The text flags make a TextOptions, the batching flags a Batching (once checked), the
    decoding flags (with --max-new-tokens) the generation settings, where it runs a Placement."""
    from xform.cli.documents import document_options
    from xform.cli.groups import Placement, pass_placement
    from xform.cli.options import batching_options, generation_options, text_options
    from xform.runtime.decoding.request import TextOptions
    from xform.runtime.scheduling.batching import Batching

    seen = {}

    @click.command()
    @click.option("--backend", default="ort")
    @click.option("--threads", type=int, default=None)
    @batching_options
    @text_options
    @document_options
    @generation_options
    @pass_placement("backend", "threads")
    def probe(where, batching, text, documents, generation):
        seen.update(where=where, batching=batching.checked(), text=text, documents=documents,
                    settings=generation.settings(), max_new_tokens=generation.max_new_tokens)

    r = CliRunner().invoke(probe, ["--max-batch-tokens", "64", "--src-lang", "fr", "--token-scores", "--truncate",
                                   "--backend", "torch", "--threads", "2", "--num-beams", "3", "--max-new-tokens",
                                   "9", "--format", "markdown", "--bad-words", "no"])
    assert r.exit_code == 0, r.output
    assert seen["where"] == Placement("torch", None, 2)
    assert seen["batching"] == Batching("tokens", None, 64, 8, None)
    assert seen["text"] == TextOptions("tokens", "fr", None, True, False, False, None)
    assert seen["documents"].markup == "markdown" and seen["documents"].wanted
    assert seen["settings"]["num_beams"] == 3 and seen["settings"]["bad_words"] == ["no"]
    assert seen["max_new_tokens"] == 9


def test_a_group_keeps_its_flags_in_help_order():
    """Each flag of run is listed in --help where the command declares it, its group or not."""
    names = [p.name for p in main.commands["run"].params]
    for before, after in [("backend", "uncaptured"), ("texts", "input_file"), ("verbose", "batch_size"),
                          ("read_ahead", "max_new_tokens"), ("max_new_tokens", "src_lang"),
                          ("replace_unknowns", "documents"), ("skip_target_language", "greedy")]:
        assert names.index(before) < names.index(after), names
