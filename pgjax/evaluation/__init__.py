"""A policy on held-out prompts (held_out), models compared on the same prompts (paired), and the
statistics every report and benchmark uses (statistics)."""
