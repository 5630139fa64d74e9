"""docs/scaling.md's memory-planner table: Qwen2.5-0.5B, 1.5B and 7B (``pgjax/models/configs``) on 1, 8 and
64 simulated devices of 80 GiB, with and without rematerialisation.

Every cell is one ``python -m pgjax.plan`` run, each in its own process (the device count is fixed when
JAX starts: the command re-runs itself on simulated CPU devices), one at a time: GRPO (its KL reference
kept), group size 8, 256 prompt + 768 response tokens, one micro-batch, scan_layers, float32 parameters
and compute, AdamW; meshes (data, fsdp, tensor) = (1, 1, 1), (1, 8, 1) and (8, 8, 1); remat off,
save_nothing, and save_nothing with LoRA rank 16 on every projection (no reference copy, AdamW for
the adapters only). Each compiles at BATCH rows and searches the largest batch that fits (``pgjax.plan``'s
docstring: verified by compiles, not extrapolated).

    python benchmarks/plan_table.py --json benchmarks/results/plan_qwen25.json
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

from readme_tables import save_table

from pgjax import plan

CONFIGS = pathlib.Path(plan.__file__).parent / "models" / "configs"
MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-7b")
MESHES = ("data=1", "data=1,fsdp=8", "data=8,fsdp=8")
VARIANTS = (("off", 0), ("save_nothing", 0), ("save_nothing", 16))     # (remat, LoRA rank)
BATCH = 64
SETTINGS = ["--prompt-len", "256", "--response-len", "768", "--group-size", "8", "--scan-layers",
            "--device-memory-gib", "80", "--algorithm", "grpo"]


def run(model: str, mesh: str, remat: str, lora: int) -> dict:
    """One planner run (its --json), plus its wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "plan.json"
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pgjax.plan", "--model", str(CONFIGS / model), "--mesh", mesh,
                        "--batch", str(BATCH), "--remat", remat, "--lora", str(lora), *SETTINGS, "--json", str(out)],
                       check=True, stdout=subprocess.DEVNULL)
        return {**json.loads(out.read_text()), "wall_s": time.perf_counter() - start}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", help="save the table and every run's plan and search here")
    args = parser.parse_args(argv)
    results = []
    for model in MODELS:
        for mesh in MESHES:
            for remat, lora in VARIANTS:
                results.append(run(model, mesh, remat, lora))
                print(plan.markdown_rows(results[-1:])[-1], f"({results[-1]['wall_s']:.0f} s)", flush=True)
    save_table(args.json, sys.argv[1:] if argv is None else argv, plan.markdown_rows(results), results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
