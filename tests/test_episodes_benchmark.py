"""benchmarks/episodes.py end to end on a tiny ChatML checkpoint: both sides play matched episodes
(the first turn's replies the same), the carried side reads each prompt and observation once and
the re-prefilled side the whole history every turn, and the saved table says so."""
import importlib.util
import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import save_tiny_checkpoint
from test_chat_prompts import CHATML

from pgjax.models import hf

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("episodes_benchmark", ROOT / "benchmarks" / "episodes.py")
benchmark = importlib.util.module_from_spec(spec)
spec.loader.exec_module(benchmark)


def ending_checkpoint(directory) -> Path:
    """The tiny checkpoint with its EOS output row along the mean final hidden state, so that replies
    end their turn within a few tokens and episodes run several turns."""
    checkpoint = save_tiny_checkpoint(directory, chat_template=CHATML)
    model = hf.load(checkpoint)
    tokens = jnp.asarray(np.random.default_rng(0).integers(2, 40, size=(8, 12)))
    direction = np.asarray(model(tokens, return_hidden=True)).reshape(-1, model.config.hidden_size).mean(0)
    column = jnp.asarray(3.0 * direction / np.linalg.norm(direction))
    if model.config.tie_word_embeddings:
        model.embed.set_value(model.embed[...].at[1].set(column))
    else:
        model.lm_head.set_value(model.lm_head[...].at[:, 1].set(column))
    hf.save(model, checkpoint)
    return checkpoint


@pytest.mark.slow
def test_both_sides_play_matched_episodes_and_the_carried_side_prefills_less(tmp_path):
    checkpoint = ending_checkpoint(tmp_path / "model")
    out = tmp_path / "episodes.json"
    benchmark.main(["--model", str(checkpoint), "--prompts", "2", "--samples", "4", "--turns", "3",
                    "--reply-tokens", "8", "--observation", "ok", "--observation-tokens", "128", "--rounds", "8",
                    "--json", str(out)])
    saved = json.loads(out.read_text())
    carried, again = saved["prefilled"]["carried"], saved["prefilled"]["re-prefilled"]
    assert 0.3 < saved["agree"] <= 1.0                           # the first turn's replies agree at least
    assert all(a < b for a, b in zip(carried, again, strict=True))          # the history again every turn
    assert len(saved["seconds"]["carried"]) >= 5 and "re-prefilled / carried" in "\n".join(saved["table"])
