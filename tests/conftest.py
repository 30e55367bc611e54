"""Shared pytest setup: what is graded (--impl), markers, and Triton's CPU interpreter.

`pytest` grades the reference solutions (CI stays green); `pytest --impl=exercises` (or
SPECLAB_IMPL=exercises) grades your answers in exercises/ through the same tests.
"""

import ctypes
import fcntl
import gc
import importlib
import os
import tempfile
import time
from pathlib import Path

import pytest

from speclab import process_memory


def _has_cuda() -> bool:
    # Without an NVIDIA device node there is no CUDA, and torch (0.25 GB resident) stays out of the pytest-xdist
    # controller, which runs no test and only samples the run's memory.
    if not os.path.exists("/dev/nvidiactl"):
        return False
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


# Triton compiles for a GPU; without one, its interpreter runs kernels on the CPU. The variable
# must be set before triton is first imported, so it is set here, before any test module loads.
if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")


IMPLS = ("solutions", "exercises")


def pytest_addoption(parser):
    parser.addoption("--impl", choices=IMPLS, default=os.environ.get("SPECLAB_IMPL", "solutions"),
                     help="which answers the exercise tests grade: solutions (default) or exercises "
                          "(also settable with SPECLAB_IMPL)")


def pytest_report_header(config):
    impl = config.getoption("--impl")
    gpu = "CUDA GPU" if _has_cuda() else "no GPU (Triton kernels run under TRITON_INTERPRET=1)"
    return [f"speclab: grading exercise answers from {impl}/ (--impl={impl}); {gpu}"]


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if any(item.get_closest_marker(m) for m in HEAVY_MARKS):
            _HEAVY_MODULES.add(item.module.__name__)
        if "gpu" in item.keywords and not _has_cuda():
            item.add_marker(skip)
        if "notebook" in item.keywords:  # executing a lesson takes 5-20 s: not part of the fast loop
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def impl_name(pytestconfig) -> str:
    return pytestconfig.getoption("--impl")


@pytest.fixture(scope="module")
def impl(request, impl_name):
    """The module under grading: `<impl>/exNN_topic.py`, named by the test module's EXERCISE."""
    name = getattr(request.module, "EXERCISE", None)
    if name is None:
        raise RuntimeError(f"{request.module.__name__} uses the impl fixture but sets no EXERCISE = 'exNN_topic'")
    return importlib.import_module(f"{impl_name}.{name}")


@pytest.fixture
def controls(impl_name):
    """For the negative controls of exercise tests: they grade the grader, so they skip when the
    exercises (a learner's answers) are graded."""
    if impl_name == "exercises":
        pytest.skip("negative control: it grades the grader with deliberately wrong answers, not yours")


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory):
    """A tiny random Llama target over 8 tokens (a peaked head: a law test sees its mistakes) and a noisy copy
    as its draft: (the transformers target, its directory, the draft's directory). The law tests of
    lessons 06 and 10 sample from them."""
    from helpers import tiny_llama
    root = tmp_path_factory.mktemp("pair")
    hf = tiny_llama(root / "target", vocab_size=8, seed=0, head_scale=12.0)
    tiny_llama(root / "draft", vocab_size=8, seed=1, like=hf, noise=0.5)
    return hf, root / "target", root / "draft"


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test (speclab's CPU kernels run only then), restored after it. Kernel
    test modules take it for every test: `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------------------------------------
# memory and time: what each test module leaves behind, which ones raise the process's peak, and
# which ones take longest (what to trim when the suite outgrows CI's time)

_MEMORY: list[tuple[str, float, float]] = []  # (module, resident GB after it, peak GB so far)
_SECONDS: list[tuple[float, str]] = []         # (seconds from the module's first test to its end, module)


def _resident_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


# Memory: a test module that holds the real model (SmolLM2 in float32, or a lesson's kernel running it) brings its
# process to 1.8-2.9 GB; two at once, one per worker, took the run to 4.7 GB (2026-12-06, a 2-core Zen 4, once the
# vLLM tests ran apart). Under pytest-xdist such modules, and the one that drives a browser beside the book's
# server, take one lock file shared by the run's workers, so they run one at a time while the other worker goes
# on with light modules.
HEAVY_MARKS = ("real_model", "notebook", "browser")
_HEAVY_MODULES: set[str] = set()


def _heavy_lock_path(config):
    run = getattr(config, "workerinput", {}).get("testrunuid")
    return Path(tempfile.gettempdir()) / f"speclab-pytest-{run}.heavy.lock" if run else None


@pytest.fixture(scope="module", autouse=True)
def _one_heavy_module_at_a_time(request):
    path = _heavy_lock_path(request.config)
    if path is None or request.module.__name__ not in _HEAVY_MODULES:
        yield
        return
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes (or the worker dies)
        yield


@pytest.fixture(scope="module", autouse=True)
def _release_memory(request):
    """After each test module: collect its garbage and hand freed heap back to the OS (glibc's
    malloc_trim), so one module's models do not stay resident under the next one's; record it,
    and the module's time."""
    start = time.perf_counter()
    yield
    _SECONDS.append((time.perf_counter() - start, request.module.__name__))
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    if os.path.exists("/proc/self/statm"):
        _MEMORY.append((request.module.__name__, _resident_gb(), process_memory.peak_gb()))


def pytest_sessionfinish(session):
    """On a pytest-xdist worker (`make test` runs two): hand this process's records to the controller."""
    out = getattr(session.config, "workeroutput", None)
    if out is not None:
        out["speclab_memory"], out["speclab_seconds"] = _MEMORY, _SECONDS


_WORKERS: dict[str, list] = {}  # on the xdist controller: worker id -> that worker's _MEMORY
_TREE = None  # on the controller (or the only process): a sampler of every process under it


def pytest_configure(config):
    """One torch thread where tests run; start sampling the memory of the whole run (this process, its
    workers and whatever they start)."""
    global _TREE
    # The models in tests are tiny: their forwards are many small ops, which one thread runs fastest.
    # Two threads on two cores shared with anything else (a notebook kernel, a training job) spin
    # and wait on each other, and made the engine tests ~100x slower. Not in pytest-xdist's controller,
    # which runs no test: without torch it holds 0.05 GB instead of 0.27.
    controller = getattr(config, "workerinput", None) is None and bool(getattr(config.option, "numprocesses", None))
    if not controller:
        try:
            import torch
            torch.set_num_threads(1)
        except ImportError:
            pass
    if getattr(config, "workerinput", None) is None and process_memory.supported():
        _TREE = process_memory.TreeSampler(interval=1.0).start()


@pytest.hookimpl(optionalhook=True)  # an xdist hook: defined only when pytest-xdist is installed
def pytest_testnodedown(node, error):
    out = getattr(node, "workeroutput", {})
    _WORKERS[node.workerinput.get("workerid", "?")] = out.get("speclab_memory", [])
    _SECONDS.extend(tuple(x) for x in out.get("speclab_seconds", []))


def _memory_line(records: list) -> str:
    rises, before = [], 0.0
    for name, _, peak in records:
        if peak > before:
            rises.append((peak - before, name, peak))
            before = peak
    top = sorted(rises, reverse=True)[:5]
    return (f"peak resident {records[-1][2]:.2f} GB; raised most by "
            + ", ".join(f"{n.removeprefix('tests.')} (+{d:.2f} to {p:.2f})" for d, n, p in top))


def pytest_terminal_summary(terminalreporter):
    """The peak resident memory of the run (of each worker's process, under xdist) and the test
    modules that raised it most; the slowest modules (their time in their worker)."""
    if _SECONDS:
        slow = sorted(_SECONDS, reverse=True)[:8]
        terminalreporter.write_line("time: slowest modules " + ", ".join(
            f"{n.removeprefix('tests.')} {s:.0f} s" for s, n in slow) + f" (of {sum(s for s, _ in _SECONDS):.0f} s)")
    if _MEMORY:
        terminalreporter.write_line("memory: " + _memory_line(_MEMORY))
    if _TREE is not None:
        terminalreporter.write_line("memory: the whole run at its peak: " + _TREE.stop().line())
    workers = {w: r for w, r in sorted(_WORKERS.items()) if r}
    if workers:
        total = sum(r[-1][2] for r in workers.values())
        terminalreporter.write_line(f"memory: {len(workers)} workers, their peaks add up to {total:.2f} GB (their own "
                                    "processes only; the line above counts everything at once)")
        for w, r in workers.items():
            terminalreporter.write_line(f"memory: {w}: " + _memory_line(r))
