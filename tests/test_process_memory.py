"""speclab.process_memory: the memory figures the README states for `make test` and the demo."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

from speclab import process_memory

pytestmark = pytest.mark.skipif(not process_memory.supported(), reason="needs Linux's /proc")

# A child that starts a grandchild holding `mb` MB of written pages (zeroed pages from calloc
# would not be resident), says "ready" once both hold their memory, then waits for stdin to close.
HOLDER = textwrap.dedent("""
    import subprocess, sys
    mb = int(sys.argv[1])
    inner = "import sys; b = b'\\\\x01' * (%d * 10**6); print('ready', flush=True); sys.stdin.read()" % mb
    g = subprocess.Popen([sys.executable, "-c", inner], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert g.stdout.readline().strip() == "ready"
    print(g.pid, flush=True)
    sys.stdin.read()
    g.stdin.close(); g.wait()
""")


def _holder(mb: int) -> tuple[subprocess.Popen, int]:
    p = subprocess.Popen([sys.executable, "-c", HOLDER, str(mb)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    return p, int(p.stdout.readline())


def test_a_grandchilds_memory_is_counted_while_it_lives():
    base, _, _ = process_memory.tree_gb(os.getpid(), proportional=False)
    p, grandchild = _holder(300)
    try:
        assert grandchild in process_memory.tree(os.getpid())
        with process_memory.TreeSampler(interval=0.05, pss_every=1) as s:
            time.sleep(0.2)
        # 300 MB in the grandchild, seen through two generations of processes
        assert s.peak_resident_gb >= base + 0.28, s.line()
        assert s.peak_proportional_gb >= 0.28, s.line()
        assert s.most_processes >= 3 and s.samples >= 3
        # negative control: the child alone holds far less, so the 300 MB were found by walking
        # down to the grandchild, not in the child
        rss_child_only = process_memory._kb(process_memory.PROC / str(p.pid) / "status", "VmRSS:") / 1e6
        assert rss_child_only < 0.2
    finally:
        p.stdin.close()
        p.wait(timeout=30)
    after, _, _ = process_memory.tree_gb(os.getpid(), proportional=False)
    assert after < base + 0.15  # gone with the process


def test_peak_of_this_process_matches_the_kernels_record():
    with open("/proc/self/status") as f:
        hwm_kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    assert process_memory.peak_gb() == pytest.approx(hwm_kb * 1024 / 1e9, rel=0.05)


def test_bad_settings_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="interval must be positive"):
        process_memory.TreeSampler(interval=0)
    with pytest.raises(ValueError, match="pss_every"):
        process_memory.TreeSampler(pss_every=0)


def test_processes_are_named_by_their_module_or_script(tmp_path):
    script = tmp_path / "hold.py"
    script.write_text("import sys; sys.stdin.read()\n")
    cases = [([sys.executable, "-u", str(script)], "hold.py"),
             ([sys.executable, "-m", "json.tool"], "-m json.tool"),
             ([sys.executable, "-c", "import sys; sys.stdin.read()"], "-c")]
    for cmd, want in cases:
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE)
        try:
            time.sleep(0.2)
            name = process_memory._name(p.pid)
            assert name.endswith(want) and name.startswith("python"), (cmd, name)
            assert (p.pid, name) in [(pid, n) for pid, n, _, _ in process_memory.processes(os.getpid(), False)]
        finally:
            p.stdin.close()
            p.wait(timeout=30)
