"""The learned reward's model (pgjax.models.heads.RewardModel) and its Hugging Face form: the score is
the head at each row's last real token whatever the padding; a reward model saved as a sequence
classifier and a process reward model saved as a token classifier give transformers' scores, for
every family transformers has the classifier of, and load back with the same scores."""
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_hf_config

from pgjax.models import hf
from pgjax.models.heads import RewardModel, scored_index

torch = pytest.importorskip("torch", reason="golden tests need torch (pip install torch==2.13.0)")
transformers = pytest.importorskip("transformers")

PAD = 0
FAMILIES = [("llama", False), ("qwen2", True), ("qwen3", False), ("gemma3", True)]


def random_reward_model(family, tied, directory, bias=0.0, seed=0) -> RewardModel:
    """A tiny random trunk of ``family`` (saved by transformers, loaded by pgjax) with a random head."""
    torch.manual_seed(seed)
    transformers.AutoModelForCausalLM.from_config(tiny_hf_config(family, tied)).save_pretrained(directory)
    model = RewardModel(hf.load(directory))
    model.head.set_value(jnp.asarray(np.random.default_rng(seed).normal(size=model.head.shape), jnp.float32))
    model.bias.set_value(jnp.asarray(bias, jnp.float32))
    return model


def right_padded_batch():
    """Three rows of 3, 7 and 5 tokens (ids 1..63: never the pad id 0), right-padded with 0."""
    rng = np.random.default_rng(1)
    lengths = (3, 7, 5)
    tokens = np.zeros((3, 7), np.int64)
    for row, length in enumerate(lengths):
        tokens[row, :length] = rng.integers(1, 64, size=length)
    return tokens, (tokens != PAD).astype(np.int64)


def test_the_score_is_the_head_at_the_last_real_token_whatever_the_padding(tmp_path):
    model = random_reward_model("qwen2", True, tmp_path)
    tokens, mask = right_padded_batch()
    right = np.asarray(model.scores(jnp.asarray(tokens), jnp.asarray(mask)))
    alone = [float(model.scores(jnp.asarray(row[m > 0][None]), jnp.ones((1, int(m.sum())), jnp.int32))[0])
             for row, m in zip(tokens, mask, strict=True)]
    np.testing.assert_allclose(right, alone, rtol=1e-5, atol=1e-6)
    left_tokens = np.stack([np.roll(row, int((m == 0).sum())) for row, m in zip(tokens, mask, strict=True)])
    left_mask = (left_tokens != PAD).astype(np.int64)
    np.testing.assert_array_equal(scored_index(left_tokens, left_mask, None), [6, 6, 6])
    np.testing.assert_array_equal(scored_index(tokens, mask, None), [2, 6, 4])
    np.testing.assert_allclose(model.scores(jnp.asarray(left_tokens), jnp.asarray(left_mask)), alone,
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family, tied", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_a_reward_model_saved_as_a_sequence_classifier_scores_as_in_transformers(family, tied, tmp_path):
    model = random_reward_model(family, tied, tmp_path / "trunk")
    hf.save_reward_model(model, tmp_path / "rm", pad_token_id=PAD)
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm",
                                                                                dtype=torch.float32).eval()
    assert type(reference).__name__.endswith("ForSequenceClassification") and reference.config.num_labels == 1
    tokens, mask = right_padded_batch()
    with torch.no_grad():
        want = reference(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask)).logits[:, 0].numpy()
    got = np.asarray(model.scores(jnp.asarray(tokens), jnp.asarray(mask)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    back = hf.load_reward_model(tmp_path / "rm")
    np.testing.assert_allclose(back.scores(jnp.asarray(tokens), jnp.asarray(mask)), got, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("family, tied", FAMILIES[:2], ids=[f for f, _ in FAMILIES[:2]])
def test_a_process_reward_model_saved_as_a_token_classifier_scores_every_token_as_in_transformers(family, tied,
                                                                                                 tmp_path):
    model = random_reward_model(family, tied, tmp_path / "trunk", bias=-0.3)
    hf.save_reward_model(model, tmp_path / "prm", kind="token", pad_token_id=PAD)
    reference = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path / "prm",
                                                                             dtype=torch.float32).eval()
    tokens, mask = right_padded_batch()
    with torch.no_grad():
        want = reference(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask)).logits[..., 0].numpy()
    got = np.asarray(model(jnp.asarray(tokens), jnp.asarray(mask)))
    np.testing.assert_allclose(got[mask > 0], want[mask > 0], rtol=1e-4, atol=1e-5)
    back = hf.load_reward_model(tmp_path / "prm")
    assert float(back.bias[...]) == pytest.approx(-0.3)
    np.testing.assert_allclose(np.asarray(back(jnp.asarray(tokens), jnp.asarray(mask)))[mask > 0], got[mask > 0],
                               rtol=1e-6, atol=1e-6)


def test_when_the_pad_token_ends_the_texts_the_score_is_read_where_transformers_reads_it(tmp_path):
    """pad = EOS (Llama 3, SmolLM2): rows that end in it, right-padded with it, are read at their last
    other token by transformers' sequence classifier and by ``RewardModel.scores`` alike."""
    model = random_reward_model("llama", False, tmp_path / "trunk")
    eos = 7
    model.trunk.config = dataclasses.replace(model.trunk.config, pad_token_id=eos)
    hf.save_reward_model(model, tmp_path / "rm")
    tokens, mask = right_padded_batch()
    tokens = np.where(tokens == eos, 8, tokens)
    lengths = mask.sum(1)
    tokens[np.arange(3), lengths - 1] = eos                # each row ends in EOS...
    tokens[mask == 0] = eos                                # ...and is padded with it
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm",
                                                                                dtype=torch.float32).eval()
    with torch.no_grad():
        want = reference(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask)).logits[:, 0].numpy()
    got = np.asarray(model.scores(jnp.asarray(tokens), jnp.asarray(mask)))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(scored_index(tokens, mask, eos), lengths - 2)


def test_what_a_classifier_checkpoint_cannot_hold_is_refused(tmp_path):
    model = random_reward_model("gemma3", True, tmp_path / "trunk", bias=0.5)
    with pytest.raises(ValueError, match="has no bias"):
        hf.save_reward_model(model, tmp_path / "rm")
    with pytest.raises(ValueError, match="no token classifier for model_type 'gemma3_text'"):
        hf.save_reward_model(model, tmp_path / "prm", kind="token")
    with pytest.raises(ValueError, match="unknown classifier kind"):
        hf.save_reward_model(model, tmp_path / "x", kind="pairwise")
    with pytest.raises(ValueError, match="not a sequence or token classifier"):
        hf.load_reward_model(tmp_path / "trunk")
    assert not (tmp_path / "rm").exists() and not (tmp_path / "prm").exists()
