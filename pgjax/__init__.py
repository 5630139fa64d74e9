"""pgjax: policy-gradient post-training of language models in JAX (see README.md and docs/design.md).

What ``import pgjax`` does to the process: the optional malloc settings of ``pgjax/host_memory.py``,
and ``TRANSFORMERS_NO_ADVISORY_WARNINGS=1`` unless the environment sets it, so that transformers,
used here for tokenizers and checkpoint files only, does not print its advice that PyTorch is
missing on every run (its warnings proper still print).
"""
import os

from pgjax.host_memory import keep_freed_memory

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
KEEPS_FREED_MEMORY = keep_freed_memory()    # before JAX starts its threads: see pgjax/host_memory.py
