"""The course reads without installing: `make book` renders the lessons as a static site that works offline,
and a real browser (headless Chromium from Debian's packages, which .ci/run installs) shows a lesson page
with its figures, its outputs and its math typeset. Without chromium or chromedriver the browser test skips
with a reason."""

import functools
import http.server
import io
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSON = "11"  # built executed for the browser test: it has LaTeX math, a committed figure and printed outputs

pytest.importorskip("nbconvert", reason="the book needs the `book` extra: pip install -e '.[book]' (make setup)")
pytest.importorskip("jupyter_server_mathjax", reason="the book needs the `book` extra (make setup)")


def build(out: Path, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "build_book.py"), "--out", str(out), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


def test_book_pages_are_offline_and_link_the_lessons(tmp_path):
    """Unexecuted build of two lessons: the pages, the index with its paths, figures and MathJax inside the site."""
    build(tmp_path, "--no-execute", "--lessons", "00", LESSON)
    index = (tmp_path / "index.html").read_text()
    for path in ("Learn it in order", "Interview in a week", "Read the engine"):
        assert path in index, f"the index lacks the learning path {path!r}"
    lessons = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    for stem in lessons:
        assert stem[:2] in index, f"the index does not list lesson {stem}"
    assert f'href="{lessons[0]}.html"' in index
    page = (tmp_path / next(s for s in lessons if s.startswith(LESSON))).with_suffix(".html").read_text()
    remote = re.findall(r"""<(?:script|link|img)[^>]+(?:src|href)=["'](https?://[^"']+)""", page)
    assert not remote, f"a page must open offline; it loads {remote[:3]}"
    assert 'src="mathjax/MathJax.js' in page and (tmp_path / "mathjax" / "MathJax.js").exists()
    for src in re.findall(r'<img[^>]+src="(figures/[^"]+)"', page):
        assert (tmp_path / src).exists(), f"{src} is referenced by the page but not in the site"


def _chrome():
    chromium, driver = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.skip("needs Debian's chromium and chromium-driver (installed by .ci/run; apt-get install chromium "
                    "chromium-driver)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium (the `book` extra)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,1400"):
        opts.add_argument(arg)
    opts.binary_location = chromium
    return webdriver.Chrome(service=Service(driver), options=opts)  # a given driver: Selenium Manager fetches nothing


@pytest.fixture
def served(tmp_path):
    """Lesson 11 built executed and served on 127.0.0.1 (MathJax's fonts are refused over file://)."""
    build(tmp_path, "--lessons", LESSON)
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", tmp_path
    server.shutdown()


@pytest.mark.slow
@pytest.mark.browser
def test_a_lesson_page_shows_its_figures_outputs_and_typeset_math(served):
    import numpy as np
    from PIL import Image

    url, site = served
    page = next(p.name for p in site.glob(f"{LESSON}_*.html"))
    browser = _chrome()
    try:
        browser.get(f"{url}/{page}")
        deadline = time.time() + 60
        while time.time() < deadline:  # MathJax typesets after load; wait until its queue is empty
            done = browser.execute_script(
                "return !!(window.MathJax && MathJax.Hub && MathJax.Hub.queue && MathJax.Hub.queue.pending === 0"
                " && document.querySelectorAll('.MathJax, .MathJax_Display, mjx-container').length > 0)")
            if done:
                break
            time.sleep(0.5)
        math = browser.execute_script("return document.querySelectorAll('.MathJax, mjx-container').length")
        raw = browser.execute_script("return (document.body.innerText.match(/\\$\\$|\\\\frac|\\\\alpha/g) || []).length")
        assert math >= 10 and raw == 0, f"math not typeset: {math} MathJax elements, {raw} raw TeX fragments left"
        errors = browser.execute_script("return document.querySelectorAll('.MathJax_Error, merror').length")
        assert errors == 0, f"{errors} formulas failed to typeset"

        images = browser.execute_script(
            "return Array.from(document.images).filter(i => i.getAttribute('src').startsWith('figures/'))"
            ".map(i => [i.getAttribute('src'), i.naturalWidth, i.naturalHeight, i.getBoundingClientRect().width])")
        assert images, "the lesson page shows no committed figure"
        for src, w, h, shown in images:
            assert w > 100 and h > 50 and shown > 100, f"{src} did not load or is not shown ({w}x{h}, {shown}px wide)"

        text = browser.execute_script("return document.body.innerText")
        assert re.search(r"lesson 11 ran in \d+\.\d s", text), "the executed page lacks its cells' outputs"
        assert "Exercises" in text and "pytest" in text

        figure = browser.find_element("css selector", "img[src^='figures/']")
        browser.execute_script("arguments[0].scrollIntoView()", figure)
        shot = np.asarray(Image.open(io.BytesIO(figure.screenshot_as_png)).convert("L"), dtype=float)
        assert shot.shape[1] > 100 and shot.std() > 20, \
            f"the figure's screenshot is blank or flat (std {shot.std():.1f}): the image is not drawn"
        browser.execute_script("window.scrollTo(0, 0)")
        page_shot = np.asarray(Image.open(io.BytesIO(browser.get_screenshot_as_png())).convert("L"), dtype=float)
        assert (page_shot < 128).mean() > 0.01, "the page's screenshot is almost empty: nothing rendered"
    finally:
        browser.quit()
