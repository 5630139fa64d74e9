"""Training end to end: every algorithm learns a toy reward through the runner, resume is exact,
gradient accumulation is exact, the rollout options do what they say, and bad input fails early."""
import dataclasses
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import (
    EMIT_X,
    EmitX,
    assert_plotted,
    p_first_x,
    sampled_rollout,
    starts_with_x,
    tiny_experiment,
    tiny_learner,
)

from pgjax import config as config_lib
from pgjax import core
from pgjax.config import ConfigError, Experiment, ModelSection, TaskSection, UpdateConfig
from pgjax.models import hf
from pgjax.models.scoring import response_logprobs
from pgjax.models.transformer import CausalLM, ModelConfig
from pgjax.rollout.batch import Rollout
from pgjax.rollout.collect import RolloutConfig, collect, encode_prompts, overlong_penalty, trim_padding
from pgjax.sample import SamplingConfig, generate
from pgjax.train.trainer import Trainer, train

SEVEN = ["reinforce", "reinforce_baseline", "remax", "rloo", "ppo", "grpo", "dr_grpo"]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", SEVEN)
def test_every_algorithm_raises_the_probability_of_the_rewarded_token(algorithm, tmp_path):
    exp = tiny_experiment(tmp_path, algorithm=algorithm, steps=6, task=EMIT_X,
                          update=UpdateConfig(epochs=2, minibatches=2) if algorithm == "ppo" else UpdateConfig())
    tokenizer = EmitX().tokenizer()
    before = p_first_x(Trainer(exp).policy, tokenizer)
    directory = train(exp, progress=False)
    after = p_first_x(hf.load(directory / "final"), tokenizer)
    assert after > before + 0.1, (before, after)
    records = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "reward" in r]
    assert [r["step"] for r in steps] == list(range(1, 7))
    for r in steps:
        assert np.isfinite(r["policy_loss"]) and np.isfinite(r["grad_norm"]) and r["time_step"] > 0
    assert ("value_loss" in steps[0]) == (algorithm in ("ppo", "reinforce_baseline"))
    assert (steps[0]["kl_ref"] is not None) == (algorithm == "grpo")
    assert steps[-1]["reward"] > steps[0]["reward"]
    assert_plotted(directory / "curves.png")


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["dr_grpo", "ppo"])
def test_gradient_accumulation_gives_the_same_update_as_one_batch(algorithm):
    params = []
    for micro in (1, 2, 4):
        # plain SGD with lr 1: the parameter change is the accumulated gradient itself
        policy, algo, learner = tiny_learner(algorithm, UpdateConfig(micro_batches=micro), optimizer=optax.sgd(1.0))
        state = learner.init_state(policy, jax.random.PRNGKey(0))
        rollout = learner.prepare(state, sampled_rollout(policy), algo.hparams)
        state, metrics = learner.update(state, rollout, algo.hparams)
        params.append((state.params, state.critic_params, float(metrics["policy_loss"])))
    for p, c, loss in params[1:]:
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), p, params[0][0])
        if c is not None:
            jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), c, params[0][1])
        assert loss == pytest.approx(params[0][2], abs=1e-6)


def test_minibatches_split_whole_groups_and_each_is_one_optimizer_step():
    policy, algo, learner = tiny_learner("ppo", UpdateConfig(epochs=3, minibatches=2))
    state = learner.init_state(policy, jax.random.PRNGKey(0))
    rollout = learner.prepare(state, sampled_rollout(policy), algo.hparams)
    state, metrics = learner.update(state, rollout, algo.hparams)
    assert float(metrics["optimizer_steps"]) == 6 and int(state.step) == 1
    assert float(metrics["sequences"]) == 3 * 16                  # every row seen once per epoch
    with pytest.raises(ValueError, match="do not split into update.minibatches=3"):
        UpdateConfig(minibatches=3).check(4)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["dr_grpo", "grpo", "ppo"])
def test_on_policy_updates_skip_old_logprobs_and_give_the_recomputed_update(algorithm):
    """One epoch of one minibatch: pi_old is the policy being differentiated, so prepare skips the
    old log-probs (old_logp None: stop_gradient(logp), rho = 1) unless the KL sits in the reward
    (PPO's k1 penalty reads them); the update equals the one with recomputed old log-probs."""
    results = []
    for recompute in (False, True):
        policy, algo, learner = tiny_learner(algorithm, UpdateConfig(recompute_old_logprobs=recompute))
        hp = algo.hparams.replace(kl_coef=0.0) if algorithm == "grpo" else algo.hparams
        state = learner.init_state(policy, jax.random.PRNGKey(0))
        rollout = learner.prepare(state, sampled_rollout(policy), hp)
        assert (rollout.batch.old_logp is None) == (not recompute and algorithm != "ppo")
        state, metrics = learner.update(state, rollout, hp)
        results.append((rollout.batch.advantages, state.params, float(metrics["policy_loss"])))
    (adv, params, loss), (adv_r, params_r, loss_r) = results
    np.testing.assert_allclose(np.asarray(adv), np.asarray(adv_r), atol=1e-6)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), params, params_r)
    assert loss == pytest.approx(loss_r, abs=1e-6)
    assert tiny_learner(algorithm, UpdateConfig(epochs=2))[2].needs_old_logp
    assert tiny_learner(algorithm, UpdateConfig(minibatches=2))[2].needs_old_logp


def padded_rollout(policy, extra_prompt=60, extra_response=59, group_size=4):
    """A sampled rollout (ragged prompts, responses up to 5 tokens) widened by ``extra_prompt``
    columns of left padding and ``extra_response`` masked response slots; and the response lengths."""
    tokens = np.tile(np.arange(2, 6), (4, 1))
    mask = np.ones_like(tokens)
    mask[0, :2] = mask[2, :1] = 0
    samples = generate(policy, tokens, mask, jax.random.key(1), SamplingConfig(max_new_tokens=5, eos_ids=(1,),
                                                                               n=group_size))
    widen = lambda x, pad: jnp.pad(x, ((0, 0), pad))  # noqa: E731
    prompt_tokens, response_tokens = samples.tokens[:, :4], samples.tokens[:, 4:]
    prompt_mask, response_mask = samples.attention_mask[:, :4], samples.attention_mask[:, 4:]
    rewards = jnp.asarray((np.asarray(samples.response) == 7).sum(1), jnp.float32)
    rollout = Rollout(
        tokens=jnp.concatenate([widen(prompt_tokens, (extra_prompt, 0)),
                                widen(response_tokens, (0, extra_response))], 1),
        attention_mask=jnp.concatenate([widen(prompt_mask, (extra_prompt, 0)),
                                        widen(response_mask, (0, extra_response))], 1),
        batch=core.Batch(mask=widen(samples.response_mask, (0, extra_response)), rewards=rewards, logp=None,
                         group_size=group_size))
    return rollout, samples.lengths


def test_trimming_all_padding_columns_keeps_every_real_token_at_quarter_widths():
    policy = tiny_learner("dr_grpo", UpdateConfig())[0]
    rollout, lengths = padded_rollout(policy)                   # prompt width 64, response budget 64
    trimmed = trim_padding(rollout, lengths)                    # prompts <= 4, responses <= 5 tokens
    assert trimmed.mask.shape[1] == 16 and trimmed.budget == 64  # a quarter of 64
    assert trimmed.tokens.shape[1] == 16 + 16
    np.testing.assert_array_equal(trimmed.tokens, rollout.tokens[:, 48:80])
    np.testing.assert_array_equal(trimmed.attention_mask, rollout.attention_mask[:, 48:80])
    assert float(jnp.sum(trimmed.attention_mask)) == float(jnp.sum(rollout.attention_mask))
    assert float(jnp.sum(trimmed.mask)) == float(jnp.sum(rollout.mask))
    longer = trim_padding(rollout, lengths.at[0].set(17))       # a 17-token response keeps 32 slots
    assert longer.mask.shape[1] == 32 and longer.budget == 64
    full = trim_padding(rollout.replace(attention_mask=rollout.attention_mask.at[0].set(1)),
                        lengths.at[0].set(64))                  # one row uses every column: nothing to cut
    assert full.tokens.shape == rollout.tokens.shape
    small, small_lengths = padded_rollout(policy, extra_prompt=6, extra_response=7)
    assert trim_padding(small, small_lengths).tokens.shape == small.tokens.shape   # budgets < 32: kept whole


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["reinforce_baseline", "rloo", "ppo", "grpo", "dr_grpo"])
def test_an_update_on_the_trimmed_rollout_equals_the_update_on_the_padded_one(algorithm):
    """Cutting all-padding columns changes no log-prob, advantage or loss term; Dr. GRPO's constant
    length stays the budget (``Rollout.budget``), so the parameters after the update agree."""
    results = []
    for trim in (False, True):
        policy, algo, learner = tiny_learner(algorithm, UpdateConfig())
        state = learner.init_state(policy, jax.random.PRNGKey(0))
        rollout, lengths = padded_rollout(policy)
        if trim:
            rollout = trim_padding(rollout, lengths)
        prepared = learner.prepare(state, rollout, algo.hparams)
        state, metrics = learner.update(state, prepared, algo.hparams)
        results.append((state.params, state.critic_params, {k: float(v) for k, v in metrics.items()}))
    (params, critic, metrics), (params_t, critic_t, metrics_t) = results
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=2e-6), params, params_t)
    if critic is not None:
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=2e-6), critic, critic_t)
    assert metrics_t == pytest.approx(metrics, rel=1e-6, abs=1e-4)    # sums of ~60 float32 terms


def test_prepare_matches_the_core_functions_on_the_same_batch():
    policy, algo, learner = tiny_learner("ppo", UpdateConfig())
    state = learner.init_state(policy, jax.random.PRNGKey(0))
    rollout = learner.prepare(state, sampled_rollout(policy), algo.hparams)
    got = rollout.batch
    batch = core.Batch(mask=got.mask, rewards=got.rewards, logp=got.old_logp, values=got.values,
                       bootstrap=got.bootstrap, group_size=4)
    np.testing.assert_allclose(np.asarray(got.advantages), np.asarray(algo.advantages(batch)), atol=1e-6)
    np.testing.assert_allclose(np.asarray(rollout.targets),
                               np.asarray(core.value_targets(algo.spec, batch, algo.hparams)), atol=1e-6)
    np.testing.assert_array_equal(np.asarray(got.values), 0.0)    # zero-initialised value head


@pytest.mark.slow
def test_token_weights_and_the_gradient_split_into_shares_of_rows():
    """The learner's token weights are core.token_weights of the prepared rollout; with the advantages
    and denominators of the whole batch fixed, the gradients of disjoint row subsets (masks) sum to
    the whole gradient, so each subset's gradient is its share of the update."""
    policy, algo, learner = tiny_learner("dr_grpo", UpdateConfig())
    hp = algo.hparams.replace(divide_by_std=1.0)
    state = learner.init_state(policy, jax.random.PRNGKey(0))
    rollout = learner.prepare(state, sampled_rollout(policy), hp)
    got = rollout.batch
    assert got.old_logp is None                                     # on-policy: prepare skips them
    logp = response_logprobs(policy, rollout.tokens, rollout.attention_mask, 4)[0]
    batch = core.Batch(mask=got.mask, rewards=got.rewards, logp=logp, old_logp=logp,
                       advantages=got.advantages, group_size=4)
    np.testing.assert_allclose(np.asarray(learner.token_weights(state, rollout, hp)),
                               np.asarray(core.token_weights(algo, batch, hp)), atol=1e-7)
    first = jnp.asarray(np.arange(16) < 8, jnp.float32)[:, None]
    parts = [learner.policy_gradient(state, rollout.with_mask(rollout.mask * m), hp) for m in (first, 1 - first)]
    whole = learner.policy_gradient(state, rollout, hp)
    jax.tree.map(lambda a, b, c: np.testing.assert_allclose(np.asarray(a) + np.asarray(b), np.asarray(c),
                                                            atol=1e-6), *parts, whole)
    assert optax.tree.norm(whole) > 0


def test_rollout_options_filter_groups_mask_truncation_and_penalise_overlong():
    tokenizer = EmitX().tokenizer()
    config = ModelConfig(family="llama", vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    policy = CausalLM(config, nnx.Rngs(3))
    examples = EmitX().examples(6)
    options = RolloutConfig(samples_per_prompt=4, max_prompt_tokens=4, max_new_tokens=4, filter_equal_groups=True,
                            mask_truncated=True)
    rollout, stats = collect(policy, tokenizer, examples, starts_with_x, starts_with_x, jax.random.key(1), options)
    groups = stats["reward"].reshape(6, 4)
    mixed = np.repeat(groups.max(1) > groups.min(1), 4)
    assert mixed.any() and not mixed.all()
    np.testing.assert_array_equal(stats["kept"], mixed & ~stats["truncated"])
    np.testing.assert_array_equal(np.asarray(rollout.mask).sum(1) > 0, stats["kept"] & (stats["length"] > 0))
    np.testing.assert_allclose(overlong_penalty(np.array([3, 4, 5, 6, 8]), 8, 4, 0.5),
                               [0.0, 0.0, -0.125, -0.25, -0.5])
    np.testing.assert_array_equal(overlong_penalty(np.array([8]), 8, 0, 1.0), [0.0])


def test_remax_scores_a_greedy_response_per_prompt():
    tokenizer = EmitX().tokenizer()
    config = ModelConfig(family="qwen3", vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    policy = CausalLM(config, nnx.Rngs(0))
    rollout, _ = collect(policy, tokenizer, EmitX().examples(2), starts_with_x, starts_with_x, jax.random.key(0),
                         RolloutConfig(samples_per_prompt=3, max_prompt_tokens=4, max_new_tokens=3),
                         greedy_baseline=True)
    tokens, mask = encode_prompts(tokenizer, ["ab"], 4)
    first = int(jnp.argmax(policy(jnp.asarray(tokens), jnp.asarray(mask))[0, -1]))
    want = float(first == tokenizer.convert_tokens_to_ids("x"))
    np.testing.assert_array_equal(np.asarray(rollout.batch.greedy_rewards), want)


def test_set_overrides_typed_fields_and_rejects_what_is_not_valid():
    exp = config_lib.override(Experiment(), ["rollout.temperature=0.7", "steps=3", "algorithm.hparams.kl_coef=0.01",
                                                 "rollout.mask_truncated=true", "task.name=countdown"])
    assert exp.rollout.temperature == 0.7 and exp.steps == 3 and exp.rollout.mask_truncated is True
    assert exp.algorithm.build().hparams.kl_coef == 0.01 and exp.task.name == "countdown"
    cases = [("rollout.temprature=0.7", r"unknown config key 'rollout.temprature'; did you mean rollout.temperature\?"),
             ("steps=many", r"steps='many' is invalid: an int is expected"),
             ("steps", "key=value"),
             ("steps=-5", r"steps=-5 is invalid: an integer >= 0"),
             ("optim.lr=0", r"optim.lr=0.0 is invalid: a finite number > 0"),
             ("update.epochs=0", r"update.epochs=0 is invalid: an integer >= 1"),
             ("rollout.overlong_buffer=6", r"rollout.overlong_buffer=6 is invalid: an integer in \[0, max_new_tokens"),
             ("rollout.top_p=1.5", r"rollout.top_p=1.5 is invalid: in \(0, 1\]"),
             ("model.family=gpt2", r"model.family='gpt2' is invalid: one of \('llama', 'qwen2', 'qwen3', 'gemma3'\)"),
             ("rollout.mask_truncated=maybe", "a bool, true or false"),
             ("algorithm.hparams.kl_coef=nan", "a finite number"),
             ("update.correction=token", "did you mean algorithm.correction?")]
    for assignment, message in cases:
        with pytest.raises(ConfigError, match=message):
            config_lib.override(Experiment(), [assignment])
    with pytest.raises(ConfigError, match="hyperparameter kl_coef"):
        config_lib.override(Experiment(), ["algorithm.hparams.kl_coef=-1"]).algorithm.build()
    # all assignments are made at once: the order of two fields checked together does not matter
    for order in (["rollout.overlong_buffer=8", "rollout.max_new_tokens=16"],
                  ["rollout.max_new_tokens=16", "rollout.overlong_buffer=8"]):
        assert config_lib.override(Experiment(), order).rollout.overlong_buffer == 8


def test_an_experiment_file_with_a_renamed_or_unknown_field_is_a_config_error(tmp_path):
    file = tmp_path / "old.py"
    file.write_text("from pgjax.config import Experiment, ModelSection\n"
                    "def experiment():\n    return Experiment(model=ModelSection(layers=2))\n")
    with pytest.raises(ConfigError,
                       match="unexpected keyword argument 'layers'.*layers is now model.num_hidden_layers"):
        config_lib.load(file)
    file.write_text("from pgjax.config import Experiment\ndef experiment():\n"
                    "    return Experiment(steps=-1)\n")
    with pytest.raises(ConfigError, match="steps=-1 is invalid"):
        config_lib.load(file)


def test_experiment_files_load_and_name_their_algorithm():
    for algorithm in SEVEN:
        exp = config_lib.load(pathlib.Path(__file__).parent.parent / "experiments" / f"arithmetic_{algorithm}.py")
        assert exp.algorithm.preset == algorithm and exp.algorithm.build().spec.name == algorithm


def test_bad_experiments_fail_before_anything_is_written(tmp_path):
    with pytest.raises(ConfigError, match="no experiment file"):
        config_lib.load(tmp_path / "missing.py")
    (tmp_path / "empty.py").write_text("x = 1\n")
    with pytest.raises(ConfigError, match="must define experiment"):
        config_lib.load(tmp_path / "empty.py")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question": "1+1?"}) + "\n")
    cases = [
        (dict(task=TaskSection(name="jsonl_math", options={"path": str(tmp_path / "none.jsonl")})), "none.jsonl"),
        (dict(task=TaskSection(name="jsonl_math", options={"path": str(bad)})), "lacks field"),
        (dict(task=TaskSection(name="sudoku")), "task.name='sudoku' is unknown"),
        (dict(task=TaskSection(name="no_such_module:make")), "cannot be imported"),
        (dict(task=TaskSection(options={"digits": 0})), "digits must be an int"),
        (dict(model=ModelSection(path=str(tmp_path))), "config.json missing"),
        (dict(algorithm="trpo"), "algorithm.preset='trpo' is invalid"),
        (dict(algorithm="grpo", rollout=RolloutConfig(samples_per_prompt=1)), "group baseline compares K >= 2"),
        (dict(prompts_per_step=3, update=UpdateConfig(minibatches=2)), "do not split"),
    ]
    for changes, match in cases:
        with pytest.raises(ConfigError, match=match):
            train(tiny_experiment(tmp_path, **changes), progress=False)
        assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_new_run_never_overwrites_a_saved_one(tmp_path, monkeypatch):
    exp = tiny_experiment(tmp_path, steps=2, task=EMIT_X)
    directory = train(exp, progress=False)
    saved = {p: p.read_bytes() for p in directory.rglob("*") if p.is_file()}
    with pytest.raises(ConfigError, match="holds another run.s results"):
        train(exp, progress=False)
    assert {p: p.read_bytes() for p in directory.rglob("*") if p.is_file()} == saved
    with pytest.raises(ConfigError, match="no checkpoint to resume"):
        train(dataclasses.replace(exp, run_dir=str(tmp_path / "other")), resume=True, progress=False)
    assert not (tmp_path / "other").exists()
    monkeypatch.chdir(tmp_path)
    unnamed = dataclasses.replace(exp, run_dir="")
    assert train(unnamed, progress=False) == pathlib.Path("runs/t")
    assert train(unnamed, progress=False) == pathlib.Path("runs/t-2")


@pytest.mark.slow
def test_the_checkpoint_experiment_trains_a_local_hf_checkpoint_on_a_jsonl_dataset(tmp_path):
    pytest.importorskip("torch", reason="builds the checkpoint with transformers + torch")
    import transformers
    from helpers import save_tiny_tokenizer, tiny_hf_config
    checkpoint = tmp_path / "checkpoint"
    transformers.AutoModelForCausalLM.from_config(tiny_hf_config("qwen2", True)).save_pretrained(checkpoint)
    save_tiny_tokenizer(checkpoint)
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a}+{a + 1}=", "answer": f"so #### {2 * a + 1}"}) + "\n"
                            for a in range(8)))
    exp = config_lib.load(pathlib.Path(__file__).parent.parent / "experiments" / "math_checkpoint.py")
    exp = config_lib.override(exp, [
        f"model.path={checkpoint}", f"task.options.path={data}", "model.param_dtype=float32",
        "model.compute_dtype=float32", "steps=2", "prompts_per_step=4", "rollout.samples_per_prompt=2",
        "rollout.max_prompt_tokens=8", "rollout.max_new_tokens=4", "update.micro_batches=2", "eval_prompts=4",
        "update.chunk_size=16", f"run_dir={tmp_path / 'run'}"])
    directory = train(exp, progress=False)
    records = [json.loads(line) for line in (directory / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2] and np.isfinite(records[-1]["policy_loss"])
    back = transformers.AutoModelForCausalLM.from_pretrained(directory / "final")
    assert back.config.model_type == "qwen2"
    assert hf.load_tokenizer(directory / "final")("1+2=")["input_ids"] == hf.load_tokenizer(checkpoint)("1+2=")[
        "input_ids"]


@pytest.mark.slow
def test_the_comparison_trains_each_algorithm_and_writes_a_table_and_a_plot(tmp_path):
    from pgjax import compare
    tiny = ["steps=2", "prompts_per_step=4", "rollout.samples_per_prompt=4", "warm_start.steps=2",
            "warm_start.batch_size=8", "eval_every=1", "eval_prompts=8", "model.hidden_size=32",
            "model.intermediate_size=64", "model.num_hidden_layers=1", "model.head_dim=8", "update.minibatches=1"]
    experiments = pathlib.Path(__file__).parent.parent / "experiments"
    chosen = ("reinforce", "ppo", "dr_grpo")       # every experiment file loads: see the test above
    results = compare.compare(tiny, target=0.0, out=tmp_path, experiments=experiments, algorithms=chosen)
    assert list(results) == list(chosen) and all(list(by_seed) == [0] for by_seed in results.values())
    assert all(r[0]["steps_to_target"] == 0 and len(r[0]["curve"]) == 3 for r in results.values())
    assert all((tmp_path / name / "metrics.jsonl").exists() for name in chosen)      # one seed: out/<algorithm>
    rows = (tmp_path / "comparison.md").read_text().splitlines()
    assert len(rows) == 2 + 3 and rows[2].startswith("| reinforce |")
    assert_plotted(tmp_path / "comparison.png")
    assert len({r[0]["start"] for r in results.values()}) == 1          # the same warm start for all
    table = (tmp_path / "comparison.md").read_text()
    # again over the finished runs: nothing trains, and each run keeps the wall time it was saved with
    assert compare.compare(tiny, target=0.0, out=tmp_path, experiments=experiments, algorithms=chosen) == results
    assert (tmp_path / "comparison.md").read_text() == table
    # the table again from the kept records and comparison.json alone, the runs' directories gone
    for name in chosen:
        assert (tmp_path / "records" / name / "metrics.jsonl").read_bytes() == (tmp_path / name / "metrics.jsonl"
                                                                               ).read_bytes()
        shutil.rmtree(tmp_path / name)
    (tmp_path / "comparison.md").unlink()
    assert compare.report(tmp_path) == results and (tmp_path / "comparison.md").read_text() == table
    (tmp_path / "records" / "ppo" / "metrics.jsonl").unlink()
    with pytest.raises(ValueError, match="the run of ppo, seed 0, did not finish"):
        compare.report(tmp_path)


def test_decoding_strips_whichever_stop_token_ended_a_response():
    from pgjax.rollout.collect import decode_responses
    tokenizer = EmitX().tokenizer()
    a, b, x = (tokenizer.convert_tokens_to_ids(c) for c in "abx")
    response = np.array([[a, b, 1, 0], [x, a, 0, 0], [a, b, x, a]])
    assert decode_responses(tokenizer, response, np.array([3, 2, 4]), (1, a)) == ["ab", "x", "abx"]
