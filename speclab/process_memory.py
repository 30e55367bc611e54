"""Memory a command holds: this process's peak, and a whole process tree's, sampled (Linux).

The README states what each command needs, so that a learner with an 8 GB laptop knows what will
fit. One process's peak is what the kernel records (`ru_maxrss`). A command that starts others
(`make test` runs two pytest-xdist workers, which start notebook kernels, servers and vLLM engines)
has no such record, so `TreeSampler` reads every process under it every `interval` seconds and
keeps the largest sum:

- **resident** (RSS): the pages each process has in memory, summed. Pages that several processes
  share (torch's libraries, a model file mapped by two workers) count once per process, so this
  over-states what the machine must hold: it is the bound to quote.
- **proportional** (PSS): each shared page divided among the processes that share it, so the sum
  is what the processes hold together (`/proc/PID/smaps_rollup`).

Reading PSS walks every page table (about 50 ms for a 2.7 GB process, against 1 ms for RSS), so it
is read every `pss_every`-th sample only. A peak shorter than the interval can fall between two
samples. Figures are in GB (10^9 bytes), as the README states them.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from pathlib import Path

PROC = Path("/proc")


def peak_gb() -> float:
    """This process's peak resident memory so far, in GB (`ru_maxrss` is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def supported() -> bool:
    """Whether process trees can be read here (Linux's /proc)."""
    return (PROC / "self" / "stat").exists()


def _children() -> dict[int, list[int]]:
    """Parent pid -> its children's pids, for every process now running."""
    out: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended while we looked
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])  # the name may hold spaces and parentheses
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def tree(pid: int) -> list[int]:
    """pid and every process under it (children, their children, ...)."""
    children, out, todo = _children(), [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(children.get(p, []))
    return out


def _kb(path: Path, field: str) -> int:
    try:
        for line in path.read_text().splitlines():
            if line.startswith(field):
                return int(line.split()[1])
    except OSError:  # the process ended
        pass
    return 0


def _name(pid: int) -> str:
    """A short name for a process: its command line's first words (the program and its module or script)."""
    try:
        words = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    words = [w.decode(errors="replace") for w in words if w]
    if "-c" in words and any("sys.stdin.readline()" in w for w in words):
        return "pytest-xdist worker"  # execnet's bootstrap: `python -u -c "import sys;exec(eval(sys.stdin.readline()))"`
    for i, w in enumerate(words):  # `python -m module` or `python script`: name the module or the script
        if w == "-m" and i + 1 < len(words):
            return Path(words[0]).name + " -m " + words[i + 1]
        if w == "-c":
            return Path(words[0]).name + " -c"
    rest = [w for w in words[1:] if not w.startswith("-")][:1]  # the script, past the interpreter's options
    return " ".join(Path(w).name if "/" in w else w for w in words[:1] + rest)[:60] or "?"


def processes(pid: int, proportional: bool = True) -> list[tuple[int, str, float, float]]:
    """(pid, name, resident GB, proportional GB or 0.0) of pid and everything under it now, largest first."""
    out = []
    for p in tree(pid):
        rss = _kb(PROC / str(p) / "status", "VmRSS:") * 1024 / 1e9
        pss = _kb(PROC / str(p) / "smaps_rollup", "Pss:") * 1024 / 1e9 if proportional else 0.0
        out.append((p, _name(p), rss, pss))
    return sorted(out, key=lambda r: -r[2])


def tree_gb(pid: int, proportional: bool = True) -> tuple[float, float, int]:
    """(resident GB, proportional GB or 0.0 when not asked for, processes) of pid and everything
    under it now."""
    rows = processes(pid, proportional)
    return sum(r[2] for r in rows), sum(r[3] for r in rows), len(rows)


class TreeSampler:
    """Samples the tree under `pid` every `interval` seconds (PSS every `pss_every`-th time) in a
    daemon thread, from `start()` to `stop()`, and keeps the peaks (`peak_resident_gb`,
    `peak_proportional_gb`), the number of processes seen at once (`most_processes`), and who held
    the resident peak (`at_peak`: (name, resident GB) of its largest processes, `peak_time`)."""

    def __init__(self, pid: int | None = None, interval: float = 1.0, pss_every: int = 5):
        if interval <= 0 or pss_every < 1:
            raise ValueError(f"interval must be positive seconds and pss_every a positive count, got "
                             f"{interval} and {pss_every}")
        self.pid = os.getpid() if pid is None else pid
        self.interval, self.pss_every = interval, pss_every
        self.peak_resident_gb = self.peak_proportional_gb = 0.0
        self.most_processes = self.samples = 0
        self.at_peak: list[tuple[str, float]] = []
        self.peak_time = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self, proportional: bool | None = None) -> None:
        if proportional is None:
            proportional = self.samples % self.pss_every == 0
        rows = processes(self.pid, proportional)
        rss, pss = sum(r[2] for r in rows), sum(r[3] for r in rows)
        if rss > self.peak_resident_gb:
            self.peak_resident_gb, self.peak_time = rss, time.time()
            self.at_peak = [(name, r) for _, name, r, _ in rows[:6]]
        self.peak_proportional_gb = max(self.peak_proportional_gb, pss)
        self.most_processes = max(self.most_processes, len(rows))
        self.samples += 1

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def start(self) -> TreeSampler:
        if not supported():
            raise RuntimeError("sampling a process tree needs Linux's /proc")
        self._thread = threading.Thread(target=self._run, name="speclab-memory", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> TreeSampler:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample(proportional=True)  # a last reading, so a short run has at least two
        return self

    def __enter__(self) -> TreeSampler:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def line(self) -> str:
        """The peaks, for a summary line."""
        return (f"{self.peak_resident_gb:.2f} GB resident (summed over up to {self.most_processes} processes; "
                f"shared pages counted in each), {self.peak_proportional_gb:.2f} GB proportional (shared pages "
                f"divided among them); sampled every {self.interval:g} s (PSS every {self.interval * self.pss_every:g} s), "
                f"{self.samples} samples. At the resident peak ({time.strftime('%H:%M:%S', time.localtime(self.peak_time))}): "
                + ", ".join(f"{name} {gb:.2f}" for name, gb in self.at_peak))
