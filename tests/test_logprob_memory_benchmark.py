"""benchmarks/logprob_memory.py: on a head small enough to run here, its record holds the table the docs
quote and each path's raw numbers, and the chunked path's memory ratio is its temporary bytes over the
plain path's."""
import json

from helpers import load_benchmark


def test_the_record_holds_the_table_and_the_raw_numbers(tmp_path, capsys):
    benchmark = load_benchmark("logprob_memory")
    path = tmp_path / "logprob_memory.json"
    benchmark.main(["--tokens", "32", "--hidden", "8", "--vocab", "64", "--chunk-size", "8",
                    "--repeats", "1", "--json", str(path)])
    saved = json.loads(path.read_text())
    assert [row["path"] for row in saved["rows"]] == ["plain", "chunked (8)"]
    plain, chunked = (row["memory"]["temp_size_in_bytes"] for row in saved["rows"])
    chunked_row = next(line for line in saved["table"] if line.startswith("| chunked (8) |"))
    cells = [cell.strip() for cell in chunked_row.strip("|").split("|")]
    assert cells[3] == f"{chunked / plain:.3f}"
    assert all(len(row["seconds"]) == 1 and row["seconds"][0] > 0 for row in saved["rows"])
    assert saved["table"][-1].startswith("Measured on ") and saved["provenance"]["commit"]
    assert "loss" in capsys.readouterr().out          # the chunked path was checked against the plain one
