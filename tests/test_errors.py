"""Errors name settings by markers, which each door words its own way (xform/errors.py, issue 42)."""
import pickle

import pytest

from xform.errors import BackendUnavailableError, InputError, Message, SettingError, XformError, message, render

FLAG = {"src_lang": "--src-lang", "do_sample": "--sample"}.__getitem__


def test_a_setting_error_reads_as_python_by_default_and_as_a_door_asks():
    e = SettingError("{src_lang} 'xx': unknown; {do_sample} and {top_k} {'a': 1}", "src_lang", "do_sample")
    assert str(e) == "src_lang 'xx': unknown; do_sample and {top_k} {'a': 1}"  # only the settings named
    assert e.render(FLAG) == "--src-lang 'xx': unknown; --sample and {top_k} {'a': 1}"
    assert e.settings == ("src_lang", "do_sample") and e.template.startswith("{src_lang} 'xx'")
    with pytest.raises(InputError, match="^src_lang 'xx'"):
        raise e


def test_any_xform_error_may_name_settings_and_keeps_its_kind():
    e = BackendUnavailableError("{device} cuda needs a GPU").naming("device")
    assert isinstance(e, BackendUnavailableError) and str(e) == "device cuda needs a GPU"
    assert render(e, lambda s: "--" + s) == "--device cuda needs a GPU"
    plain = XformError("a {brace} stays")
    assert str(plain) == plain.render(FLAG) == "a {brace} stays"
    assert render(ValueError("not ours"), FLAG) == "not ours"


def test_errors_and_messages_keep_their_settings_across_processes():
    for e in (SettingError("{src_lang} x", "src_lang"), InputError("{do_sample} y").naming("do_sample")):
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is type(e) and back.settings == e.settings and back.render(FLAG) == e.render(FLAG)
    m = pickle.loads(pickle.dumps(Message("{src_lang} z", "src_lang")))
    assert isinstance(m, Message) and m == "src_lang z" and m.render(FLAG) == "--src-lang z"


def test_a_message_is_a_str_in_python_words_that_a_door_renders():
    m = message(SettingError("{src_lang} xx: unknown", "src_lang")).after("line 3: ")
    assert isinstance(m, str) and m == "line 3: src_lang xx: unknown" and f"{m}" == "line 3: src_lang xx: unknown"
    assert render(m, FLAG) == "line 3: --src-lang xx: unknown"
    assert message("plain").render(FLAG) == "plain" and render("plain", FLAG) == "plain"
