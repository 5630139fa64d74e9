"""benchmarks/train_step.py's row selection: ``--rows`` keeps only the named rows, in the table's order,
and refuses a row that does not exist or a selection without the row every loss is checked against."""
import argparse
import importlib.util
import pathlib
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def train_step():
    spec = importlib.util.spec_from_file_location("train_step", ROOT / "benchmarks" / "train_step.py")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return module


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
