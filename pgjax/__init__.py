"""pgjax: policy-gradient post-training of language models in JAX (see README.md and docs/design.md)."""
