"""Flax NNX Llama / Qwen2 / Qwen3 / Gemma 3 against the reference implementation (transformers +
PyTorch): golden logits on a left-padded batch, and save -> from_pretrained round trips; for Gemma 3
also its configuration, sequences longer than the sliding window through the KV cache, stacked
layers, remat, bfloat16 and LoRA."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import GEMMA3_TINY, per_layer, save_tiny_tokenizer, tiny_hf_config

from pgjax.checks import ConfigError
from pgjax.core import chunked_logprobs_and_entropy, token_logprobs
from pgjax.models import hf, lora
from pgjax.models.transformer import (
    CausalLM,
    ModelConfig,
    attention_bias,
    blockwise_attention,
    fused_attention,
    grouped_query_attention,
    rope_frequencies,
)

transformers = pytest.importorskip("transformers")

FAMILIES = [("llama", False), ("llama", True), ("qwen2", False), ("qwen2", True), ("qwen3", False), ("qwen3", True),
            ("gemma3", False), ("gemma3", True)]


def left_padded_batch(length=9):
    """Rows with 0, 3 and 5 slots of left padding (9 slots: longer than Gemma's tiny window of 4)."""
    tokens = np.random.default_rng(0).integers(1, 64, size=(3, length))
    mask = np.ones((3, length), np.int64)
    mask[1, :3] = 0
    mask[2, :5] = 0
    return tokens, mask


def reference_logits(ref, tokens, mask):
    torch = pytest.importorskip("torch")
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    with torch.no_grad():
        return ref(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                   position_ids=torch.tensor(positions)).logits.numpy()


def reference_checkpoint(family, tied, directory, dtype=None, seed=0):
    """A tiny random transformers model of ``family`` (norms and biases moved away from their initial
    values), saved to ``directory`` (in ``dtype`` if given); returns the float model."""
    torch = pytest.importorskip("torch", reason="golden tests need torch (pip install torch==2.13.0)")
    torch.manual_seed(seed)
    ref = transformers.AutoModelForCausalLM.from_config(tiny_hf_config(family, tied)).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    if dtype is not None:
        ref = ref.to(dtype)
    ref.save_pretrained(directory)
    return ref.float()


@pytest.fixture(scope="module", params=FAMILIES, ids=[f"{f}-{'tied' if t else 'untied'}" for f, t in FAMILIES])
def checkpoint(request, tmp_path_factory):
    family, tied = request.param
    directory = tmp_path_factory.mktemp(f"{family}-{tied}")
    return family, tied, reference_checkpoint(family, tied, directory), directory


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    """(transformers reference, directory) of the tiny tied Gemma 3 (``GEMMA3_TINY``)."""
    directory = tmp_path_factory.mktemp("gemma3")
    return reference_checkpoint("gemma3", True, directory), directory


def test_golden_logits_on_a_left_padded_batch(checkpoint):
    family, tied, ref, directory = checkpoint
    model = hf.load(directory)
    assert model.config.family == family and model.config.tie_word_embeddings == tied
    tokens, mask = left_padded_batch()
    want = reference_logits(ref, tokens, mask)
    got = np.asarray(model(jnp.asarray(tokens), jnp.asarray(mask)))
    assert np.abs(got - want)[mask > 0].max() <= 1e-4


def test_save_then_transformers_from_pretrained_gives_the_same_logits(checkpoint, tmp_path):
    _, _, ref, directory = checkpoint
    hf.save(hf.load(directory), tmp_path)
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    tokens, mask = left_padded_batch()
    np.testing.assert_allclose(reference_logits(back, tokens, mask)[mask > 0],
                               reference_logits(ref, tokens, mask)[mask > 0], atol=1e-6)


def test_llama3_rope_scaling_is_read_and_changes_the_frequencies(checkpoint):
    family, _, _, directory = checkpoint
    if family != "llama":
        pytest.skip("llama only")
    config = hf.load(directory).config
    assert dict(config.rope_scaling)["factor"] == 8.0
    plain = rope_frequencies(ModelConfig(**{**config.__dict__, "rope_scaling": None}))
    assert np.abs(np.asarray(rope_frequencies(config)) - np.asarray(plain)).max() > 1e-3


def test_hidden_states_feed_the_memory_efficient_log_probs(checkpoint):
    _, _, _, directory = checkpoint
    model = hf.load(directory)
    tokens, mask = left_padded_batch()
    hidden = model(jnp.asarray(tokens), jnp.asarray(mask), return_hidden=True)
    logits = model(jnp.asarray(tokens), jnp.asarray(mask))
    targets = jnp.asarray(tokens[:, 1:])
    plain = token_logprobs(logits[:, :-1], targets)
    chunked, _ = chunked_logprobs_and_entropy(hidden[:, :-1], model.unembedding(), targets, chunk_size=5)
    np.testing.assert_allclose(np.asarray(chunked), np.asarray(plain), atol=1e-5)


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_every_weight_has_logical_axes_of_its_rank(family):
    config = ModelConfig(family=family, vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=4)
    model = CausalLM(config, nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    leaves = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    assert len(leaves) > 10
    for variable in leaves:
        axes = variable.get_metadata()["logical_axes"]
        assert len(axes) == variable[...].ndim
        assert set(axes) <= {"vocab", "embed", "heads", "kv_heads", "head_dim", "mlp", "norm"}


def test_a_model_holding_host_arrays_saves_the_same_tensors(tmp_path):
    """The runner saves parameters gathered to NumPy; transposed views must be written in logical order."""
    config = ModelConfig(family="qwen2", vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=4, tie_word_embeddings=False)
    model = CausalLM(config, nnx.Rngs(0))
    graphdef, state = nnx.split(model)
    hf.save(model, tmp_path / "device")
    hf.save(nnx.merge(graphdef, jax.tree.map(np.asarray, state)), tmp_path / "host")
    jax.tree.map(np.testing.assert_array_equal, nnx.state(hf.load(tmp_path / "device")),
                 nnx.state(hf.load(tmp_path / "host")))


def test_bad_checkpoints_raise_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        hf.load(tmp_path)
    config = tiny_hf_config("qwen2", False)
    config.save_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors weights"):
        hf.load(tmp_path)
    gpt2 = tmp_path / "gpt2"
    transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16).save_pretrained(gpt2)
    with pytest.raises(ValueError, match="unsupported architecture 'gpt2'"):
        hf.load(gpt2)
    for family, setting in (("llama", {"hidden_act": "gelu"}), ("llama", {"attention_bias": True}),
                            ("qwen3", {"use_sliding_window": True}), ("gemma3", {"hidden_activation": "gelu"}),
                            ("gemma3", {"final_logit_softcapping": 30.0}), ("gemma3", {"attn_logit_softcapping": 50.0}),
                            ("gemma3", {"use_bidirectional_attention": True})):
        config = tiny_hf_config(family, False)
        for name, value in setting.items():
            setattr(config, name, value)
        with pytest.raises(ValueError, match=f"unsupported {config.model_type} settings {name}={value!r}"):
            hf.config_from_hf(config)


def test_a_weight_whose_shape_disagrees_with_the_config_raises(tmp_path):
    config = ModelConfig(family="llama", vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=4)
    hf.save(CausalLM(config, nnx.Rngs(0)), tmp_path)
    text = json.loads((tmp_path / "config.json").read_text())
    text["intermediate_size"] = 10
    (tmp_path / "config.json").write_text(json.dumps(text))
    with pytest.raises(ValueError, match="mlp.gate_proj.weight: shape"):
        hf.load(tmp_path)


@pytest.mark.parametrize("family", ["qwen2", "gemma3"])
def test_bfloat16_checkpoint_loads_and_runs_in_bfloat16(family, tmp_path):
    torch = pytest.importorskip("torch", reason="needs torch to write a bf16 checkpoint")
    ref = reference_checkpoint(family, False, tmp_path, dtype=torch.bfloat16, seed=1)
    model = hf.load(tmp_path, param_dtype="bfloat16", compute_dtype="bfloat16")
    assert model.embed[...].dtype == jnp.bfloat16
    tokens, mask = left_padded_batch()
    got = np.asarray(model(jnp.asarray(tokens), jnp.asarray(mask)).astype(jnp.float32))
    want = reference_logits(ref, tokens, mask)
    # bf16 compute vs the same bf16 weights computed in float32: logits ~1, measured error ~7e-3
    assert np.abs(want).max() > 0.5
    assert np.abs(got - want)[mask > 0].max() < 0.03


def test_a_transformers_checkpoint_loads_samples_and_saves_back_losslessly(checkpoint, tmp_path):
    from safetensors.numpy import load_file

    from pgjax.sample import SamplingConfig, generate
    _, _, _, directory = checkpoint
    save_tiny_tokenizer(directory)
    tokenizer = hf.load_tokenizer(directory)
    model = hf.load(directory)
    prompt = np.asarray([tokenizer("12+3=")["input_ids"]])
    samples = generate(model, prompt, np.ones_like(prompt), jax.random.key(0),
                       SamplingConfig(max_new_tokens=6, eos_ids=(tokenizer.eos_token_id,), n=2))
    assert samples.response.shape == (2, 6)
    assert tokenizer.decode(np.asarray(samples.tokens[0, :5])) == "12+3="
    hf.save(model, tmp_path, tokenizer_dir=directory)
    original, written = load_file(str(directory / "model.safetensors")), load_file(str(tmp_path / "model.safetensors"))
    assert set(original) == set(written)
    for name, value in original.items():
        np.testing.assert_array_equal(written[name], value, err_msg=name)
    assert hf.load_tokenizer(tmp_path)("12+3=")["input_ids"] == list(prompt[0])


def test_a_directory_without_tokenizer_files_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        hf.load_tokenizer(tmp_path)


def test_eos_token_ids_join_the_tokenizer_and_generation_config(tmp_path):
    class Tok:
        eos_token_id = 1
    assert hf.eos_token_ids(tmp_path, Tok()) == (1,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 1]}))
    assert hf.eos_token_ids(tmp_path, Tok()) == (1, 7)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 9}))
    assert hf.eos_token_ids(tmp_path, Tok()) == (1, 9)


TEMPLATES = {"default": "{% for m in messages %}{{ m['role'] }}={{ m['content'] }}<eos>{% endfor %}",
             "tool_use": "{% for m in messages %}{{ m['content'] }}{% endfor %}"}


@pytest.mark.parametrize("family, token_ids, chat_template", [
    ("llama", {"bos_token_id": 3, "eos_token_id": [1, 4], "pad_token_id": 0}, TEMPLATES["default"]),
    ("qwen2", {"bos_token_id": None, "eos_token_id": 1, "pad_token_id": None}, TEMPLATES)],
    ids=["llama-all-ids-one-template", "qwen2-unset-ids-named-templates"])
def test_save_keeps_the_config_chat_template_and_generation_config(family, token_ids, chat_template, tmp_path):
    """load -> save(tokenizer_dir=source) keeps config.json's context length and token ids, the chat
    template(s) (transformers 5's chat_template.jinja and additional_chat_templates/) and generation_config."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    source, out = tmp_path / "source", tmp_path / "out"
    config = tiny_hf_config(family, True)
    for name, value in {"max_position_embeddings": 8192, **token_ids}.items():
        setattr(config, name, value)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(source)
    save_tiny_tokenizer(source, chat_template)
    hf.save(hf.load(source), out, tokenizer_dir=source)
    want, got = transformers.AutoConfig.from_pretrained(source), transformers.AutoConfig.from_pretrained(out)
    for name in ("max_position_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(got, name) == getattr(want, name), name
    assert got.max_position_embeddings == 8192 and got.eos_token_id == token_ids["eos_token_id"]
    written = json.loads((out / "config.json").read_text())
    assert [k for k, v in token_ids.items() if v is None] == [k for k in token_ids if k not in written]
    assert hf.load(out).config == hf.load(source).config
    assert transformers.AutoTokenizer.from_pretrained(out).chat_template == chat_template
    assert (out / "generation_config.json").read_text() == (source / "generation_config.json").read_text()


def test_load_runs_no_random_initialiser_and_gives_an_ordinary_model(checkpoint, monkeypatch):
    """The model is built abstractly (the initialiser is only traced, never draws numbers) and ends up
    the same graph, variable metadata, shapes and dtypes as a ``CausalLM`` built the usual way, every
    variable a concrete array."""
    _, _, _, directory = checkpoint
    draw = jax.random.normal

    def traced_only(key, *args, **kwargs):
        assert isinstance(key, jax.core.Tracer), "hf.load drew random initial weights"
        return draw(key, *args, **kwargs)

    monkeypatch.setattr(jax.random, "normal", traced_only)
    model = hf.load(directory)
    monkeypatch.undo()
    usual = CausalLM(model.config, nnx.Rngs(0))
    assert nnx.graphdef(model) == nnx.graphdef(usual)
    assert jax.tree.map(jax.typeof, nnx.state(model)) == jax.tree.map(jax.typeof, nnx.state(usual))
    leaves = jax.tree.leaves(nnx.state(model))
    assert leaves and all(isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) for x in leaves)


def test_a_model_variable_without_a_checkpoint_weight_raises(tmp_path, monkeypatch):
    config = ModelConfig(family="llama", vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=4)
    hf.save(CausalLM(config, nnx.Rngs(0)), tmp_path)
    layout = hf._layout
    monkeypatch.setattr(hf, "_layout", lambda c: layout(c)[:-1])
    with pytest.raises(RuntimeError, match="no checkpoint weight maps to .*post_attention_norm"):
        hf.load(tmp_path)


# --------------------------------------------------------------------------------------- Gemma 3


def test_gemma3_config_is_read_and_the_rope_frequencies_follow_it(gemma):
    """The layer types, window, query scale and both RoPE bases come from config.json; the global layers'
    frequencies are the linear-scaled ones and the local layers' unscaled (float64 reference)."""
    _, directory = gemma
    c = hf.load(directory).config
    assert (c.family, c.layer_types, c.sliding_window, c.query_pre_attn_scalar) == (
        "gemma3", tuple(GEMMA3_TINY["layer_types"]), 4, 24)
    assert (c.rope_theta, c.rope_local_theta, dict(c.rope_scaling)) == (
        50000.0, 1000.0, {"rope_type": "linear", "factor": 2.0})
    assert c.layer_kinds == (1, 0, 1)
    exponents = np.arange(0, 16, 2, dtype=np.float64) / 16
    np.testing.assert_allclose(rope_frequencies(c), 50000.0 ** -exponents / 2, rtol=1e-6)
    np.testing.assert_allclose(rope_frequencies(c, sliding=True), 1000.0 ** -exponents, rtol=1e-6)


def test_gemma3_settings_outside_the_family_or_inconsistent_are_clear_errors():
    base = dict(vocab_size=16, hidden_size=8, intermediate_size=12, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=4)
    with pytest.raises(ValueError, match="sliding_window=4 is invalid: None unless family='gemma3'"):
        ModelConfig(family="llama", sliding_window=4, **base)
    with pytest.raises(ValueError, match="layer_types=.* is invalid: num_hidden_layers=2 names"):
        ModelConfig(family="gemma3", layer_types=("full_attention",), **base)
    with pytest.raises(ValueError, match="sliding_window=None is invalid: set: layer_types has sliding"):
        ModelConfig(family="gemma3", layer_types=("sliding_attention", "full_attention"), rope_local_theta=1e4,
                    **base)
    config = ModelConfig(family="gemma3", layer_types=["sliding_attention", "full_attention"], sliding_window=2,
                         rope_local_theta=1e4, **base)
    assert config.layer_types == ("sliding_attention", "full_attention") and config.layer_kinds == (1, 0)


def test_a_new_gemma3_model_saves_a_checkpoint_transformers_runs(tmp_path):
    """A random Gemma 3 as an experiment's model section builds it (every layer global, no window set)."""
    torch = pytest.importorskip("torch")
    config = ModelConfig(family="gemma3", vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True)
    model = CausalLM(config, nnx.Rngs(0))
    hf.save(model, tmp_path)
    reference = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    tokens, mask = left_padded_batch()
    tokens = tokens % 40
    want = reference_logits(reference, tokens, mask)
    assert np.abs(np.asarray(model(jnp.asarray(tokens), jnp.asarray(mask))) - want)[mask > 0].max() <= 1e-5
    assert hf.load(tmp_path).config.layer_kinds == (0, 0)


GEMMA_OPTIONS = [{}, dict(scan_layers=True), dict(remat="save_nothing"), dict(scan_layers=True, remat="save_matmuls")]


@pytest.mark.slow
@pytest.mark.parametrize("options", GEMMA_OPTIONS, ids=lambda o: "+".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_gemma3_cache_decode_scan_and_remat_give_the_reference_logits(gemma, options):
    """12-slot left-padded rows (3 x the window): the full forward equals transformers; a 7-token prefill
    then 5 one-token KV-cache steps give the same logits (the window applies to the cache too)."""
    ref, directory = gemma
    model = hf.load(directory, **options)
    tokens, mask = left_padded_batch(12)
    want = reference_logits(ref, tokens, mask)
    full = np.asarray(model(jnp.asarray(tokens), jnp.asarray(mask)))
    assert np.abs(full - want)[mask > 0].max() <= 1e-4
    key_mask = jnp.asarray(mask)
    logits, cache = model.decode(jnp.asarray(tokens[:, :7]), key_mask, model.init_cache(3, 12), 0)
    steps = [logits]
    for i in range(7, 12):
        logits, cache = model.decode(jnp.asarray(tokens[:, i:i + 1]), key_mask, cache, i)
        steps.append(logits)
    decoded = np.asarray(jnp.concatenate(steps, 1))
    assert np.abs(decoded - full)[mask > 0].max() <= 1e-5


@pytest.mark.slow
def test_gemma3_stacked_layers_under_remat_give_the_plain_gradients(gemma):
    """Local and global layers in one ``lax.scan`` (each layer's kind scanned data) under remat: the same
    loss and per-layer gradients as the unrolled model."""
    _, directory = gemma
    tokens, mask = (jnp.asarray(x) for x in left_padded_batch(12))

    def loss_and_grads(model):
        graphdef, params = nnx.split(model, nnx.Param)

        def loss(p):
            logp = token_logprobs(nnx.merge(graphdef, p)(tokens, mask)[:, :-1], tokens[:, 1:])
            return -(logp * mask[:, 1:]).sum() / mask[:, 1:].sum()
        return jax.value_and_grad(loss)(params)

    plain = hf.load(directory)
    scanned = hf.load(directory, scan_layers=True, remat="save_nothing")
    (want_loss, want), (got_loss, got) = loss_and_grads(plain), loss_and_grads(scanned)
    np.testing.assert_allclose(got_loss, want_loss, rtol=1e-6)
    want, got = per_layer(want, plain.config), per_layer(got, scanned.config)
    assert got.keys() == want.keys() and len(want) == 3 * 13 + 2
    for name in want:      # summation orders differ: measured up to 2e-7 on gradients up to 0.1
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=str(name))


@pytest.mark.slow
def test_gemma3_lora_adapters_load_into_peft_and_merge(gemma, tmp_path):
    """Adapters on all seven projections of the local and global layers: PEFT on transformers' Gemma 3 and
    the merged checkpoint reproduce the adapted pgjax logits."""
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    _, directory = gemma
    model = hf.load(directory, lora=lora.LoRAConfig(rank=4, alpha=8.0))
    adapters = nnx.state(model, lora.LoRAParam)
    keys = iter(jax.random.split(jax.random.key(7), len(jax.tree.leaves(adapters))))
    nnx.update(model, jax.tree.map(lambda x: x + 0.1 * jax.random.normal(next(keys), x.shape), adapters))
    tokens, mask = left_padded_batch(12)
    want = np.asarray(model(jnp.asarray(tokens), jnp.asarray(mask)))
    assert np.abs(want - np.asarray(hf.load(directory)(jnp.asarray(tokens), jnp.asarray(mask)))).max() > 1e-2
    hf.save_peft(model, tmp_path / "adapter", base_model=str(directory))
    base = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
    with_adapter = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    hf.save(lora.merged(model), tmp_path / "merged")
    merged = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    for reference in (with_adapter, merged):
        np.testing.assert_allclose(reference_logits(reference, tokens, mask)[mask > 0], want[mask > 0],
                                   rtol=1e-4, atol=1e-5)


def attention_reference(q, k, v, allowed, query_scale):
    """float64 NumPy softmax(q k^T / sqrt(s)) v over the allowed keys, each query head h reading key head
    h // (H / KV): q [B, T, H, D], k, v [B, KV, S, D], allowed [B, T, S]."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    group = q.shape[2] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)             # [B, H, S, D]
    scores = np.einsum("bthd,bhsd->bhts", q, k) / np.sqrt(query_scale or q.shape[-1])
    scores = np.where(allowed[:, None], scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights = np.where(allowed[:, None], weights, 0.0)
    return np.einsum("bhts,bhsd->bthd", weights / weights.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("window, query_scale, new", [(None, None, 5), (3, 256.0, 5), (None, None, 1), (2, None, 1)])
def test_fused_attention_and_the_einsum_agree_with_a_float64_reference(window, query_scale, new):
    """``fused_attention`` (jax.nn.dot_product_attention, here lowered by XLA: the call model.attention=cudnn
    makes on a GPU) and the einsum give the same attention as NumPy in float64, with grouped query heads,
    left padding, a sliding window, Gemma's query scale, and a KV cache read after ``new`` new tokens."""
    batch, slots, heads, kv_heads, d = 2, 7, 4, 2, 8
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (batch, new, heads, d))
    k, v = (jax.random.normal(key, (batch, kv_heads, slots, d)) for key in keys[1:])
    mask = jnp.asarray([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    positions = jnp.maximum(jnp.cumsum(mask, 1) - 1, 0)
    index = slots - new
    bias = attention_bias(mask, positions, index, new, window)
    query_slots = index + np.arange(new)
    allowed = (np.arange(slots)[None, :] <= query_slots[:, None])[None] & (np.asarray(mask)[:, None, :] > 0)
    if window is not None:
        pos = np.asarray(positions)
        allowed &= pos[:, query_slots][:, :, None] - pos[:, None, :] < window
    want = attention_reference(q, k, v, allowed, query_scale)
    for got in (grouped_query_attention(q, k, v, bias, query_scale),
                jax.jit(fused_attention, static_argnames=("query_scale", "implementation"))(q, k, v, bias, query_scale,
                                                                            implementation="xla")):
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-5, atol=1e-5)
    bf16 = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    np.testing.assert_allclose(np.asarray(fused_attention(*bf16, bias, query_scale, "xla"), np.float64),
                               np.asarray(grouped_query_attention(*bf16, bias, query_scale), np.float64), atol=2e-2)


def test_cudnn_attention_is_refused_without_bfloat16_or_off_a_gpu():
    with pytest.raises(ConfigError, match="model.attention='cudnn' is invalid: einsum with compute_dtype=float32"):
        ModelConfig(family="llama", vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=1, head_dim=4, attention="cudnn")
    config = ModelConfig(family="llama", vocab_size=8, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=4, attention="cudnn",
                         compute_dtype="bfloat16")
    with pytest.raises(ConfigError, match=r"needs an NVIDIA GPU with cuDNN; this process's JAX devices are cpu"):
        CausalLM(config, nnx.Rngs(0))


def test_a_model_with_fused_attention_gives_the_einsums_logits_and_cached_decoding(monkeypatch):
    """``model.attention=cudnn`` through the whole model, its cuDNN call swapped for the same call lowered by
    XLA (this CPU has no cuDNN) and the backend check let through: the logits of a left-padded batch and of
    a KV-cache decode equal the einsum model's (bfloat16 compute, as cudnn requires)."""
    import functools

    from pgjax.models import transformer
    from pgjax.sample import SamplingConfig, generate
    monkeypatch.setattr(transformer, "check_attention_backend", lambda config: None)
    monkeypatch.setattr(transformer, "fused_attention", functools.partial(fused_attention, implementation="xla"))
    options = dict(family="llama", vocab_size=16, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, compute_dtype="bfloat16")
    einsum = CausalLM(ModelConfig(**options), nnx.Rngs(0))
    fused = CausalLM(ModelConfig(**options, attention="cudnn"), nnx.Rngs(0))
    tokens = jnp.asarray([[0, 0, 3, 4, 5, 6, 7], [2, 3, 4, 5, 6, 7, 8]])
    mask = (tokens > 0).astype(jnp.int32)
    logits = [np.asarray(model(tokens, mask), np.float32) for model in (einsum, fused)]
    np.testing.assert_allclose(logits[1], logits[0], atol=3e-2)
    config = SamplingConfig(max_new_tokens=5, eos_ids=(), n=2)
    decoded = [generate(model, tokens, mask, jax.random.key(1), config) for model in (einsum, fused)]
    np.testing.assert_array_equal(np.asarray(decoded[1].tokens), np.asarray(decoded[0].tokens))
    np.testing.assert_allclose(np.asarray(decoded[1].policy_logprobs), np.asarray(decoded[0].policy_logprobs),
                               atol=5e-2)


@pytest.mark.parametrize("window, query_scale, block", [(None, None, 3), (3, 256.0, 2), (None, None, 128)])
def test_blockwise_attention_and_its_gradients_equal_the_einsums_in_float64(x64, window, query_scale, block):
    """``blockwise_attention`` (model.attention=blockwise: keys in blocks with a running softmax, a backward
    pass of its own) against NumPy's float64 attention, and its gradients in q, k and v against the einsum's
    autodiff gradients, in float64: grouped query heads, left padding, a sliding window, Gemma's query
    scale; blocks of 3 and 2 keys over 7 (the last block padded) and one block holding them all."""
    batch, slots, heads, kv_heads, d = 2, 7, 4, 2, 8
    keys = jax.random.split(jax.random.key(1), 4)
    q = jax.random.normal(keys[0], (batch, slots, heads, d), jnp.float64)
    k, v = (jax.random.normal(key, (batch, kv_heads, slots, d), jnp.float64) for key in keys[1:3])
    mask = jnp.asarray([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]])
    positions = jnp.maximum(jnp.cumsum(mask, 1) - 1, 0)
    bias = attention_bias(mask, positions, 0, slots, window)
    allowed = np.tril(np.ones((slots, slots), bool))[None] & (np.asarray(mask)[:, None, :] > 0)
    if window is not None:
        pos = np.asarray(positions)
        allowed &= pos[:, :, None] - pos[:, None, :] < window
    real = np.asarray(mask, bool)                    # a left-padding query row sees no key: its output is unused
    got = jax.jit(blockwise_attention, static_argnums=(4, 5))(q, k, v, bias, query_scale, block)
    with np.errstate(invalid="ignore"):              # the reference's 0 / 0 on the rows that see no key
        want = attention_reference(q, k, v, allowed, query_scale)
    np.testing.assert_allclose(np.asarray(got)[real], want[real], rtol=1e-12, atol=1e-12)
    weights = jax.random.normal(keys[3], q.shape, jnp.float64) * jnp.asarray(mask)[:, :, None, None]

    def loss(attention):
        return lambda q, k, v: jnp.sum(attention(q, k, v) * weights)
    blockwise = loss(lambda q, k, v: blockwise_attention(q, k, v, bias, query_scale, block))
    einsum = loss(lambda q, k, v: grouped_query_attention(q, k, v, bias, query_scale))
    for got, want in zip(jax.jit(jax.grad(blockwise, argnums=(0, 1, 2)))(q, k, v),
                         jax.grad(einsum, argnums=(0, 1, 2))(q, k, v), strict=True):
        assert float(jnp.abs(want).max()) > 0.1                   # a gradient that could be wrong
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-10)


def test_a_model_with_blockwise_attention_gives_the_einsums_logits_gradients_and_samples():
    """``model.attention=blockwise`` through a whole model (stacked layers under remat, as a run's
    defaults): the logits of a left-padded batch and the gradient of a loss equal the einsum model's, the
    vmapped forward of two models too, and the sampler (which keeps the einsum with its KV cache) draws
    the same tokens."""
    from pgjax.sample import SamplingConfig, generate
    options = dict(family="llama", vocab_size=16, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, scan_layers=True, remat="save_nothing")
    einsum = CausalLM(ModelConfig(**options), nnx.Rngs(0))
    blockwise = CausalLM(ModelConfig(**options, attention="blockwise"), nnx.Rngs(0))
    tokens = jnp.asarray([[0, 0, 3, 4, 5, 6, 7], [2, 3, 4, 5, 6, 7, 8]])
    mask = (tokens > 0).astype(jnp.int32)
    logits = [np.asarray(model(tokens, mask)) for model in (einsum, blockwise)]
    np.testing.assert_allclose(logits[1], logits[0], rtol=1e-5, atol=1e-5)

    def loss(model):
        return jnp.sum(jax.nn.log_softmax(model(tokens, mask))[..., 1] * mask)
    grads = [nnx.grad(loss)(model) for model in (einsum, blockwise)]
    close = lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)  # noqa: E731
    jax.tree.map(close, nnx.state(grads[1]), nnx.state(grads[0]))
    config = SamplingConfig(max_new_tokens=5, eos_ids=(), n=2)
    decoded = [generate(model, tokens, mask, jax.random.key(1), config) for model in (einsum, blockwise)]
    np.testing.assert_array_equal(np.asarray(decoded[1].tokens), np.asarray(decoded[0].tokens))
