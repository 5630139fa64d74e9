"""The model's memory and compile options against the plain float32 forward:
rematerialisation (``model.remat``) and scan over stacked layers (``model.scan_layers``) give the
same logits and gradients, remat under scan keeps less activation memory (XLA's compiled memory
analysis), checkpoints round-trip through Hugging Face's layout unchanged, and bad names are clear
errors. The sharded (8 simulated devices) checks of every option are in ``test_sharding.py``."""
import dataclasses
import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import per_layer

from pgjax.config import ConfigError, ModelSection
from pgjax.core import token_logprobs
from pgjax.models import hf
from pgjax.models.transformer import REMAT_POLICIES, CausalLM, ModelConfig
from pgjax.parallel import mesh as mesh_lib

CONFIG = ModelConfig(family="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8)
OPTIONS = [dict(remat="save_matmuls"), dict(remat="save_nothing"), dict(scan_layers=True),
           dict(scan_layers=True, remat="save_matmuls"), dict(scan_layers=True, remat="save_nothing")]


def batch(rows, length, seed=0):
    """Random tokens, left-padded: row b has b % 3 padding slots."""
    tokens = jax.random.randint(jax.random.PRNGKey(seed), (rows, length), 0, CONFIG.vocab_size)
    mask = (jnp.arange(length)[None, :] >= (jnp.arange(rows) % 3)[:, None]).astype(jnp.int32)
    return tokens, mask


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """One random model saved in Hugging Face's layout: every option loads the same weights."""
    directory = tmp_path_factory.mktemp("options")
    hf.save(CausalLM(CONFIG, nnx.Rngs(0)), directory)
    return directory


def nll_and_gradient(model: CausalLM):
    """(params, jitted value_and_grad of the mean next-token NLL) of ``model``."""
    graphdef, params = nnx.split(model, nnx.Param)
    return params, _nll_gradient(graphdef)


@functools.cache
def _nll_gradient(graphdef):
    """One jitted function per model structure: tests of equal models reuse its traces (memoized)."""
    def loss(p, tokens, mask):
        logp = token_logprobs(nnx.merge(graphdef, p)(tokens, mask)[:, :-1], tokens[:, 1:])
        return -(logp * mask[:, 1:]).sum() / mask[:, 1:].sum()

    return jax.jit(jax.value_and_grad(loss))


@pytest.mark.slow
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "+".join(f"{k}={v}" for k, v in o.items()))
def test_every_option_gives_the_plain_logits_loss_and_gradients(checkpoint, options):
    tokens, mask = batch(4, 12)
    plain, model = hf.load(checkpoint), hf.load(checkpoint, **options)
    np.testing.assert_allclose(model(tokens, mask), plain(tokens, mask), rtol=1e-5, atol=1e-5)
    params, step = nll_and_gradient(plain)
    expected_loss, expected = step(params, tokens, mask)
    params, step = nll_and_gradient(model)
    loss, grads = step(params, tokens, mask)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-6)
    want, got = per_layer(expected, plain.config), per_layer(grads, model.config)
    assert got.keys() == want.keys()
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-7, err_msg=str(name))


@pytest.mark.slow
def test_stacked_layers_decode_with_the_kv_cache_like_the_full_forward(checkpoint):
    model = hf.load(checkpoint, scan_layers=True)
    tokens, _ = batch(2, 9)
    full = model(tokens)
    key_mask = jnp.ones((2, 9), jnp.int32)
    logits, cache = model.decode(tokens[:, :6], key_mask, model.init_cache(2, 9), 0)
    step_logits, _ = model.decode(tokens[:, 6:], key_mask, cache, 6)
    np.testing.assert_allclose(jnp.concatenate([logits, step_logits], 1), full, rtol=1e-5, atol=1e-5)


def test_the_sampler_draws_the_same_tokens_from_stacked_layers(checkpoint):
    """``generate`` unstacks the layers once before its decode loop (``CausalLM.unstack_layers``):
    the same tokens and log-probs as the unrolled model, and the caller's model keeps its layout."""
    from pgjax.sample import SamplingConfig, generate
    stacked, plain = hf.load(checkpoint, scan_layers=True), hf.load(checkpoint)
    tokens, mask = batch(4, 6)
    config = SamplingConfig(max_new_tokens=5, eos_ids=(1,), pad_id=0, temperature=1.0, n=2)
    key = jax.random.key(3)
    got, want = generate(stacked, tokens, mask, key, config), generate(plain, tokens, mask, key, config)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=1e-5, atol=1e-6)
    assert stacked.config.scan_layers and stacked.layers.mlp.gate.get_value().ndim == 3
    stacked.unstack_layers()
    assert not stacked.config.scan_layers and len(stacked.layers) == CONFIG.num_hidden_layers
    np.testing.assert_allclose(stacked(tokens, mask), plain(tokens, mask), rtol=1e-5, atol=1e-5)


def test_stacked_layers_carry_a_replicated_layer_axis_and_shard_like_the_unrolled_ones():
    model = CausalLM(dataclasses.replace(CONFIG, scan_layers=True), nnx.Rngs(0))
    gate = model.layers.mlp.gate
    assert gate.get_value().shape == (CONFIG.num_hidden_layers, 32, 64)
    assert gate.get_metadata()["logical_axes"] == ("layers", "embed", "mlp")
    mesh = mesh_lib.single_device_mesh()
    assert mesh_lib.partition_spec(("layers", "embed", "mlp"), gate.get_value().shape, mesh)[0] is None


def test_hugging_face_checkpoints_round_trip_through_the_stacked_layout(checkpoint, tmp_path):
    hf.save(hf.load(checkpoint, scan_layers=True), tmp_path)
    from safetensors.numpy import load_file
    saved, original = load_file(str(tmp_path / "model.safetensors")), load_file(str(checkpoint / "model.safetensors"))
    assert saved.keys() == original.keys()
    for name in original:
        np.testing.assert_array_equal(saved[name], original[name], err_msg=name)


def temporary_bytes(remat, scan_layers=True) -> int:
    """XLA's temporary memory of the compiled value-and-gradient at 8 x 256 tokens."""
    config = dataclasses.replace(CONFIG, hidden_size=64, intermediate_size=128, num_hidden_layers=4, remat=remat,
                                 scan_layers=scan_layers)
    params, step = nll_and_gradient(CausalLM(config, nnx.Rngs(0)))
    return step.lower(params, *batch(8, 256)).compile().memory_analysis().temp_size_in_bytes


@pytest.mark.slow
def test_remat_over_scanned_layers_keeps_less_activation_memory():
    """Under scan each policy saves memory on XLA's CPU backend too (unrolled layers under
    ``jax.checkpoint`` are not rematerialised there: XLA CPU keeps the forward's buffers)."""
    used = {policy: temporary_bytes(policy) for policy in REMAT_POLICIES}
    assert used["save_nothing"] < 0.5 * used["off"], used       # per layer: its input instead of ~8 [B, H, T, T]s
    assert used["save_matmuls"] < used["off"], used


def test_options_survive_a_checkpoint_round_trip_and_stay_out_of_config_json(tmp_path):
    hf.save(CausalLM(dataclasses.replace(CONFIG, scan_layers=True, remat="save_nothing"), nnx.Rngs(0)), tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())
    assert "remat" not in written and "scan_layers" not in written
    model = hf.load(tmp_path, remat="save_nothing")
    assert model.config.remat == "save_nothing" and not model.config.scan_layers
    tokens, mask = batch(2, 8)
    np.testing.assert_allclose(model(tokens, mask), hf.load(tmp_path, scan_layers=True)(tokens, mask), rtol=1e-6,
                               atol=1e-6)


def test_unknown_names_are_clear_errors(checkpoint):
    with pytest.raises(ConfigError, match=r"^model.remat='sometimes' is invalid: one of \('off'"):
        dataclasses.replace(CONFIG, remat="sometimes")
    with pytest.raises(ConfigError, match=r"model.remat='sometimes' is invalid: one of \('off'"):
        ModelSection(remat="sometimes")
    with pytest.raises(ConfigError, match="model.num_key_value_heads=3 is invalid: a divisor of num_attention_heads=4"):
        ModelSection(num_attention_heads=4, num_key_value_heads=3)
    with pytest.raises(TypeError, match=r"unknown model options \['scan'\]"):
        hf.load(checkpoint, scan=True)


def test_the_model_section_is_model_configs_fields_and_checks():
    """The experiment's model section names ModelConfig's fields (plus the checkpoint path and the LoRA
    section) and builds the same config; ModelConfig's checks are the section's."""
    section = {f.name for f in dataclasses.fields(ModelSection)} - {"path"}
    assert section <= {f.name for f in dataclasses.fields(ModelConfig)}
    config = ModelSection().config(vocab_size=11)
    assert all(getattr(config, name) == getattr(ModelSection(), name) for name in section - {"lora"})
    for field, bad in (("hidden_size", 0), ("rms_norm_eps", 0.0), ("param_dtype", "float16"), ("family", "gpt2")):
        with pytest.raises(ConfigError, match=f"^model.{field}={bad!r} is invalid"):
            dataclasses.replace(CONFIG, **{field: bad})
        with pytest.raises(ConfigError, match=f"^model.{field}={bad!r} is invalid"):
            ModelSection(**{field: bad})


@pytest.mark.slow
def test_bfloat16_compute_training_tracks_the_float32_run(tmp_path):
    """float32 weights and AdamW state, bfloat16 activations and matmuls (``compute_dtype``): six GRPO
    steps on the tiny emit-x task raise p(x) as the float32 run does, within 0.02,
    and the first step's gradient norm (the same rollout: samples have not diverged yet) agrees to 2%."""
    from helpers import EMIT_X, EmitX, p_first_x, tiny_experiment

    from pgjax.train.trainer import Trainer, train

    tokenizer, results = EmitX().tokenizer(), {}
    for dtype in ("float32", "bfloat16"):
        exp = tiny_experiment(tmp_path / dtype, algorithm="grpo", steps=6, task=EMIT_X, eval_every=10)
        exp = dataclasses.replace(exp, model=dataclasses.replace(exp.model, compute_dtype=dtype))
        before = p_first_x(Trainer(exp).policy, tokenizer)
        directory = train(exp, progress=False)
        records = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
        first = next(r for r in records if "grad_norm" in r)
        results[dtype] = (before, p_first_x(hf.load(directory / "final"), tokenizer), first["grad_norm"])
    (start, p32, norm32), (_, p16, norm16) = results["float32"], results["bfloat16"]
    assert p32 > start + 0.1 and abs(p16 - p32) < 0.02, results
    assert abs(norm16 - norm32) < 2e-2 * norm32, results
