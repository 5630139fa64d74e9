"""pgjax: policy-gradient post-training of language models in JAX (see README.md and docs/design.md)."""
from pgjax.host_memory import keep_freed_memory

KEEPS_FREED_MEMORY = keep_freed_memory()    # before JAX starts its threads: see pgjax/host_memory.py
