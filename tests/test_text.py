"""tokdyn._text.one_line: what a message quotes of an error or a stored value, on one line."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tokdyn._text import one_line


def test_hand_written_cases():
    assert one_line("  a\tb\n\nc  ") == "a b c"
    assert one_line("line one\r\nline two", 8) == "line one"
    assert one_line(ValueError("bad\nvalue")) == "bad value"
    assert one_line(None) == "None" and one_line(12, 1) == "1"
    assert one_line("\u2028x\u00a0y\u3000") == "x y"  # Unicode line separator and spaces too
    assert one_line("", 5) == "" and one_line("abc", 0) == ""


@given(st.text(), st.one_of(st.none(), st.integers(0, 50)))
def test_one_line_holds_the_words_in_order_and_no_other_space(text, limit):
    out = one_line(text, limit)
    whole = one_line(text)
    assert whole.split(" ") == text.split() or (whole == "" and text.split() == [])
    assert out == whole[:limit]  # the cut is a prefix of the whole line
    assert not any(ch.isspace() and ch != " " for ch in out)
    assert "  " not in out and out == out.lstrip()
    assert limit is None or len(out) <= limit
