"""Build the executed course as a static HTML site: `make book` (or python scripts/build_book.py).

Each lesson notebook is executed top to bottom (nbclient, as tests/test_notebooks.py does) and turned
into one HTML page with its outputs, its figures (notebooks/figures/, copied beside the pages) and its
math (MathJax 2.7 from the pinned `jupyter-server-mathjax` wheel, copied into the site: nothing is
fetched when a page is opened). An index page gives the three learning paths and the lesson list with
each lesson's execution time on the machine that built it.

    python scripts/build_book.py                      # every lesson -> build/book/index.html
    python scripts/build_book.py --lessons 00 11      # only these (the other index entries stay unlinked)
    python scripts/build_book.py --no-execute         # the committed (stripped) notebooks, no outputs

The executed notebooks are kept in build/book/executed/, where scripts/make_figures.py reuses them.
"""

import argparse
import html
import json
import os
import platform
import re
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
MATHJAX_CONFIG = "TeX-AMS-MML_HTMLorMML-full,Safe"  # the configs the wheel ships

PATHS = [
    ("Learn it in order", "about 2 days",
     "Lessons 00 to 11, each run top to bottom, each ending with its exercise. 00-02 are the mathematics, "
     "03-04 the drafters, 05-07 the engine's memory, batch and kernel, 08 the heads, 09 serving, 11 review."),
    ("Interview in a week", "1 hour a day",
     "Day 1: 01-02 (rejection rule, E and S). Day 2: 00 and 09 (why decode is slow, batch size, metrics). "
     "Day 3: 03, 04, 08 (drafters and heads). Day 4: 06 (the ragged batch). Day 5-7: 11, the drills and "
     "exercise 11, with the answer keys in solutions/answers/."),
    ("Read the engine", "an afternoon",
     "05 (paged KV and rollback), 06 (one rejection_sample call per step), 08 (lookahead slots) and 09 "
     "(the server), with notebooks/vllm_crosswalk.md open beside speclab/engine/."),
]


def lesson_notebooks() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def machine() -> str:
    """The CPU model and core count, for captions and the index."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores"


def kernel_peak_mib(client) -> float | None:
    """The kernel process's peak resident memory (Linux's VmHWM), read before it shuts down."""
    try:
        pid = client.km.provisioner.pid
        status = Path(f"/proc/{pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024
    except (AttributeError, OSError, TypeError):
        return None


def execute(path: Path, out_dir: Path, timeout: int = 900):
    """Run one lesson top to bottom with its folder as the working directory; returns (notebook, seconds).
    The run's time and the kernel's peak memory go into the notebook's metadata (speclab_book)."""
    import nbformat
    from nbclient import NotebookClient

    class Measured(NotebookClient):
        peak_mib = None

        def set_widgets_metadata(self):  # called once every cell has run, while the kernel is still up
            self.peak_mib = kernel_peak_mib(self)
            super().set_widgets_metadata()

    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = Measured(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    seconds = time.perf_counter() - start
    out_dir.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    nb.metadata["speclab_book"] = {"seconds": round(seconds, 1), "machine": machine(),
                                   "peak_mib": client.peak_mib and round(client.peak_mib),
                                   "load_average": load and round(load, 1),
                                   "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    nbformat.write(nb, out_dir / path.name)
    return nb, seconds


def title_of(nb) -> str:
    first = "".join(nb.cells[0].source).splitlines()[0] if nb.cells else ""
    return first.lstrip("# ").strip() or "lesson"


def nav(pages: list[tuple[str, str]], here: int) -> str:
    prev_link = f'<a href="{pages[here - 1][0]}">&larr; {html.escape(pages[here - 1][1])}</a>' if here > 0 else ""
    next_link = (f'<a href="{pages[here + 1][0]}">{html.escape(pages[here + 1][1])} &rarr;</a>'
                 if here + 1 < len(pages) else "")
    return (f'<nav class="speclab-nav" style="display:flex;justify-content:space-between;gap:1em;padding:.6em 1em;'
            f'font-family:sans-serif;border-bottom:1px solid #ddd">{prev_link}<a href="index.html">index</a>'
            f'{next_link}</nav>')


# The wheel ships MathJax's STIX-Web fonts only (no TeX fonts): tell both output processors to use them.
FONT_CONFIG = ('<script type="text/x-mathjax-config">MathJax.Hub.Config({"HTML-CSS": {availableFonts: ["STIX-Web"], '
               'preferredFont: "STIX-Web", webFont: "STIX-Web", imageFont: null}, SVG: {font: "STIX-Web"}});</script>\n')


def to_html(nb, exporter) -> str:
    body, _ = exporter.from_notebook_node(nb)
    body = body.replace('<script src="mathjax/', FONT_CONFIG + '<script src="mathjax/', 1)
    if re.search(r"""(src|href)=["']https?://""", body):  # a page must open offline
        body = re.sub(r"""<script[^>]+src=["']https?://[^"']+["'][^>]*>\s*</script>""", "", body)
        body = re.sub(r"""<link[^>]+href=["']https?://[^"']+["'][^>]*>""", "", body)
    return body


def index_page(entries, built: str) -> str:
    paths = "".join(f"<li><b>{html.escape(n)}</b> ({html.escape(t)}): {html.escape(d)}</li>" for n, t, d in PATHS)
    rows = []
    for name, title, seconds, peak in entries:
        link = f'<a href="{name}.html">{html.escape(title)}</a>' if seconds is not None else html.escape(title)
        took = f"{seconds:.0f} s" if isinstance(seconds, (int, float)) and seconds >= 0 else ("not run" if seconds else "")
        mem = f"{peak / 1024:.1f} GB" if peak else ""
        rows.append(f"<tr><td>{html.escape(name[:2])}</td><td>{link}</td><td>{took}</td><td>{mem}</td></tr>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>speclab: speculative decoding, from the math to the kernel</title>
<style>body{{font-family:sans-serif;max-width:52em;margin:2em auto;line-height:1.5;padding:0 1em}}
td,th{{padding:.2em .8em;text-align:left}} tr:nth-child(even){{background:#f4f4f4}}</style></head>
<body><h1>speclab</h1>
<p>Speculative decoding for LLMs, from the math to the kernel: the executed course. Every page below was run
top to bottom on {html.escape(built)}; its outputs, figures and math are part of this folder, and nothing is
fetched from the network.</p>
<h2>Start here: three paths</h2><ul>{paths}</ul>
<h2>Lessons</h2>
<table><tr><th>#</th><th>lesson</th><th>run time</th><th>peak memory</th></tr>{''.join(rows)}</table>
<p>Exercises: <code>exercises/exNN_*.py</code>, graded by <code>pytest --impl=exercises tests/test_exNN_*.py</code>;
answer keys in <code>solutions/answers/</code>.</p>
</body></html>
"""


def build(out: Path, lessons: list[str] | None, execute_notebooks: bool) -> list[tuple]:
    import nbformat
    from nbconvert import HTMLExporter
    import jupyter_server_mathjax

    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(NOTEBOOKS / "figures", out / "figures", dirs_exist_ok=True)
    mathjax_src = Path(jupyter_server_mathjax.__file__).parent / "static"
    if not (out / "mathjax" / "MathJax.js").exists():
        shutil.copytree(mathjax_src, out / "mathjax", dirs_exist_ok=True)
    exporter = HTMLExporter(template_name="lab", mathjax_url=f"mathjax/MathJax.js?config={MATHJAX_CONFIG}")

    all_nbs = lesson_notebooks()
    chosen = [p for p in all_nbs if lessons is None or p.name[:2] in lessons]
    if lessons and len(chosen) != len(set(lessons)):
        known = sorted(p.name[:2] for p in all_nbs)
        raise SystemExit(f"unknown lesson in {lessons}: the lessons are {known}")
    pages = [(p.stem + ".html", title_of(nbformat.read(p, as_version=4))) for p in chosen]
    entries = {p.stem: (p.stem, title_of(nbformat.read(p, as_version=4)), None, None) for p in all_nbs}
    for i, path in enumerate(chosen):
        if execute_notebooks:
            nb, seconds = execute(path, out / "executed")
        else:
            nb, seconds = nbformat.read(path, as_version=4), -1.0
        body = to_html(nb, exporter).replace("<body", "<body", 1)
        body = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + nav(pages, i), body, count=1)
        (out / f"{path.stem}.html").write_text(body)
        entries[path.stem] = (path.stem, title_of(nb), seconds, nb.metadata.get("speclab_book", {}).get("peak_mib"))
        meta = nb.metadata.get("speclab_book", {})
        print(f"  {path.stem}.html" + (f"  (executed in {seconds:.1f} s, kernel peak {meta.get('peak_mib')} MiB, "
                                       f"load average {meta.get('load_average')})" if seconds >= 0 else "  (not executed)"),
              flush=True)
    built = f"{machine()}, {datetime.now(timezone.utc):%Y-%m-%d}"
    (out / "index.html").write_text(index_page(list(entries.values()), built))
    (out / "book.json").write_text(json.dumps({"built": built, "pages": [e for e in entries.values()]}, indent=1))
    return list(entries.values())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "book", help="output folder (build/book)")
    ap.add_argument("--lessons", nargs="*", help="two-digit lesson numbers (default: all)")
    ap.add_argument("--no-execute", action="store_true", help="render the committed notebooks without running them")
    args = ap.parse_args(argv)
    try:
        import nbconvert  # noqa: F401
        import jupyter_server_mathjax  # noqa: F401
    except ImportError as e:
        sys.exit(f"{e.name} is missing: the book needs the `book` extra (pip install -e '.[book]', or make setup)")
    start = time.perf_counter()
    build(args.out, args.lessons, not args.no_execute)
    print(f"book: {args.out / 'index.html'} in {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
