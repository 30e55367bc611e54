"""Regenerate the lessons' key figures as small committed PNGs: `make figures`.

A stripped notebook shows no plot on a code host; each lesson's first markdown cell shows its key
figure from notebooks/figures/ instead. The figure is the lesson's own plot: this script executes the
lesson (or reuses build/book/executed/, which `make book` leaves, when it is newer than the lesson),
takes the image output of the code cell named below, scales it to at most 900 px wide and stamps a
footer with the machine and the date it was made on. Lesson 11 has no plot of its own; its figure is
drawn here from the closed forms it reviews.

    python scripts/make_figures.py            # every lesson's figure
    python scripts/make_figures.py 08 11      # only these
"""

import base64
import io
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from build_book import NOTEBOOKS, execute, machine  # noqa: E402  (the same executor as the book)

FIGURES_DIR = NOTEBOOKS / "figures"
MAX_WIDTH = 900

# lesson -> (output file, a string found in the code cell whose image is the figure)
FIGURES = {
    "00": ("00_time_per_forward.png", 'title="time per forward (B = 1)"'),
    "01": ("01_emitted_vs_target.png", 'label="emitted"'),
    "02": ("02_speedup_vs_gamma.png", 'speedup vs gamma, c = 0.05'),
    "03": ("03_ngram_acceptance.png", 'perfect target (reference text)'),
    "04": ("04_acceptance_per_position.png", 'vLLM per position: accepted at i / drafts'),
    "05": ("05_rollback.png", 'after rollback: A keeps'),
    "06": ("06_ragged_layout.png", 'draft_token_ids (T,)'),
    "07": ("07_exponential_race.png", 'argmax r/E frequency'),
    "08": ("08_acceptance_per_position.png", 'accepted / drafts'),
    "09": ("09_price_vs_batch.png", 'speculation pays below the dashed line'),
    "10": ("10_block_gain.png", 'rows = block.gain_table(target, draft, gammas=range(1, 9))'),
    "11": ("11_speedup_and_ops.png", None),
}


def stamp(png: bytes, note: str) -> bytes:
    """Scale to MAX_WIDTH and add a one-line footer."""
    from PIL import Image, ImageDraw

    img = Image.open(io.BytesIO(png)).convert("RGB")
    if img.width > MAX_WIDTH:
        img = img.resize((MAX_WIDTH, round(img.height * MAX_WIDTH / img.width)), Image.LANCZOS)
    width = max(img.width, int(ImageDraw.Draw(img).textlength(note)) + 8)  # a narrow figure still shows the note
    out = Image.new("RGB", (width, img.height + 18), "white")
    out.paste(img, ((width - img.width) // 2, 0))
    ImageDraw.Draw(out).text((4, img.height + 3), note, fill=(90, 90, 90))
    buf = io.BytesIO()
    out.quantize(colors=128).save(buf, format="PNG", optimize=True)
    return buf.getvalue()


def executed(stem: str):
    import nbformat

    src = NOTEBOOKS / f"{stem}.ipynb"
    cached = ROOT / "build" / "book" / "executed" / src.name
    if cached.exists() and cached.stat().st_mtime > src.stat().st_mtime:
        return nbformat.read(cached, as_version=4)
    nb, seconds = execute(src, ROOT / "build" / "book" / "executed")
    print(f"  executed {src.name} in {seconds:.0f} s", flush=True)
    return nb


def image_of(nb, needle: str, stem: str) -> bytes:
    for cell in nb.cells:
        if cell.cell_type == "code" and needle in "".join(cell.source):
            for out in cell.get("outputs", []):
                data = out.get("data", {})
                if "image/png" in data:
                    return base64.b64decode(data["image/png"])
            raise SystemExit(f"{stem}: the cell containing {needle!r} made no image (did it fail or skip?)")
    raise SystemExit(f"{stem}: no code cell contains {needle!r}: update FIGURES in scripts/make_figures.py")


def lesson11_figure() -> bytes:
    """S(gamma) at c = 0.05 for four alphas, and Theorem 3.11's arithmetic factor."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from speclab import stats

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4))
    gammas = np.arange(0, 21)
    for a in (0.5, 0.7, 0.8, 0.9):
        s = [stats.speedup(a, int(g), 0.05) for g in gammas]
        best = int(np.argmax(s))
        ax[0].plot(gammas, s, ".-", label=f"alpha = {a}")
        ax[0].plot(best, s[best], "k*", ms=10)
        ops = [(1 - a) * (g * 0.05 + g + 1) / (1 - a ** (g + 1)) for g in gammas[1:]]
        ax[1].plot(gammas[1:], ops, ".-", label=f"alpha = {a}")
    ax[0].axhline(1, c="gray", ls=":")
    ax[0].set(xlabel="gamma (drafts per step)", ylabel="speedup S", title="S(gamma), c = 0.05 (* = best gamma)")
    ax[1].axhline(1, c="gray", ls=":")
    ax[1].set(xlabel="gamma", ylabel="arithmetic / plain decoding", title="Theorem 3.11: ops factor, c_hat = 0.05")
    for a_ in ax:
        a_.legend(fontsize=8)
        a_.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def main(argv=None):
    wanted = (argv if argv is not None else sys.argv[1:]) or list(FIGURES)
    unknown = [w for w in wanted if w not in FIGURES]
    if unknown:
        raise SystemExit(f"no figure for lesson(s) {unknown}; known: {sorted(FIGURES)}")
    FIGURES_DIR.mkdir(exist_ok=True)
    note = f"made by `make figures` on {machine()}, {datetime.now(timezone.utc):%Y-%m-%d}"
    for lesson in wanted:
        name, needle = FIGURES[lesson]
        if needle is None:
            png = lesson11_figure()
        else:
            stem = next(p.stem for p in NOTEBOOKS.glob(f"{lesson}_*.ipynb"))
            png = image_of(executed(stem), needle, stem)
        data = stamp(png, note)
        (FIGURES_DIR / name).write_bytes(data)
        print(f"  notebooks/figures/{name}: {len(data) / 1024:.0f} KiB", flush=True)


if __name__ == "__main__":
    main()
