"""pgjax.markdown: the one table writer."""
import pytest

from pgjax import markdown


def test_a_table_has_its_header_its_alignment_row_and_one_row_per_record():
    text = markdown.table(["method", "accuracy", "note"], [["grpo", "0.812", "a|b"], ["ppo", None, "two\nlines"]],
                          align="lrc")
    assert text.splitlines() == ["| method | accuracy | note |", "| --- | ---: | :---: |",
                                 "| grpo | 0.812 | a\\|b |", "| ppo | - | two lines |"]


def test_by_default_the_first_column_is_left_and_the_rest_right_aligned():
    assert markdown.table(["a", "b", "c"], []).splitlines()[1] == "| --- | ---: | ---: |"


@pytest.mark.parametrize("header, rows, align", [(["a", "b"], [[1]], None), (["a", "b"], [], "l"),
                                                 (["a"], [], "x")])
def test_a_row_or_alignment_of_the_wrong_width_is_refused(header, rows, align):
    with pytest.raises(ValueError, match="row 0 has 1 cells|align needs"):
        markdown.table(header, rows, align)
