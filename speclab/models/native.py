"""speclab's C++ kernels, built once per machine with the host's compiler and loaded with ctypes.

Each kernel is one .cpp file beside this one (`cpu_gemm.cpp`, `cpu_attention.cpp`,
`cpu_elementwise.cpp`, and `cpu_decoder.cpp`, which calls the other three through their entry points'
addresses) with a plain C entry point: no torch headers, a build of about a second. It is compiled with `c++ -O3
-march=native -ffp-contract=off` (or $CXX) into speclab's cache (`$SPECLAB_CACHE/<name>/`), keyed
by the source, the flags, the compiler and the CPU, so a change to any of them builds again.
`-ffp-contract=off`: the compiler fuses no multiply-add on its own, so a result's bits do not
depend on how it chose to vectorise a loop (cpu_gemm.cpp says how that was caught).

Where there is no compiler, the build fails or the kernel's switch is set to 0, `load` says why
and the caller takes torch's path (with a warning, except for the switch).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from speclab.cache import cache_root
from speclab.cpu_info import cpu_name

FLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-shared", "-fPIC", "-std=c++17"]


def compiler() -> str | None:
    """The C++ compiler to build with: $CXX, else c++ / g++ / clang++ on PATH."""
    if os.environ.get("CXX"):
        return os.environ["CXX"]
    return next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)


def library_path(source: Path, cxx: str) -> Path:
    """Where this machine's build of `source` lives: keyed by the source, the flags, the compiler and the CPU."""
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    key = hashlib.sha256("\0".join([source.read_text(), " ".join(FLAGS), cxx, version, platform.machine(),
                                    cpu_name()]).encode()).hexdigest()[:16]
    return cache_root() / source.stem / f"{source.stem}-{key}.so"


def build(source: Path, cxx: str) -> Path:
    """Compile `source` if this machine has no build of it yet; the path of the shared library.
    Atomic: concurrent processes each write a temporary file and rename it into place."""
    path = library_path(source, cxx)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    os.close(fd)
    try:
        done = subprocess.run([cxx, *FLAGS, "-o", tmp, str(source)], capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{cxx} failed to build {source.name}:\n{done.stderr.strip()[-2000:]}")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def load(source: Path, symbol: str, argtypes: list, restype, switch: str):
    """(the C function `symbol` of `source`'s build, '') or (None, why it is not available).
    The environment variable `switch` set to 0 turns the kernel off."""
    if os.environ.get(switch, "1") == "0":
        return None, f"{switch}=0"
    cxx = compiler()
    if cxx is None:
        return None, "no C++ compiler found (install g++ or clang++, or set CXX)"
    try:
        fn = getattr(ctypes.CDLL(str(build(source, cxx))), symbol)
    except (OSError, AttributeError, RuntimeError, subprocess.SubprocessError) as e:
        return None, str(e)
    fn.argtypes, fn.restype = argtypes, restype
    return fn, ""
