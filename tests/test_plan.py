"""The memory planner (``pgjax/plan.py``): its state bytes are hand-counted bytes, on one device and per
device of a simulated 8-device FSDP mesh (a subprocess started with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``; this file is its script), and the command line
re-runs itself with that flag when the mesh needs more devices; remat lowers the compiled temp; the
largest batch it reports was compiled and fits while the next multiple was compiled and does not; bad
inputs raise clear errors. A tiny Qwen2-shaped model (4 layers, scan_layers) keeps each compile to
seconds; three are compiled in all."""
import json
import os
import subprocess
import sys
import types

import pytest
from helpers import FAST_COMPILE

from pgjax import plan as plan_lib
from pgjax.models.transformer import ModelConfig
from pgjax.parallel.mesh import MeshConfig

TINY = dict(family="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=8, scan_layers=True)
HF_TINY = {"model_type": "qwen2", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
           "tie_word_embeddings": False}
SHAPE = dict(prompt_len=8, response_len=24)


def element_counts(c: ModelConfig) -> tuple[int, int]:
    """(elements of the weights with an ``embed`` axis, elements of the rest: norms and q/k/v biases)."""
    d, f, h, kv, hd = c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    per_layer = d * h * hd * 2 + d * kv * hd * 2 + 3 * d * f          # q, o; k, v; gate, up, down
    embed = c.vocab_size * d * (1 if c.tie_word_embeddings else 2) + c.num_hidden_layers * per_layer
    rest = d + c.num_hidden_layers * (2 * d + (h + 2 * kv) * hd)       # final norm; 2 norms and biases per layer
    return embed, rest


@pytest.fixture(scope="module")
def planners():
    return {remat: plan_lib.Planner(ModelConfig(**TINY, remat=remat), MeshConfig(data=1), **SHAPE, group_size=8)
            for remat in ("off", "save_nothing")}


def test_state_bytes_are_the_hand_counted_bytes_on_one_device(planners):
    embed, rest = element_counts(ModelConfig(**TINY))
    plan = planners["off"].plan(16)
    params = 4 * (embed + rest)
    assert (plan.params, plan.reference, plan.gradients) == (params, params, params)
    assert plan.optimizer == 2 * params + 8                   # Adam's mu and nu, and two int32 step counts
    assert plan.state == 4 * params + 8 + 4 + 8                # + the step (int32) and the PRNG key (2 x uint32)
    # XLA's own count of the step's arguments: the state and the rollout (a few unread inputs pruned)
    assert abs(plan.step.argument - plan.state - plan.step.inputs) < 1024
    assert plan.total == plan.step.peak(plan.state) > plan.state + plan.step.temp


def test_remat_lowers_the_compiled_temp(planners):
    off, remat = planners["off"].plan(16), planners["save_nothing"].plan(16)
    assert remat.params == off.params
    assert remat.step.temp < off.step.temp / 3, (remat.step.temp, off.step.temp)


def test_a_packed_update_is_planned_at_its_most_packed_rows(planners):
    packed = plan_lib.Planner(ModelConfig(**TINY, remat="save_nothing"), MeshConfig(data=1), **SHAPE, group_size=8,
                              pack_width=2).plan(16)
    unpacked = planners["save_nothing"].plan(16)
    # 16 rows packed into rows twice as wide: at most 8 of them (tokens and segment ids, int32), and each
    # row's response predictors
    width = SHAPE["prompt_len"] + SHAPE["response_len"]
    assert packed.step.inputs - unpacked.step.inputs == 4 * (2 * 8 * 2 * width + 16 * SHAPE["response_len"])
    # XLA's own count agrees, less the rollout's attention mask, which a packed update never reads
    assert abs(packed.step.argument - packed.state - (packed.step.inputs - 4 * 16 * width)) < 1024


def test_a_population_is_planned_as_its_members_stacked(planners):
    """A population of 4 on one device: 4 times a run's state and rollout; all vmapped, the temp of 4
    members' activations at once; one member at a time (``vmap_width=1``), about a run's temp."""
    single = planners["off"].plan(16)
    vmapped, mapped = (plan_lib.Planner(ModelConfig(**TINY), MeshConfig(data=1), **SHAPE, group_size=8, members=4,
                                        vmap_width=width).plan(16) for width in (None, 1))
    for plan in (vmapped, mapped):
        assert plan.members == 4
        assert (plan.params, plan.optimizer, plan.reference, plan.state) == (
            4 * single.params, 4 * single.optimizer, 4 * single.reference, 4 * single.state)
        assert (plan.prepare.inputs, plan.step.inputs) == (4 * single.prepare.inputs, 4 * single.step.inputs)
        assert abs(plan.step.argument - plan.state - plan.step.inputs) < 4096
    assert vmapped.step.temp > 3 * single.step.temp, (vmapped.step.temp, single.step.temp)
    assert mapped.step.temp < 1.5 * single.step.temp, (mapped.step.temp, single.step.temp)
    assert mapped.total < vmapped.total
    # one member at a time, the step writes each member's new state into the donated stacked state (one copy
    # of it, ``population.member_loop``): the step's output aliases the state, and its peak is the state plus
    # about a run's step
    assert mapped.step.alias >= mapped.state and mapped.total < mapped.state + single.total
    assert "a population of 4 members" in "\n".join(plan_lib.summary(vmapped, 2**30))
    with pytest.raises(ValueError, match="members=0"):
        plan_lib.Planner(ModelConfig(**TINY), MeshConfig(data=1), **SHAPE, members=0)


def test_largest_batch_is_compiled_and_fits_and_the_next_multiple_does_not(planners):
    """One real search (a short one: its longer paths are the next test's, without compiles)."""
    planner = planners["off"]
    assert planner.unit == 8                                   # one device, whole groups of 8
    limit = (planner.plan(8).total + planner.plan(16).total) // 2
    fit = planner.largest_batch(limit, start=8)
    assert fit.verified and fit.rows == 8 and set(fit.compiled) == {8, 16}
    assert planner.plan(fit.rows).total <= limit < planner.plan(fit.rows + fit.unit).total


def test_search_brackets_a_curved_memory_profile():
    """The search logic on a made-up total, linear plus a quadratic term and steps (no compiles): it
    ends on a verified bracket within its compile budget."""
    calls = []

    def fake_plan(rows):
        calls.append(rows)
        return types.SimpleNamespace(total=50_000 + 20 * rows + rows ** 2 // 200 + 3_000 * (rows // 500))

    fake = types.SimpleNamespace(unit=12, plan=fake_plan)
    for limit in (80_000, 200_000):
        fit = plan_lib.Planner.largest_batch(fake, limit, start=24)
        expected = max(r for r in range(0, 10_000, 12) if fake_plan(r).total <= limit)
        assert fit.verified and fit.rows == expected, (limit, fit)
        assert len(fit.compiled) <= plan_lib.MAX_COMPILES
    too_small = plan_lib.Planner.largest_batch(fake, 50_100, start=24)     # not even one unit fits
    assert too_small.verified and too_small.rows == 0


def check_eighths():
    """(Run with 8 simulated devices.) On an fsdp=8 mesh each device holds 1/8 of every weight with an
    ``embed`` axis and all of the rest (norms, q/k/v biases); the optimizer state and reference alike."""
    import jax
    assert jax.device_count() == 8
    config = ModelConfig(**TINY)
    state = plan_lib.Planner(config, MeshConfig(data=1, fsdp=8), **SHAPE).state_bytes()
    embed, rest = element_counts(config)
    assert state["params"] == 4 * (embed // 8 + rest), state
    assert state["reference"] == state["gradients"] == state["params"]
    assert state["optimizer"] == 2 * state["params"] + 8


def test_each_of_8_simulated_fsdp_devices_holds_an_eighth_of_the_sharded_weights():
    env = {**os.environ, "XLA_FLAGS": f"--xla_force_host_platform_device_count=8 {FAST_COMPILE}",
           "JAX_PLATFORMS": "cpu"}
    run = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr


def test_command_line_reruns_itself_with_the_devices_the_mesh_needs(tmp_path, monkeypatch):
    """The parent's half of the re-run (the child's is the test above): the same arguments, in a fresh
    process with 8 simulated CPU devices; nothing compiled here."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps(HF_TINY))
    monkeypatch.delenv(plan_lib.CHILD, raising=False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2 --xla_dump_to=/nowhere")
    calls = []
    monkeypatch.setattr(plan_lib.subprocess, "run", lambda command, env: calls.append((command, env))
                        or subprocess.CompletedProcess(command, 3))
    args = ["--model", str(config), "--mesh", "data=2,fsdp=4", "--batch", "16", "--prompt-len", "8",
            "--response-len", "24"]
    assert plan_lib.main(args) == 3                           # the child's exit status
    [(command, env)] = calls
    assert command == [sys.executable, "-m", "pgjax.plan", *args]
    assert env["XLA_FLAGS"] == "--xla_dump_to=/nowhere --xla_force_host_platform_device_count=8"
    assert env["JAX_PLATFORMS"] == "cpu" and env[plan_lib.CHILD] == "1"


def test_bad_inputs_raise_clear_errors(tmp_path, planners, capsys):
    with pytest.raises(ValueError, match="unknown mesh axis 'pipeline'"):
        plan_lib.parse_mesh("data=1,pipeline=2")
    with pytest.raises(ValueError, match="needs 2 devices, 1 are present"):
        plan_lib.Planner(ModelConfig(**TINY), MeshConfig(data=2), **SHAPE, devices=1)
    with pytest.raises(ValueError, match="needs 8 devices and this process has 1"):
        plan_lib.Planner(ModelConfig(**TINY), MeshConfig(fsdp=8, data=1), **SHAPE)
    with pytest.raises(ValueError, match="not a positive number of whole groups of 8"):
        planners["off"].plan(12)
    with pytest.raises(FileNotFoundError, match="no model config"):
        plan_lib.load_model_config(tmp_path / "missing")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(HF_TINY))
    base = ["--model", str(config), "--prompt-len", "8", "--response-len", "24"]
    for args, message in [(["--mesh", "data=2,fsdp=4,pipe=2", "--batch", "8"], "unknown mesh axis 'pipe'"),
                          (["--mesh", "data=1,fsdp=4", "--devices", "8", "--batch", "8"],
                           "needs 4 devices, 8 are present"),
                          (["--mesh", "data=1,fsdp=8", "--batch", "12", "--group-size", "4"],
                           "12 rows do not split over data x fsdp = 8"),
                          (["--batch", "8", "--model", str(tmp_path / "nowhere")], "no model config")]:
        with pytest.raises(SystemExit) as exited:
            plan_lib.main(base + args)
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (args, err)


if __name__ == "__main__":
    check_eighths()
