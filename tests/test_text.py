from autoprofiler.text import clip, first_line


def test_clip_keeps_short_values_and_marks_a_cut():
    assert clip("abc", 10) == "abc"
    assert clip(12345, 5) == "12345"
    cut = clip("x" * 50, 10)
    assert cut == "x" * 7 + "..." and len(cut) == 10


def test_first_line_takes_the_first_nonblank_line_and_cuts_at_a_space():
    assert first_line("first line\nsecond") == "first line"
    assert first_line("\n  first line  \nsecond") == "first line"
    assert first_line(0) == "0"
    assert first_line(ValueError("boom\ntraceback")) == "boom"
    assert first_line("aaaa " + "b" * 20, limit=10) == "aaaa ..."
    # no space before the limit: cut at the limit itself
    assert first_line("h" * 40, limit=8) == "h" * 8 + " ..."
    assert first_line("h" * 400 + "\nrest", limit=None) == "h" * 400


def test_first_line_of_nothing_is_the_placeholder():
    assert first_line("") == ""
    assert first_line(None, empty="(no message)") == "(no message)"
    assert first_line("  \n ", empty="RuntimeError") == "RuntimeError"
