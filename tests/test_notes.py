"""Exception notes: fxloom._notes gives Python 3.10 what 3.11's ``add_note`` does."""

import traceback

from fxloom._notes import add_note, notes_of


def test_a_note_is_listed_in_the_errors_notes():
    err = RuntimeError("shapes differ")
    add_note(err, "fxloom: raised by %matmul")
    assert notes_of(err) == ["fxloom: raised by %matmul"]


def test_a_note_shows_in_the_printed_traceback():
    err = RuntimeError("shapes differ")
    add_note(err, "fxloom: raised by %matmul")
    printed = "".join(traceback.format_exception(type(err), err, None))
    assert "shapes differ" in printed
    assert "fxloom: raised by %matmul" in printed


def test_the_same_note_is_added_once():
    err = ValueError("bad")
    add_note(err, "hint")
    add_note(err, "hint")
    assert notes_of(err) == ["hint"]


def test_notes_keep_the_order_they_were_added_in():
    err = ValueError("bad")
    add_note(err, "inner")
    add_note(err, "outer")
    assert notes_of(err) == ["inner", "outer"]


def test_an_error_without_notes_has_an_empty_list():
    assert notes_of(KeyError("x")) == []


def test_a_message_that_is_not_a_plain_string_is_left_alone():
    err = KeyError("missing")
    add_note(err, "hint")
    assert err.args == ("missing",)
    assert notes_of(err) == ["hint"]
