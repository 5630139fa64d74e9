"""benchmarks/train_step.py's row selection: ``--rows`` keeps only the named rows, in the table's order,
and refuses a row that does not exist or a selection without the row every loss is checked against."""
import argparse

import pytest
from helpers import load_benchmark

pytest.importorskip("torch")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def train_step():
    return load_benchmark("train_step")


def options(**overrides):
    return argparse.Namespace(**{"bf16": False, "options": False, "no_compile": True, "rows": None, **overrides})


def test_rows_select_in_table_order(train_step):
    everything = train_step.row_names(options(options=True), real_model=True)
    assert everything == ["torch eager", "torch eager, chunked", "pgjax, chunked", *train_step.OPTION_ROWS]
    chosen = options(options=True, rows=["pgjax, chunked, scan + remat", "torch eager"])
    assert train_step.row_names(chosen, real_model=True) == ["torch eager", "pgjax, chunked, scan + remat"]


@pytest.mark.parametrize("rows, message", [(["torch eager", "pgjax, chunked, scan"], "no such row"),
                                           (["pgjax, chunked"], "'torch eager' is needed")])
def test_bad_rows_are_refused_before_any_work(train_step, capsys, rows, message):
    with pytest.raises(SystemExit):
        train_step.main(["--no-compile", "--rows", *rows])
    assert message in capsys.readouterr().err
