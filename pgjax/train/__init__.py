"""The training loop and everything a run needs, one module per concept (docs/design.md)."""
