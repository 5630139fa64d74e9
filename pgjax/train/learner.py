"""The jitted numerical work of RL training: scoring a rollout and the policy / critic updates.

A ``Learner`` holds the static parts (model graph definitions, the algorithm's
``Spec``, optimizers, update settings); ``TrainState`` holds the arrays. Every
method that touches arrays is one ``jax.jit``-compiled function.

Update schedule (PPO-style, covering the on-policy algorithms as one epoch of
one minibatch): for each of ``epochs`` passes, the rollout's prompt groups are
shuffled and split into ``minibatches``; each minibatch is one optimizer step,
accumulated over ``micro_batches`` (a ``lax.scan``). The loss of a minibatch is
the algorithm's aggregate over *that minibatch*, with its denominators taken
from the whole minibatch (``core.loss_normalizer``), so accumulating
micro-batches gives exactly the gradient of the undivided minibatch. Advantages
and value targets are computed once, on the whole rollout, before the update.

Finite or skipped: an optimizer step whose policy loss, gradient norm, critic loss or
resulting state (parameters, optimizer moments) holds a NaN or infinity is not applied:
the state stays as it was and the step counts in the ``skipped_updates`` metric (its loss
metrics are left out, so the means are over the applied steps). ``max_skipped_steps``
consecutive RL steps with every update skipped stop a run (``Trainer.fit``).

Sharding: a ``Learner`` works on a device mesh (``parallel.mesh``; default the
trivial one-device mesh, the same code path). The state's parameters and
optimizer moments are placed by the logical-axis ``RULES`` (FSDP and/or tensor
parallel), rollouts are split over ``data`` x ``fsdp``, and ``prepare`` and the
optimizer step are jitted with these as explicit input and output shardings,
the state donated. Arrays passed in with another placement are moved.

Old log-probs: when the update cannot leave the policy that sampled the rollout
(one epoch of one minibatch) and the KL term is not in the reward, pi_old is the
policy being differentiated, so ``prepare`` skips them (``old_logp`` None: the loss
uses stop_gradient(logp), rho = 1 exactly, the same gradient; one forward pass
fewer per step). Otherwise ``old_logp`` is recomputed teacher-forced with the
parameters that sampled the rollout (the same function the loss differentiates),
so the ratio is 1 up to float rounding at the first minibatch; the sampler's own
``policy_logprobs`` equal it to ~1e-6 at temperature 1 (tests/test_sampler.py).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from pgjax import core
from pgjax.config.update import OptimConfig, UpdateConfig
from pgjax.models import lora
from pgjax.models.scoring import packed_response_logprobs, response_logprobs
from pgjax.models.transformer import CausalLM
from pgjax.parallel import mesh as mesh_lib
from pgjax.parallel import multihost
from pgjax.rollout.batch import Rollout
from pgjax.train import packing as packing_lib
from pgjax.train.critic import ValueModel
from pgjax.train.optim import make_optimizer


@flax.struct.dataclass
class TrainState:
    """Everything a resumed run needs besides the data position: parameters, optimizer states,
    the frozen reference policy (None when no KL term, and with LoRA, whose reference is the
    policy with its adapters zeroed), the step and the PRNG key. With LoRA the optimizer state
    covers the adapters only."""
    params: nnx.State
    opt_state: optax.OptState
    step: jax.Array
    key: jax.Array
    ref_params: nnx.State | None = None
    critic_params: nnx.State | None = None
    critic_opt_state: optax.OptState | None = None

    if TYPE_CHECKING:       # added by flax.struct.dataclass (dataclasses.replace)
        def replace(self, **changes: Any) -> TrainState: ...


def build_learner(policy: CausalLM, algorithm: core.Estimator, group_size: int, update: UpdateConfig,
                  optim: OptimConfig, critic_optim: OptimConfig, mesh: Mesh | None = None,
                  reference: bool | None = None, optimizer: optax.GradientTransformation | None = None) -> Learner:
    """The ``Learner`` a run of ``algorithm`` (a preset or any ``core.Estimator``) trains with (the
    Trainer's and the memory planner's): AdamW from ``optim``, a critic's AdamW from ``critic_optim``
    when the estimator requires ``values``, and a reference policy when it requires ``ref_logp``
    (``reference``: say so instead); ``optimizer``: the policy's, in place of ``optim``'s AdamW."""
    required = core.estimator.requirements(algorithm)
    critic = make_optimizer(critic_optim) if "values" in required else None
    reference = "ref_logp" in required if reference is None else reference
    optimizer = make_optimizer(optim) if optimizer is None else optimizer
    return Learner(policy, algorithm, group_size, update, optimizer, critic, reference, mesh)


class Learner:
    """``init_state``; jitted ``prepare`` (score a rollout), ``update`` (all its optimizer steps), and for
    analysis ``policy_gradient`` (the loss gradient over a whole prepared rollout) and ``token_weights``
    (each token's weight in it, ``core.token_weights``)."""

    def __init__(self, policy: CausalLM, algorithm: core.Estimator, group_size: int, update: UpdateConfig,
                 optimizer: optax.GradientTransformation, critic_optimizer: optax.GradientTransformation | None,
                 use_reference: bool, mesh: Mesh | None = None):
        self.graphdef = nnx.graphdef(policy)
        self.lora = policy.config.lora      # None: every parameter trains
        self.estimator, self.group_size, self.update_config = algorithm, group_size, update
        self.optimizer, self.critic_optimizer = optimizer, critic_optimizer
        required = core.estimator.requirements(algorithm)
        self.uses_critic = "values" in required
        self.uses_greedy = "greedy_rewards" in required
        self.use_reference = use_reference
        self.needs_old_logp = (update.recompute_old_logprobs or update.epochs > 1 or update.minibatches > 1
                               or "old_logp" in required)
        if self.uses_critic and critic_optimizer is None:
            raise ValueError(f"{algorithm.name} needs a critic optimizer")
        self.critic_graphdef = (nnx.graphdef(nnx.eval_shape(lambda: ValueModel.from_policy(policy)))
                                if self.uses_critic else None)
        self.mesh = mesh_lib.single_device_mesh() if mesh is None else mesh
        abstract = jax.eval_shape(lambda: self._fresh_state(policy, jax.random.PRNGKey(0)))
        self.state_sharding = mesh_lib.shardings(abstract, self.mesh)
        batch, same = mesh_lib.batch_sharding(self.mesh), mesh_lib.replicated(self.mesh)
        self.prepare = jax.jit(self._prepare, in_shardings=(self.state_sharding, batch, same),
                               out_shardings=batch)
        self.policy_gradient = jax.jit(lambda state, rollout, hp: self._gradient(state.params, rollout, hp)[0],
                                       in_shardings=(self.state_sharding, batch, same),
                                       out_shardings=self.trainable(self.state_sharding.params)[0])
        self.token_weights = jax.jit(self._token_weights, in_shardings=(self.state_sharding, batch, same),
                                     out_shardings=batch)
        self._optimizer_step = jax.jit(self._step, in_shardings=(self.state_sharding, batch, same, same, same, same),
                                       out_shardings=(self.state_sharding, same), donate_argnums=0)

    def init_state(self, policy: CausalLM, key) -> TrainState:
        """Fresh optimizer states; the reference policy and the critic start from ``policy``; placed
        on the mesh. The parameters are copies: updates donate the state's buffers, never ``policy``'s."""
        return jax.device_put(self._fresh_state(policy, key), self.state_sharding)

    def _fresh_state(self, policy: CausalLM, key) -> TrainState:
        params = jax.tree.map(jnp.copy, nnx.state(policy))
        critic = nnx.state(ValueModel.from_policy(policy)) if self.uses_critic else None
        keeps_reference = self.use_reference and self.lora is None
        return TrainState(params=params, opt_state=self.optimizer.init(self.trainable(params)[0]),
                          step=jnp.zeros((), jnp.int32), key=key,
                          ref_params=jax.tree.map(jnp.copy, params) if keeps_reference else None,
                          critic_params=critic,
                          critic_opt_state=self._critic_optimizer().init(critic) if self.uses_critic else None)

    def _critic_optimizer(self) -> optax.GradientTransformation:
        """The critic's optimizer, which ``__init__`` requires when ``uses_critic``."""
        if self.critic_optimizer is None:
            raise ValueError(f"{self.estimator.name} needs a critic optimizer")
        return self.critic_optimizer

    def policy(self, params) -> CausalLM:
        return nnx.merge(self.graphdef, params)

    def trainable(self, params) -> tuple[nnx.State, nnx.State | None]:
        """(the parameters the optimizer updates, the frozen rest): the adapters and the base weights
        with LoRA, else (all of them, None)."""
        return lora.split_trainable(params) if self.lora else (params, None)

    def join(self, trainable, frozen) -> nnx.State:
        """The whole parameter state from the two parts of ``trainable``."""
        return trainable if frozen is None else nnx.merge_state(trainable, frozen)

    def checkpointed(self, state: TrainState) -> TrainState:
        """What a checkpoint holds of ``state``: all of it, or with LoRA all but the frozen base
        weights (``params`` = the adapters; a resumed run loads the base from ``model.path``)."""
        return state.replace(params=self.trainable(state.params)[0]) if self.lora else state

    def from_checkpoint(self, state: TrainState, saved: TrainState) -> TrainState:
        """``saved`` (a restored ``checkpointed`` state) completed with ``state``'s frozen weights."""
        return saved.replace(params=self.join(saved.params, self.trainable(state.params)[1])) if self.lora else saved

    def reference(self, state: TrainState) -> nnx.State:
        """The reference policy's parameters: the frozen copy, or with LoRA the base model (the
        policy with its adapters zeroed, no second copy of the weights)."""
        if self.lora:
            return lora.without_adapters(state.params)
        if state.ref_params is None:
            raise ValueError("this state holds no reference policy (the learner was built without one)")
        return state.ref_params

    def _logprobs(self, params, part: Rollout, dropout_key=None, packing: packing_lib.Packing | None = None):
        """log pi and entropy of the response tokens [B, N] under ``params`` (teacher-forced); from the
        packed rows of ``packing`` (one micro-batch's) when given."""
        if packing is not None:
            return packed_response_logprobs(self.policy(params), packing, part.tokens[:, _prompt_length(part):],
                                            self.update_config.temperature, self.update_config.chunk_size,
                                            dropout_key, self.mesh)
        return response_logprobs(self.policy(params), part.tokens, part.attention_mask, _prompt_length(part),
                                 self.update_config.temperature, self.update_config.chunk_size, dropout_key,
                                 self.mesh)

    def _values(self, critic_params, part: Rollout):
        if self.critic_graphdef is None:
            raise ValueError(f"{self.estimator.name} has no critic (it does not require 'values')")
        critic = nnx.merge(self.critic_graphdef, critic_params)
        return critic.response_values(part.tokens, part.attention_mask, _prompt_length(part), self.mesh)

    def _prepare(self, state: TrainState, rollout: Rollout, hp: core.HParams) -> Rollout:
        """(``prepare``, jitted) Old (only when ``needs_old_logp``) and reference log-probs, critic
        values, advantages and value targets of a rollout."""
        old_logp = self._logprobs(state.params, rollout)[0] if self.needs_old_logp else None
        ref_logp = self._logprobs(self.reference(state), rollout)[0] if self.use_reference else None
        values = bootstrap = None
        if self.uses_critic:
            values, bootstrap = self._values(state.critic_params, rollout)
        # advantages never read logp itself (only the behaviour log-probs, with the KL in the reward)
        batch = self._batch(rollout, old_logp).replace(old_logp=old_logp, ref_logp=ref_logp, values=values,
                                                       bootstrap=bootstrap)
        targets = self.estimator.value_targets(batch, hp) if self.uses_critic else None
        return rollout.replace(batch=batch.replace(logp=None, advantages=self.estimator.advantages(batch, hp)),
                               targets=targets)

    def _batch(self, rollout: Rollout, logp, entropy=None) -> core.Batch:
        """The rollout's ``core.Batch`` with the log-probs (and entropy) of the policy being scored."""
        if rollout.batch.group_size != self.group_size:
            raise ValueError(f"the rollout's groups have {rollout.batch.group_size} responses; this learner's "
                             f"have {self.group_size}")
        return rollout.batch.replace(logp=logp, entropy=entropy)

    def update(self, state: TrainState, rollout: Rollout, hp: core.HParams) -> tuple[TrainState, dict]:
        """All epochs and minibatches of one rollout; returns the new state and summed metrics."""
        cfg = self.update_config
        prompts = rollout.mask.shape[0] // self.group_size
        cfg.check(prompts, self.group_size, self.mesh)
        key, shuffle_key, dropout_key = jax.random.split(state.key, 3)
        metrics = None
        host = multihost.gather((rollout.tokens, rollout.attention_mask)) if cfg.pack_width else None
        for epoch in range(cfg.epochs):
            order = jax.random.permutation(jax.random.fold_in(shuffle_key, epoch), prompts)
            for i, groups in enumerate(jnp.split(order, cfg.minibatches)):
                rows = (groups[:, None] * self.group_size + jnp.arange(self.group_size)).reshape(-1)
                step_key = jax.random.fold_in(dropout_key, epoch * cfg.minibatches + i) if self._drops() else None
                packing = None if host is None else packing_lib.pack(
                    host[0], host[1], _prompt_length(rollout), multihost.gather(rows), cfg.micro_batches,
                    cfg.pack_width, mesh_lib.batch_shards(self.mesh))
                state, step_metrics = self._optimizer_step(state, rollout, rows, packing, hp, step_key)
                metrics = step_metrics if metrics is None else core.combine_metrics(metrics, step_metrics)
        if metrics is None:     # UpdateConfig requires epochs, minibatches >= 1
            raise ValueError("an update of no optimizer steps (update.epochs or update.minibatches < 1)")
        return state.replace(step=state.step + 1, key=key), metrics

    def _drops(self) -> bool:
        """Whether the policy's forward pass in the update draws LoRA dropout."""
        return self.lora is not None and self.lora.dropout > 0

    def _step(self, state: TrainState, rollout: Rollout, rows, packing: packing_lib.Packing | None, hp: core.HParams,
              dropout_key=None):
        """(``_optimizer_step``, jitted, state donated) One optimizer step of the policy (and the
        critic) on the minibatch ``rows`` of the rollout (whole groups), its policy forward pass on
        the packed rows of ``packing`` when given (``packing_lib.pack`` of those rows); not applied (the state
        returned unchanged, ``skipped_updates`` = 1) when any loss, the gradient norm or the new
        state is not finite. With LoRA only the adapters are differentiated and updated.

        The new state is computed twice: once only to test it (XLA fuses that into the finiteness
        reductions), then in the branch of a ``lax.cond`` that applies it. Selecting between a
        materialised new state and the old one (``jnp.where`` per leaf) computes the same, but
        made XLA's CPU compiler take 6 min instead of 30 s for SmolLM2-135M's 30 layers."""
        minibatch = jax.tree.map(lambda x: x[rows], rollout)
        grads, metrics = self._gradient(state.params, minibatch, hp, dropout_key, packing)
        metrics["grad_norm_max"] = optax.tree.norm(grads)
        critic_grads = None
        if self.uses_critic:
            norm = core.loss_normalizer(minibatch.mask, self.group_size, minibatch.budget)
            critic_grads, metrics["value_loss"] = self._critic_gradient(state.critic_params,
                                                                        self._micro_batches(minibatch), norm)

        def updated(state: TrainState) -> TrainState:
            trainable, frozen = self.trainable(state.params)
            updates, opt_state = self.optimizer.update(grads, state.opt_state, trainable)
            new = state.replace(params=self.join(optax.apply_updates(trainable, updates), frozen),
                                opt_state=opt_state)
            if self.uses_critic:
                updates, opt_state = self._critic_optimizer().update(critic_grads, state.critic_opt_state,
                                                                     state.critic_params)
                new = new.replace(critic_params=optax.apply_updates(state.critic_params, updates),
                                  critic_opt_state=opt_state)
            return new

        finite = all_finite((metrics["policy_loss"], metrics["grad_norm_max"], metrics.get("value_loss"),
                             updated(state)))
        metrics = {key: jnp.where(finite, value, _identity(key)) for key, value in metrics.items()}
        metrics["optimizer_steps"] = finite.astype(jnp.float32)
        metrics["skipped_updates"] = 1.0 - metrics["optimizer_steps"]
        return jax.lax.cond(finite, updated, lambda state: state, state), metrics

    def _gradient(self, params, minibatch: Rollout, hp: core.HParams, dropout_key=None,
                  packing: packing_lib.Packing | None = None):
        """(``policy_gradient``, jitted) Gradient of the algorithm's loss over the whole minibatch
        (its own ``loss_normalizer``) with respect to the trainable parameters (``trainable``),
        accumulated over micro-batches (micro-batch i's dropout drawn from ``dropout_key`` folded
        with i; its log-probs from its packed rows of ``packing`` when given); and the loss metrics."""
        norm = core.loss_normalizer(minibatch.mask, self.group_size, minibatch.budget)
        trainable, frozen = self.trainable(params)
        micro = self._micro_batches(minibatch)
        keys = lora.dropout_keys(dropout_key, self.update_config.micro_batches)
        if packing is not None:
            sharding = NamedSharding(self.mesh, PartitionSpec(None, mesh_lib.BATCH_AXES))
            packing = jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, sharding), packing)

        def policy_loss(trainable, part):
            part, key, packed = part
            logp, entropy = self._logprobs(self.join(trainable, frozen), part, key, packed)
            return estimator_loss(self.estimator, self._batch(part, logp, entropy), hp, norm)

        return _accumulate(jax.grad(policy_loss, has_aux=True), trainable, (micro, keys, packing))

    def _token_weights(self, state: TrainState, rollout: Rollout, hp: core.HParams):
        """(``token_weights``, jitted) c_bt = -d loss / d log pi_bt of a prepared rollout at its old
        log-probs (the first minibatch's point: rho = 1; the log-probs of ``state`` when ``prepare``
        skipped them), ``[B, N]``."""
        old_logp = rollout.batch.old_logp
        logp = self._logprobs(state.params, rollout)[0] if old_logp is None else old_logp
        return core.token_weights(self.estimator, self._batch(rollout, logp), hp,
                                  core.loss_normalizer(rollout.mask, self.group_size, rollout.budget))

    def _micro_batches(self, minibatch: Rollout) -> Rollout:
        """[micro_batches, rows / micro_batches, ...]: each micro-batch split over the mesh's batch axes."""
        sharding = NamedSharding(self.mesh, PartitionSpec(None, mesh_lib.BATCH_AXES))
        return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(
            x.reshape(self.update_config.micro_batches, -1, *x.shape[1:]), sharding), minibatch)

    def _critic_gradient(self, critic_params, micro: Rollout, norm: core.Normalizer):
        """Gradient of the token-mean (clipped) value loss of the minibatch, and that loss."""
        def critic_loss(params, part):
            values, _ = self._values(params, part)
            per_token = core.value_loss(values, part.batch.values, part.targets, self.update_config.value_clip)
            loss = jnp.sum(per_token * part.mask) / jnp.maximum(norm.num_tokens, 1.0)
            return loss, {"value_loss": loss}

        grads, metrics = _accumulate(jax.grad(critic_loss, has_aux=True), critic_params, micro)
        return grads, metrics["value_loss"]


def estimator_loss(estimator: core.Estimator, batch: core.Batch, hp, norm: core.Normalizer):
    """``estimator.loss`` with the metrics every record reads filled in where the estimator does not
    give them (``core.batch_metrics``; ``policy_loss``: its loss), the estimator's own kept as given."""
    value, metrics = estimator.loss(batch, hp, norm)
    return value, {**core.batch_metrics(batch), "policy_loss": value, **metrics}


def all_finite(tree) -> jax.Array:
    """True when every floating-point entry of ``tree`` is finite (a scalar bool array)."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)


def _prompt_length(part: Rollout) -> int:
    return part.tokens.shape[1] - part.mask.shape[1]


def _accumulate(grad_fn, params, micro):
    """Sum of ``grad_fn(params, part)`` gradients and metrics over the leading micro-batch axis.

    One ``lax.scan`` over every micro-batch from the identity of each sum (0) and of each
    ``*_min`` / ``*_max`` metric (+inf / -inf), so only one micro-batch's activations are live."""
    shapes = jax.eval_shape(grad_fn, params, jax.tree.map(lambda x: x[0], micro))
    grads = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes[0])
    metrics = {key: jnp.full(s.shape, _identity(key), s.dtype) for key, s in shapes[1].items()}

    def step(carry, part):
        grads, metrics = grad_fn(params, part)
        return (jax.tree.map(jnp.add, carry[0], grads), core.combine_metrics(carry[1], metrics)), None

    return jax.lax.scan(step, (grads, metrics), micro)[0]


def _identity(key: str) -> float:
    """The neutral element of how ``core.combine_metrics`` merges the metric ``key``."""
    return jnp.inf if key.endswith("_min") else -jnp.inf if key.endswith("_max") else 0.0
