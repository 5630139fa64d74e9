"""Hugging Face checkpoints: load a local directory into ``CausalLM`` and save one back.

``load`` reads config.json with transformers' AutoConfig and the weights from
``*.safetensors`` (one file or a sharded index) with safetensors' JAX API (which,
unlike NumPy, reads bfloat16) onto the host, no torch, and places them into a model built
abstractly (no random initialisation). ``save`` writes config.json and model.safetensors that
``transformers`` loads with ``from_pretrained``, and copies the tokenizer files (chat template
included) and generation_config.json from a source directory; ``load_tokenizer`` reads the
tokenizer with AutoTokenizer from the same directory.
Nothing is ever downloaded: the directory must exist locally.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pgjax.models import lora as lora_lib
from pgjax.models.heads import RewardModel
from pgjax.models.transformer import FAMILIES, RUNTIME_OPTIONS, CausalLM, Family, ModelConfig, family_of

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                   "merges.txt", "tokenizer.model")     # any one of them makes a directory a tokenizer's
TOKENIZER_EXTRAS = ("added_tokens.json", "chat_template.jinja", "chat_template.json")
CHAT_TEMPLATE_DIR = "additional_chat_templates"         # transformers 5: named templates besides the default
# what ``save`` takes from ``tokenizer_dir`` (files where present, and CHAT_TEMPLATE_DIR whole)
COPIED_FILES = TOKENIZER_FILES + TOKENIZER_EXTRAS + ("generation_config.json",)
# the built-in family of each transformers model_type (``FAMILIES``' ``model_type``)
FAMILY_OF = {family.model_type: name for name, family in FAMILIES.items()}


def checkpoint_family(hf_config, family: str | None = None) -> tuple[str, Family]:
    """(the name ``ModelConfig.family`` takes, the ``Family``) of a transformers config: ``family`` (a
    built-in name or a ``Family``'s import path, ``model.family``) where given, which must be the
    family of the config's ``model_type``; else the built-in family of that model_type. ValueError for
    a model_type no built-in family has, or one that differs from the named family's."""
    model_type = hf_config.model_type
    if family is not None:
        spec = family_of(family, "model.family")
        if spec.model_type != model_type:
            raise ValueError(f"model.family={family!r} is the family of model_type {spec.model_type!r}, but the "
                             f"checkpoint's config.json says model_type {model_type!r}")
        return family, spec
    if model_type not in FAMILY_OF:
        raise ValueError(f"unsupported architecture {model_type!r}; supported model_type values: "
                         f"{tuple(FAMILY_OF)}, or name a family of your own with that model_type by its import "
                         "path: model.family=package.module:NAME (a pgjax.models.transformer.Family; "
                         "docs/extending.md)")
    return FAMILY_OF[model_type], FAMILIES[FAMILY_OF[model_type]]


def config_from_hf(hf_config, family: str | None = None, **options) -> ModelConfig:
    """``ModelConfig`` from a transformers config object, with pgjax's own ``options`` (any of
    ``RUNTIME_OPTIONS``: dtypes, remat, scan_layers); ``family``: the family to read it as (a built-in
    name or a ``Family``'s import path; default: the built-in family of its ``model_type``, see
    ``checkpoint_family``); unsupported families and settings raise."""
    unknown = set(options) - set(RUNTIME_OPTIONS)
    if unknown:
        raise TypeError(f"unknown model options {sorted(unknown)}; valid: {RUNTIME_OPTIONS}")
    family, spec = checkpoint_family(hf_config, family)
    _check_supported(hf_config, spec)
    theta, scaling = _rope(hf_config, "full_attention" if spec.gemma else None)
    heads = hf_config.num_attention_heads
    return ModelConfig(
        family=family, vocab_size=hf_config.vocab_size, hidden_size=hf_config.hidden_size,
        intermediate_size=hf_config.intermediate_size, num_hidden_layers=hf_config.num_hidden_layers,
        num_attention_heads=heads, num_key_value_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
        head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
        rms_norm_eps=hf_config.rms_norm_eps, rope_theta=theta, rope_scaling=scaling,
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        **(_gemma_fields(hf_config) if spec.gemma else {}),
        **options,
        max_position_embeddings=getattr(hf_config, "max_position_embeddings", None),
        bos_token_id=getattr(hf_config, "bos_token_id", None), eos_token_id=_token_ids(hf_config),
        pad_token_id=getattr(hf_config, "pad_token_id", None))


def _rope(hf_config, layer_type=None) -> tuple[float, tuple | None]:
    """(rope_theta, rope_scaling as sorted pairs or None) of the config: transformers 5's
    ``rope_parameters`` with a legacy ``rope_scaling`` merged in, or (Gemma 3) its entry for
    ``layer_type`` ("full_attention" or "sliding_attention")."""
    rope = dict(getattr(hf_config, "rope_parameters", None) or {})
    if layer_type is None:
        rope.update(getattr(hf_config, "rope_scaling", None) or {})
    else:
        rope = dict(rope.get(layer_type) or {})
    theta = rope.pop("rope_theta", getattr(hf_config, "rope_theta", 10000.0))
    kind = rope.get("rope_type", rope.get("type", "default"))
    scaling = None if kind == "default" else tuple(sorted((k, v) for k, v in rope.items() if k != "type"))
    return float(theta), scaling


def _gemma_fields(hf_config) -> dict:
    """The Gemma 3 fields of ``ModelConfig`` (layer types, sliding window, local RoPE base, query scale)."""
    local_theta, local_scaling = _rope(hf_config, "sliding_attention")
    if local_scaling:
        raise ValueError(f"unsupported gemma3_text rope scaling {dict(local_scaling)} of the sliding-window "
                         f"layers: pgjax scales only the full-attention layers' frequencies")
    return {"layer_types": tuple(hf_config.layer_types), "sliding_window": hf_config.sliding_window,
            "rope_local_theta": local_theta, "query_pre_attn_scalar": hf_config.query_pre_attn_scalar}


def _check_supported(hf_config, family: Family) -> None:
    """Raise for settings that change the model's maths beyond what ``CausalLM`` implements for
    ``family`` (SiLU MLPs, GELU-tanh in Gemma's layers, without biases; q/k/v biases only where the
    family has them, as Qwen2; causal attention, windowed only in Gemma 3's sliding layers: a
    ``sliding_window`` that a config applies unless ``use_sliding_window`` says otherwise, as Mistral's,
    is refused too; no logit soft-capping: transformers' Gemma 3 skips the attention one, and a capped
    output would need the chunked log-probs to cap too)."""
    gemma = family.gemma
    act_name, act = ("hidden_activation", "gelu_pytorch_tanh") if gemma else ("hidden_act", "silu")
    flag = lambda name: bool(getattr(hf_config, name, False))  # noqa: E731
    window = not gemma and getattr(hf_config, "sliding_window", None) is not None
    unsupported = {act_name: getattr(hf_config, act_name, act) != act, "mlp_bias": flag("mlp_bias"),
                   "attention_bias": not family.qkv_bias and flag("attention_bias"),
                   "use_sliding_window": flag("use_sliding_window"),
                   "sliding_window": window and not hasattr(hf_config, "use_sliding_window"),
                   "use_bidirectional_attention": flag("use_bidirectional_attention"),
                   "attn_logit_softcapping": getattr(hf_config, "attn_logit_softcapping", None) is not None,
                   "final_logit_softcapping": getattr(hf_config, "final_logit_softcapping", None) is not None}
    found = [f"{name}={getattr(hf_config, name)!r}" for name, bad in unsupported.items() if bad]
    if found:
        raise ValueError(f"unsupported {hf_config.model_type} settings {', '.join(found)}: pgjax's CausalLM "
                         f"implements SiLU MLPs (GELU-tanh in gemma3) without biases, q/k/v biases only in qwen2 "
                         f"(a Family with qkv_bias), causal attention (sliding windows only in gemma3), no logit "
                         f"soft-capping")


def _token_ids(hf_config):
    """The config's ``eos_token_id``: an int, a tuple where it lists several, or None."""
    ids = getattr(hf_config, "eos_token_id", None)
    return tuple(ids) if isinstance(ids, (list, tuple)) else ids


def _read_safetensors(directory: pathlib.Path) -> dict:
    """Every tensor of the checkpoint's weight files by name, as host (NumPy) arrays; a ValueError naming
    a file that safetensors cannot read."""
    from safetensors import SafetensorError
    from safetensors.flax import load_file
    index = directory / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors weights in {directory}")
    tensors: dict[str, np.ndarray] = {}
    for name in files:
        path = directory / name
        if not path.exists():
            raise FileNotFoundError(f"{path} is listed in the index but missing")
        with jax.default_device(jax.local_devices(backend="cpu")[0]):     # this process's own CPU
            try:
                tensors.update((k, np.asarray(v)) for k, v in load_file(str(path)).items())
            except SafetensorError as error:
                raise ValueError(f"{path} is not a whole safetensors file (cut short or damaged?): {error}") from None
    return tensors


# a weight's (hf name, pgjax path, to_pgjax, to_hf)
_Weight = tuple[str, tuple[str | int, ...], Callable[[Any], Any], Callable[[Any], Any]]


def _layout(config: ModelConfig) -> list[_Weight]:
    """(hf name, pgjax path, to_pgjax, to_hf) for every weight; linear weights are [out, in] in HF."""
    c = config
    h, kv, d, hd = c.num_attention_heads, c.num_key_value_heads, c.hidden_size, c.head_dim
    same = (lambda w: w, lambda w: w)
    heads_in = lambda n: (lambda w: w.T.reshape(d, n, hd), lambda w: w.reshape(d, n * hd).T)  # noqa: E731
    bias = lambda n: (lambda w: w.reshape(n, hd), lambda w: w.reshape(n * hd))  # noqa: E731
    transpose = (lambda w: w.T, lambda w: w.T)
    out: list[_Weight]
    out = [("model.embed_tokens.weight", ("embed",), *same), ("model.norm.weight", ("final_norm", "weight"), *same)]
    if not c.tie_word_embeddings:
        out.append(("lm_head.weight", ("lm_head",), *transpose))
    for i in range(c.num_hidden_layers):
        pre, at = f"model.layers.{i}.", ("layers", i, "attention")
        out += [(pre + "self_attn.q_proj.weight", at + ("q",), *heads_in(h)),
                (pre + "self_attn.k_proj.weight", at + ("k",), *heads_in(kv)),
                (pre + "self_attn.v_proj.weight", at + ("v",), *heads_in(kv)),
                (pre + "self_attn.o_proj.weight", at + ("o",),
                 lambda w: w.T.reshape(h, hd, d), lambda w: w.reshape(h * hd, d).T),
                (pre + "mlp.gate_proj.weight", ("layers", i, "mlp", "gate"), *transpose),
                (pre + "mlp.up_proj.weight", ("layers", i, "mlp", "up"), *transpose),
                (pre + "mlp.down_proj.weight", ("layers", i, "mlp", "down"), *transpose),
                (pre + "input_layernorm.weight", ("layers", i, "input_norm", "weight"), *same),
                (pre + "post_attention_layernorm.weight", ("layers", i, "post_attention_norm", "weight"), *same)]
        if c.qkv_bias:
            out += [(pre + f"self_attn.{n}_proj.bias", at + (f"{n}_bias",), *bias(count))
                    for n, count in (("q", h), ("k", kv), ("v", kv))]
        if c.qk_norm:
            out += [(pre + f"self_attn.{n}_norm.weight", at + (f"{n}_norm", "weight"), *same) for n in ("q", "k")]
        if c.gemma:
            out += [(pre + f"{n}_feedforward_layernorm.weight", ("layers", i, f"{n}_feedforward_norm", "weight"),
                     *same) for n in ("pre", "post")]
    return out


def _slot(model: CausalLM, path) -> tuple[nnx.Variable, int | None]:
    """The variable a ``_layout`` path names, and the layer index within it when the layers are
    stacked (``scan_layers``: path ("layers", i, ...) is row i of the variable ("layers", ...))."""
    index = None
    if model.config.scan_layers and path[0] == "layers":
        path, index = ("layers", *path[2:]), path[1]
    node: Any = model       # the module, then its attributes down to the variable
    for part in path:
        node = node[part] if isinstance(part, int) else getattr(node, part)
    return node, index


def load(directory, **options) -> CausalLM:
    """A ``CausalLM`` with the weights of the local checkpoint ``directory`` (no random initialisation:
    the model is built abstractly and each variable set to its loaded weight); ``options``: those of
    ``config_from_hf`` (e.g. ``compute_dtype="bfloat16"``, ``scan_layers=True``, ``lora=LoRAConfig()``:
    fresh adapters, B = 0, on the checkpoint's weights; ``family="my_pkg.models:MISTRAL"``: a family of
    your own, for a checkpoint whose model_type no built-in family has)."""
    directory = pathlib.Path(directory)
    return _load_trunk(directory, _hf_config(directory), options)[0]


def load_config(directory, **options) -> ModelConfig:
    """The ``ModelConfig`` of the local checkpoint ``directory`` (its config.json, nothing else read);
    ``options``: ``config_from_hf``'s."""
    return config_from_hf(_hf_config(pathlib.Path(directory)), **options)


def _hf_config(directory: pathlib.Path):
    from transformers import AutoConfig
    if not (directory / "config.json").exists():
        raise FileNotFoundError(f"{directory} has no config.json (a local Hugging Face checkpoint directory)")
    return AutoConfig.from_pretrained(str(directory), local_files_only=True)


def _load_trunk(directory: pathlib.Path, hf_config, options: dict, head: bool = False) -> tuple[CausalLM, dict]:
    """``load``'s model (the config checked before any weight is read) and the tensors read; ``head``:
    a classifier's checkpoint, whose trunk has no language-model head (the model ties it to the
    embedding, unused)."""
    config = config_from_hf(hf_config, **options)
    if head:
        config = dataclasses.replace(config, tie_word_embeddings=True)
    tensors = _read_safetensors(directory)
    model = nnx.eval_shape(lambda: CausalLM(config, nnx.Rngs(0)))
    _fill(model, tensors, directory)
    if config.lora is not None:
        lora_lib.initialise_adapters(model)
    return model, tensors


def _classifier_architecture(config: ModelConfig, kind: str) -> str:
    """transformers' class of ``config``'s family for a one-label classifier of ``kind``."""
    from transformers.models.auto import modeling_auto
    mappings = {"sequence": modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
                "token": modeling_auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES}
    if kind not in mappings:
        raise ValueError(f"unknown classifier kind {kind!r}; expected one of {tuple(mappings)}")
    model_type = config.family_spec.model_type
    name = mappings[kind].get(model_type)
    if name is None:
        raise ValueError(f"transformers has no {kind} classifier for model_type {model_type!r}")
    return name


def save_reward_model(model: RewardModel, directory, tokenizer_dir=None, kind: str = "sequence",
                      pad_token_id: int | None = None) -> None:
    """A learned reward as a transformers classifier with one label: config.json and
    model.safetensors holding the trunk (``model.*``, no language-model head) and the head as
    ``score`` ([1, D] = w).

    ``kind="sequence"`` (a reward model): ``AutoModelForSequenceClassification``, which reads the head
    at each row's rightmost token that is not the config's ``pad_token_id``, as ``RewardModel.scores``
    does with the trunk's. Its ``score`` has no bias, so b must be 0 (a reward model's training never
    moves it). ``kind="token"`` (a process reward model): ``AutoModelForTokenClassification``, the head
    at every token, b as ``score.bias``. ``pad_token_id``: written to the config (default: the
    trunk's), which transformers needs to score a padded batch; pass the trunk's, or its sequence
    scores may be read at another token."""
    config = model.trunk.config
    architecture = _classifier_architecture(config, kind)
    bias = float(np.asarray(model.bias[...]))
    if kind == "sequence" and bias != 0.0:
        raise ValueError(f"save_reward_model: a sequence classifier's score has no bias, and this head's is {bias}; "
                         "export it as kind='token', or train it with a loss that leaves the bias at 0 "
                         "(Bradley-Terry)")
    if model.trunk.config.lora is not None:
        raise ValueError("save_reward_model: the trunk has LoRA adapters; merge them first (pgjax.models.lora.merged)")
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {hf_name: np.ascontiguousarray(to_hf(_weight(model.trunk, path)))
               for hf_name, path, _, to_hf in _layout(config) if hf_name != "lm_head.weight"}
    tensors["score.weight"] = np.asarray(model.head[...], np.float32)[None, :].astype(config.param_dtype)
    if kind == "token":
        tensors["score.bias"] = np.asarray([bias], config.param_dtype)
    _save_tensors(tensors, directory / "model.safetensors")
    content = hf_config_dict(config)
    pad = config.pad_token_id if pad_token_id is None else pad_token_id
    content.update(architectures=[architecture], num_labels=1, id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0},
                   **({"pad_token_id": pad} if pad is not None else {}))
    (directory / "config.json").write_text(json.dumps(content, indent=2))
    if tokenizer_dir is not None:
        _copy_tokenizer(pathlib.Path(tokenizer_dir), directory)


def load_reward_model(directory, **options) -> RewardModel:
    """A ``RewardModel`` from a one-label transformers classifier (``save_reward_model``'s, or any
    ``*ForSequenceClassification`` / ``*ForTokenClassification`` checkpoint of a supported family);
    ``options``: ``load``'s."""
    directory = pathlib.Path(directory)
    hf_config = _hf_config(directory)
    architectures = getattr(hf_config, "architectures", None) or []
    if not any(a.endswith(("ForSequenceClassification", "ForTokenClassification")) for a in architectures):
        raise ValueError(f"{directory}: config.json's architectures {architectures} are not a sequence or token "
                         "classifier (a reward model)")
    if getattr(hf_config, "num_labels", 1) != 1:
        raise ValueError(f"{directory}: a reward model has one label, this classifier {hf_config.num_labels}")
    trunk, tensors = _load_trunk(directory, hf_config, options, head=True)
    if "score.weight" not in tensors:
        raise KeyError(f"{directory}: weight score.weight is missing")
    model = RewardModel(trunk)
    model.head.set_value(jnp.asarray(tensors["score.weight"].reshape(-1), jnp.float32))
    if "score.bias" in tensors:
        model.bias.set_value(jnp.asarray(tensors["score.bias"].reshape(()), jnp.float32))
    return model


def _fill(model: CausalLM, tensors: dict, directory) -> None:
    """Set every variable of the abstract ``model`` to its weight in ``tensors`` (laid out, cast to the
    param dtype; stacked layers gathered into one host array first); a missing weight, a wrong shape
    or a variable left unset raises."""
    dtype = jnp.dtype(model.config.param_dtype)
    stacked: dict[int, tuple[nnx.Variable, np.ndarray]] = {}    # id(variable) -> (variable, host array [L, ...])
    for hf_name, path, to_pgjax, _ in _layout(model.config):
        if hf_name not in tensors:
            raise KeyError(f"{directory}: weight {hf_name} is missing")
        variable, index = _slot(model, path)
        value, expected = to_pgjax(tensors[hf_name]), variable.get_value().shape
        expected = expected if index is None else expected[1:]
        if value.shape != expected:
            raise ValueError(f"{hf_name}: shape {tensors[hf_name].shape} does not match the config "
                             f"(expected {expected} after layout)")
        if index is None:
            variable.set_value(jnp.asarray(value.astype(dtype)))
        else:
            full = variable.get_value().shape
            stacked.setdefault(id(variable), (variable, np.empty(full, dtype)))[1][index] = value
    for variable, value in stacked.values():
        variable.set_value(jnp.asarray(value))
    base = nnx.state(model, nnx.Not(lora_lib.LoRAParam))
    unset = [jax.tree_util.keystr(path) for path, leaf in jax.tree_util.tree_leaves_with_path(base)
             if isinstance(leaf, jax.ShapeDtypeStruct)]
    if unset:
        raise RuntimeError(f"hf.load: no checkpoint weight maps to {unset} (a gap in _layout)")


def load_tokenizer(directory):
    """The Hugging Face tokenizer stored in the local checkpoint ``directory`` (AutoTokenizer, offline)."""
    from transformers import AutoTokenizer
    directory = pathlib.Path(directory)
    if not any((directory / name).exists() for name in TOKENIZER_FILES):
        raise FileNotFoundError(f"{directory} has no tokenizer files (one of {TOKENIZER_FILES})")
    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


def eos_token_ids(directory, tokenizer) -> tuple[int, ...]:
    """The tokenizer's EOS id and every ``eos_token_id`` of the checkpoint's generation_config.json
    (instruct models end turns with more than one token, e.g. Qwen's <|im_end|> and <|endoftext|>)."""
    ids = [tokenizer.eos_token_id]
    path = pathlib.Path(directory) / "generation_config.json"
    if path.exists():
        listed = json.loads(path.read_text()).get("eos_token_id")
        ids += listed if isinstance(listed, list) else [listed]
    return tuple(dict.fromkeys(i for i in ids if i is not None))


def end_of_turn_ids(tokenizer) -> tuple[int, ...]:
    """The special token the chat template closes an assistant turn with (``<|im_end|>`` for ChatML,
    ``<|eot_id|>`` for Llama 3), found by rendering a one-exchange conversation and reading the token
    right after the assistant's text; () without a template or such a token."""
    from jinja2 import TemplateError
    marker = "pgjax-end-of-turn-probe"
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": marker}], tokenize=False)
    except (TemplateError, ValueError, TypeError, LookupError):   # no template, or one that rejects this chat
        return ()
    if not isinstance(text, str) or marker not in text:
        return ()
    tail = text.split(marker, 1)[1]
    ids = tokenizer.encode(tail, add_special_tokens=False) if tail else []
    special = set(tokenizer.all_special_ids) | {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    return tuple(ids[:1]) if ids and ids[0] in special else ()


def hf_config_dict(config: ModelConfig) -> dict:
    """config.json content for ``config``."""
    family = config.family_spec
    out = {"architectures": [family.architecture], "model_type": family.model_type, "vocab_size": config.vocab_size,
           "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
           "num_hidden_layers": config.num_hidden_layers, "num_attention_heads": config.num_attention_heads,
           "num_key_value_heads": config.num_key_value_heads, "head_dim": config.head_dim,
           "rms_norm_eps": config.rms_norm_eps, "tie_word_embeddings": config.tie_word_embeddings,
           "torch_dtype": config.param_dtype, "attention_bias": config.qkv_bias}
    if family.gemma:        # transformers 5's per-layer-type rope_parameters
        rope = {"full_attention": {"rope_type": "default", **dict(config.rope_scaling or {}),
                                   "rope_theta": config.rope_theta}}
        if config.rope_local_theta is not None:
            rope["sliding_attention"] = {"rope_type": "default", "rope_theta": config.rope_local_theta}
        if config.sliding_window is not None:   # else transformers' default, unused without sliding layers
            out["sliding_window"] = config.sliding_window
        out.update(hidden_activation="gelu_pytorch_tanh", rope_parameters=rope,
                   layer_types=list(config.layer_types or ("full_attention",) * config.num_hidden_layers),
                   query_pre_attn_scalar=config.query_pre_attn_scalar or config.head_dim)
    else:
        out.update(hidden_act="silu", rope_theta=config.rope_theta)
        if config.rope_scaling:
            out["rope_scaling"] = dict(config.rope_scaling)
    out.update(family.extra_config)
    carried = {"max_position_embeddings": config.max_position_embeddings, "bos_token_id": config.bos_token_id,
               "eos_token_id": config.eos_token_id, "pad_token_id": config.pad_token_id}
    out.update((k, list(v) if isinstance(v, tuple) else v) for k, v in carried.items() if v is not None)
    return out


def save(model: CausalLM, directory, tokenizer_dir=None) -> None:
    """Write config.json and model.safetensors (and tokenizer files from ``tokenizer_dir``). A model
    with LoRA adapters is refused: save ``lora.merged(model)``, or the adapters with ``save_peft``."""
    if model.config.lora is not None:
        raise ValueError("hf.save: the model has LoRA adapters, which a Hugging Face checkpoint cannot hold; "
                         "save pgjax.models.lora.merged(model), or the adapters alone with hf.save_peft")
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config
    # contiguous: a transposed NumPy view (a model holding host arrays) would be written in its memory order
    tensors = {hf_name: np.ascontiguousarray(to_hf(_weight(model, path)))
               for hf_name, path, _, to_hf in _layout(config)}
    _save_tensors(tensors, directory / "model.safetensors")
    (directory / "config.json").write_text(json.dumps(hf_config_dict(config), indent=2))
    if tokenizer_dir is not None:
        _copy_tokenizer(pathlib.Path(tokenizer_dir), directory)


def save_peft(model: CausalLM, directory, base_model: str = "") -> None:
    """A PEFT LoRA adapter directory of ``model``'s adapters: adapter_config.json and
    adapter_model.safetensors (``lora_A.weight`` [r, in] = A^T, ``lora_B.weight`` [out, r] = B^T
    under PEFT's ``base_model.model.<module>`` names), which ``peft.PeftModel.from_pretrained``
    loads onto the transformers model of the base checkpoint (``base_model``, recorded: a local
    directory that exists as its absolute path, so that the adapter loads from any working directory;
    anything else, e.g. a hub id, as given)."""
    lora = model.config.lora
    if lora is None:
        raise ValueError("hf.save_peft: the model has no LoRA adapters")
    tensors = {}
    for i in range(model.config.num_hidden_layers):
        for target in lora.targets:
            block = "self_attn" if target in lora_lib.ATTENTION_TARGETS else "mlp"
            name = f"base_model.model.model.layers.{i}.{block}.{target}"
            module = ("attention" if block == "self_attn" else "mlp", f"{target}_lora")
            for matrix in ("a", "b"):
                value = _weight(model, ("layers", i, *module, matrix))
                tensors[f"{name}.lora_{matrix.upper()}.weight"] = np.ascontiguousarray(value.T)
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _save_tensors(tensors, directory / "adapter_model.safetensors")
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": lora.rank, "lora_alpha": lora.alpha,
              "lora_dropout": lora.dropout, "target_modules": sorted(lora.targets), "bias": "none",
              "fan_in_fan_out": False, "use_rslora": False, "init_lora_weights": True, "inference_mode": True,
              "base_model_name_or_path": _absolute_if_local(base_model), "modules_to_save": None}
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2))


def _absolute_if_local(name: str) -> str:
    """``name``'s absolute, resolved path where it names an existing local directory, else ``name``."""
    return str(pathlib.Path(name).resolve()) if name and pathlib.Path(name).is_dir() else name


def _umask() -> int:
    """This process's umask (read from /proc where it can be: setting it to read it races other threads)."""
    try:
        for line in pathlib.Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _save_tensors(tensors: dict, path: pathlib.Path) -> None:
    """Write a safetensors file with the mode a plain file write gives (0666 less the umask: readable
    by the group like any checkpoint); safetensors itself leaves its files 0600."""
    from safetensors.numpy import save_file
    save_file(tensors, str(path), metadata={"format": "pt"})
    os.chmod(path, 0o666 & ~_umask())


def _weight(model: CausalLM, path) -> np.ndarray:
    """The host array of the weight a ``_layout`` path names (one layer's row of a stacked variable)."""
    variable, index = _slot(model, path)
    value = np.asarray(variable[...])
    return value if index is None else value[index]


def _copy_tokenizer(source: pathlib.Path, directory: pathlib.Path) -> None:
    """Copy the ``COPIED_FILES`` that ``source`` holds, and its ``CHAT_TEMPLATE_DIR``, into ``directory``
    (the bytes only: the copies get a new file's mode, not the source's)."""
    for name in COPIED_FILES:
        if (source / name).exists():
            shutil.copyfile(source / name, directory / name)
    if (source / CHAT_TEMPLATE_DIR).is_dir():
        shutil.copytree(source / CHAT_TEMPLATE_DIR, directory / CHAT_TEMPLATE_DIR, dirs_exist_ok=True,
                        copy_function=shutil.copyfile)
