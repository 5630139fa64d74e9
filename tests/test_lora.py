"""LoRA (``pgjax.models.lora``) against the plain float32 model: a fresh adapter is the base model,
adapter gradients follow from the plain model's weight gradient by the chain rule, PEFT and plain
transformers reproduce an adapted model's logits from its exports, the learner trains only the
adapters with the base as its KL reference, and a LoRA run checkpoints only the adapters and resumes
to the uninterrupted run's result. The sharded (8 simulated devices) check is in ``test_sharding.py``."""
import dataclasses
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

from pgjax import core
from pgjax.config import ConfigError, LoRASection, OptimConfig, UpdateConfig
from pgjax.core import token_logprobs
from pgjax.models import hf, lora
from pgjax.models.lora import LoRAConfig, LoRAParam
from pgjax.models.transformer import CausalLM, ModelConfig
from pgjax.rollout.batch import Rollout
from pgjax.train.learner import Learner
from pgjax.train.optim import make_optimizer

CONFIG = ModelConfig(family="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8)
ADAPTERS = LoRAConfig(rank=4, alpha=8.0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = tmp_path_factory.mktemp("base")
    hf.save(CausalLM(CONFIG, nnx.Rngs(0)), directory)
    return directory


def tokens(rows=3, length=9, seed=1):
    return jax.random.randint(jax.random.PRNGKey(seed), (rows, length), 0, CONFIG.vocab_size)


def adapted(checkpoint, scan_layers=False, config=ADAPTERS):
    """The checkpoint with adapters whose B is no longer zero (as after training)."""
    model = hf.load(checkpoint, lora=config, scan_layers=scan_layers)
    adapters = nnx.state(model, LoRAParam)
    keys = iter(jax.random.split(jax.random.PRNGKey(7), len(jax.tree.leaves(adapters))))
    nnx.update(model, jax.tree.map(lambda x: x + 0.1 * jax.random.normal(next(keys), x.shape), adapters))
    return model


@pytest.mark.slow
def test_a_fresh_adapter_is_the_base_model_and_a_plain_save_is_refused(checkpoint, tmp_path):
    model, base = hf.load(checkpoint, lora=ADAPTERS), hf.load(checkpoint)
    np.testing.assert_allclose(model(tokens()), base(tokens()), rtol=1e-6, atol=1e-6)
    attention = model.layers[0].attention
    assert attention.q_proj_lora.a.get_value().shape == (32, 4) and attention.q_proj_lora.b.get_value().shape == (4, 32)
    assert attention.k_proj_lora.b.get_value().shape == (4, 16) and attention.o_proj_lora.a.get_value().shape == (32, 4)
    with pytest.raises(ValueError, match="has LoRA adapters"):
        hf.save(model, tmp_path)


def nll(model, x):
    logp = token_logprobs(model(x)[:, :-1], x[:, 1:])
    return -logp.mean()


@pytest.mark.slow
@pytest.mark.parametrize("scan_layers", [False, True])
def test_adapter_gradients_follow_from_the_weight_gradient_by_the_chain_rule(checkpoint, scan_layers):
    """W_eff = W + s A B, so dL/dA = s G B^T and dL/dB = s A^T G with G = dL/dW_eff, the gradient of
    the plain (merged) model."""
    model, x = adapted(checkpoint, scan_layers), tokens()
    graphdef, adapters, base = nnx.split(model, LoRAParam, ...)
    grads = jax.grad(lambda a: nll(nnx.merge(graphdef, a, base), x))(adapters)
    merged = lora.merged(model)
    g_merged = jax.grad(lambda p: nll(nnx.merge(nnx.graphdef(merged), p), x))(nnx.state(merged))
    s = ADAPTERS.scale
    for module, weight, target in (("attention", "q", "q_proj"), ("attention", "o", "o_proj"),
                                   ("mlp", "down", "down_proj"), ("attention", "v", "v_proj")):
        layers = range(CONFIG.num_hidden_layers)
        for i in layers:
            pick = (lambda v, i=i: v[i]) if scan_layers else (lambda v: v)
            where = (lambda t: t["layers"]) if scan_layers else (lambda t, i=i: t["layers"][i])
            a = pick(np.asarray(where(nnx.state(model))[module][f"{target}_lora"]["a"][...]))
            b = pick(np.asarray(where(nnx.state(model))[module][f"{target}_lora"]["b"][...]))
            g = pick(np.asarray(where(g_merged)[module][weight][...])).reshape(a.shape[0], b.shape[1])
            got = where(grads)[module][f"{target}_lora"]
            np.testing.assert_allclose(pick(np.asarray(got["a"][...])), s * g @ b.T, rtol=2e-4, atol=1e-7)
            np.testing.assert_allclose(pick(np.asarray(got["b"][...])), s * a.T @ g, rtol=2e-4, atol=1e-7)


def test_peft_and_plain_transformers_reproduce_the_adapted_logits(checkpoint, tmp_path):
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM
    model, x = adapted(checkpoint, config=LoRAConfig(rank=4, alpha=8.0,
                                                     targets=("q_proj", "v_proj", "up_proj"))), tokens()
    want = np.asarray(model(x))
    hf.save_peft(model, tmp_path / "adapter", base_model=os.path.relpath(checkpoint))   # recorded absolute
    written = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert written["base_model_name_or_path"] == str(checkpoint.resolve())
    assert written["r"] == 4 and written["lora_alpha"] == 8.0 and written["target_modules"] == ["q_proj", "up_proj",
                                                                                                   "v_proj"]
    assert len(load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))) == 2 * 3 * CONFIG.num_hidden_layers
    base = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    with_adapter = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    hf.save(lora.merged(model), tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    with torch.no_grad():
        for reference in (with_adapter, merged):
            got = reference(torch.tensor(np.asarray(x))).logits.numpy()
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_dropout_acts_only_with_a_key_and_bad_settings_are_clear_errors(checkpoint):
    model, x = adapted(checkpoint, config=LoRAConfig(rank=4, alpha=8.0, dropout=0.5)), tokens()
    assert np.abs(model(x, dropout_key=jax.random.PRNGKey(0)) - model(x)).max() > 1e-3
    np.testing.assert_array_equal(model(x), model(x))
    for bad, match in ((dict(rank=0), "model.lora.rank=0 is invalid: an integer >= 1"),
                       (dict(dropout=1.0), r"model.lora.dropout=1.0 is invalid: in \[0, 1\)"),
                       (dict(targets=("qkv",)), r"model.lora.targets=\('qkv',\) is invalid: .* \(qkv unknown\)"),
                       (dict(alpha=-1.0), "model.lora.alpha=-1.0 is invalid: a finite number > 0")):
        with pytest.raises(ConfigError, match=match):
            LoRAConfig(**bad)
    with pytest.raises(ConfigError, match="model.lora"):
        LoRASection(rank=8, targets="q_proj,attn")
    assert LoRASection().config() is None and LoRASection(rank=2, targets="q_proj, v_proj").config().targets == (
        "q_proj", "v_proj")


def rollout_of(x, group_size=4):
    response = x[:, 5:]                   # the first 5 tokens are the prompt
    rewards = (response == 7).sum(1).astype(jnp.float32) + jnp.arange(x.shape[0]) % 2
    return Rollout(tokens=x, attention_mask=jnp.ones_like(x),
                   batch=core.Batch(mask=jnp.ones(response.shape), rewards=rewards, logp=None,
                                    group_size=group_size))


@pytest.mark.slow
def test_the_learner_trains_only_the_adapters_against_the_base_as_reference(checkpoint):
    model = adapted(checkpoint)
    algo = core.preset("grpo")            # KL to the reference in the loss
    learner = Learner(model, algo, 4, UpdateConfig(), make_optimizer(OptimConfig(lr=1e-2)), None, use_reference=True)
    state = learner.init_state(model, jax.random.PRNGKey(0))
    assert state.ref_params is None                       # no second copy of the weights
    adapter_sizes = sum(x.size for x in jax.tree.leaves(nnx.state(model, LoRAParam)))
    moments = sum(x.size for x in jax.tree.leaves(state.opt_state) if x.ndim)     # Adam's (not its step counts)
    assert moments == 2 * adapter_sizes
    rollout = rollout_of(tokens(rows=8, length=9))
    prepared = learner.prepare(state, rollout, algo.hparams)
    base = hf.load(checkpoint)
    want_ref = token_logprobs(base(rollout.tokens)[:, 4:-1], rollout.tokens[:, 5:])
    np.testing.assert_allclose(prepared.batch.ref_logp, want_ref, rtol=1e-5, atol=1e-5)
    before = jax.device_get(state.params)
    state, _ = learner.update(state, prepared, algo.hparams)
    after = jax.device_get(state.params)
    frozen_before, frozen_after = lora.split_trainable(before)[1], lora.split_trainable(after)[1]
    jax.tree.map(np.testing.assert_array_equal, frozen_after, frozen_before)
    moved = [np.abs(a - b).max() for a, b in zip(jax.tree.leaves(lora.split_trainable(after)[0]),
                                                  jax.tree.leaves(lora.split_trainable(before)[0]), strict=True)]
    assert min(moved) > 0


@pytest.mark.slow
def test_a_lora_run_checkpoints_only_the_adapters_and_resumes_to_the_uninterrupted_result(tmp_path):
    from helpers import EMIT_X, tiny_experiment

    from pgjax.train.checkpoints import Checkpoints, layout
    from pgjax.train.trainer import train
    exp = lambda name, steps: dataclasses.replace(                                          # noqa: E731
        tiny_experiment(tmp_path / name, algorithm="grpo", steps=steps, task=EMIT_X, checkpoint_every=1,
                        eval_every=10),
        model=dataclasses.replace(tiny_experiment(tmp_path).model, lora=LoRASection(rank=2, dropout=0.1)))
    straight = train(exp("straight", 3), progress=False)
    train(exp("resumed", 2), progress=False)
    resumed = train(exp("resumed", 3), resume=True, progress=False, accept_changes=True)
    for name in ("final/model.safetensors", "final/adapter/adapter_model.safetensors"):
        want, got = load_file(str(straight / name)), load_file(str(resumed / name))
        assert want.keys() == got.keys()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=key)
    checkpoints = Checkpoints(straight / "checkpoints")
    metadata = checkpoints.manager.item_metadata(3)["state"]
    saved = [key for key in layout(getattr(metadata, "tree", metadata)) if key.startswith("params.")]
    checkpoints.close()
    assert saved and all("_lora." in key for key in saved), saved


@pytest.mark.slow
def test_a_lora_export_names_a_base_that_peft_loads_from_another_directory(tmp_path, monkeypatch):
    """A LoRA run on a random base writes the base beside its adapter (final/base) and records its
    absolute path; an adapter on a local checkpoint given by a relative model.path records that
    checkpoint's absolute path. From another working directory, offline, peft's
    AutoPeftModelForCausalLM loads each adapter with its base and gives the policy's logits; every
    exported file is readable like a checkpoint's."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("peft")
    from helpers import EMIT_X, file_modes, plain_mode, tiny_experiment
    from huggingface_hub import constants
    from peft import AutoPeftModelForCausalLM

    from pgjax.train.run_dir import RunDirectory
    from pgjax.train.trainer import Trainer

    monkeypatch.chdir(tmp_path)                             # relative run_dir and model.path below
    exp = tiny_experiment(pathlib.Path("random"), algorithm="grpo", task=EMIT_X, steps=3, eval_every=10)
    exp = dataclasses.replace(exp, model=dataclasses.replace(exp.model, lora=LoRASection(rank=2)))
    local = dataclasses.replace(exp, run_dir="local/run",
                                model=dataclasses.replace(exp.model, path="random/run/final/base"))
    trainer = Trainer(exp)
    for experiment, steps in ((exp, True), (local, False)):  # the second exports the same policy
        run = RunDirectory(experiment, resume=False)
        run.create()
        run.start(trainer.tokenizer, trainer.step_count)
        if steps:
            trainer.fit(run, progress=False)
        else:
            run.log({"step": trainer.step_count, "eval_accuracy": 0.0})
        trainer.export(run)
        run.close()
    policy, base = trainer.policy, tmp_path / "random" / "run" / "final" / "base"
    x = jax.random.randint(jax.random.PRNGKey(3), (2, 7), 0, policy.config.vocab_size)
    want = np.asarray(policy(x))
    assert np.abs(want - np.asarray(lora.base(policy)(x))).max() > 1e-3      # the adapters moved

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)   # read once, when huggingface_hub was imported
    for final in (tmp_path / "random" / "run" / "final", tmp_path / "local" / "run" / "final"):
        config = json.loads((final / "adapter" / "adapter_config.json").read_text())
        assert config["base_model_name_or_path"] == str(base.resolve())
        model = AutoPeftModelForCausalLM.from_pretrained(str(final / "adapter"), dtype=torch.float32).eval()
        with torch.no_grad():
            got = model(torch.tensor(np.asarray(x))).logits.numpy()
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        assert set(file_modes(final).values()) == {plain_mode()}, file_modes(final)
    assert not (tmp_path / "local" / "run" / "final" / "base").exists()
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= set(file_modes(base))
