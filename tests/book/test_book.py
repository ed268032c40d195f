"""Build the book from fixture outputs with no warnings, then look at it in a real headless browser."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pytest

import fixture_outputs
from lab.publish import log

# pytest-xdist (make test): the module's tests stay on one worker, so the book is built once, by its module fixture
pytestmark = pytest.mark.xdist_group("test_book")

REPO = Path(__file__).resolve().parents[2]
# --virtual-time-budget lets index.html's redirect to intro.html happen. The pages are local files; their one
# remote script (MathJax, from a CDN) cannot load on a machine without a network, where chromium held each run
# ~5 s on the resolver's timeout before giving up on it (virtual time waits for pending fetches): with every host
# name unresolvable it gives up at once, and the DOM the tests read is the same (2026-11-29, 0.8 against 5.7 s a run).
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=5000"]
PAGES = {"index": "index.html", "baselines": "outputs/log/baselines.html", "bugs": "outputs/log/bugs.html",
         "sessions": "outputs/log/sessions.html"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A copy of the book's sources with fixture outputs, built once for the module."""
    root = tmp_path_factory.mktemp("book")
    for name in ("_config.yml", "_toc.yml", "intro.md"):
        shutil.copy(REPO / name, root / name)
    shutil.copytree(REPO / "lab", root / "lab", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "chapters", root / "chapters", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    fixture_outputs.build(root / "outputs")
    log.generate(root / "outputs", chapters_dir=root / "chapters")
    env = {**os.environ, "MPLCONFIGDIR": str(root / ".cache" / "matplotlib")}
    jb = Path(sys.executable).parent / "jupyter-book"
    result = subprocess.run([str(jb) if jb.exists() else "jupyter-book", "build", "-W", "-n", "--keep-going", "."],
                            cwd=root, env=env, capture_output=True, text=True, timeout=900)
    return root, result


def test_book_builds_without_warnings(built):
    root, result = built
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert "WARNING" not in output and "build succeeded" in output
    html = root / "_build" / "html"
    for page in ("intro", "outputs/book/n4_baseline", "outputs/book/n3_harness", "outputs/log/sessions",
                 "outputs/log/baselines", "outputs/log/bugs", "outputs/log/patterns"):
        assert (html / f"{page}.html").exists(), page
    n4 = (html / "outputs/book/n4_baseline.html").read_text()
    assert "Executed in session" in n4 and fixture_outputs.SESSIONS["new"][0] in n4
    assert "device = &quot;cuda&quot;" not in n4 and 'device = "cuda"' not in n4  # injected cell removed


def chromium() -> str:
    """Debian's chromium, installed when missing (root only); otherwise the test is skipped."""
    for name in ("chromium", "chromium-browser"):
        if shutil.which(name):
            return shutil.which(name)
    if os.geteuid() != 0:
        pytest.skip("chromium is not installed and installing it needs root (apt-get install -y chromium)")
    quiet = {"capture_output": True, "timeout": 900, "env": {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}}
    if subprocess.run(["apt-get", "install", "-y", "chromium"], **quiet).returncode != 0:
        subprocess.run(["apt-get", "update"], **quiet)
        subprocess.run(["apt-get", "install", "-y", "chromium"], **quiet)
    if not shutil.which("chromium"):
        pytest.skip("chromium could not be installed with apt-get (no network or no Debian package)")
    return shutil.which("chromium")


@pytest.fixture(scope="module")
def browser(built):
    if built[1].returncode != 0:
        pytest.skip("the book did not build (see test_book_builds_without_warnings)")
    return chromium()


def run_chromium(browser, build, args, url, attempts=2):
    """One headless chromium run with its own profile, in its own process group so a hung run is killed
    whole (a lingering child holding a shared profile's lock hung the next run for 120 s once in CI)."""
    for attempt in range(attempts):
        profile = build / f"chromium-profile-{os.getpid()}-{len(list(build.glob('chromium-profile-*')))}"
        proc = subprocess.Popen([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args, url],
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        try:
            return proc.communicate(timeout=90)[0]
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.communicate()
    pytest.fail(f"chromium {' '.join(args)} timed out {attempts} times on {url}")


@pytest.mark.parametrize("page", list(PAGES))
def test_pages_render_tables_and_figures_in_a_browser(built, browser, page):
    root, _ = built
    build = root / "_build"
    url = (build / "html" / PAGES[page]).as_uri()
    dom = run_chromium(browser, build, ["--dump-dom"], url)
    assert "<table" in dom, f"{page}: no table in the rendered DOM"
    if page not in ("index", "sessions"):
        assert "<img" in dom, f"{page}: no figure in the rendered DOM"
    if page == "index":  # the front page's standings, included from outputs/log/standings.md
        assert "Attention kernels: a lab notebook" in dom and "Sessions" in dom and "Latest standings" in dom
        assert all(f"<td><p>{family}</p></td>" in dom for family in ("forward", "backward", "decode", "paged decode", "ring"))
        assert "lab.ops.attention" in dom and "lab.ops.decode" in dom and "lab.ring.ring_attention" in dom
        assert "<td><p>1.00x</p></td>" in dom and "flash 0.80-1.25 (3)" in dom
    if page == "baselines":  # the pivot per GPU and family, coloured, and a figure per family
        assert dom.count('class="pivot"') == 5 and "background:rgba(46,160,67" in dom  # the five families
        assert all(f"pivot-{family}-h100-80gb-hbm3.png" in dom for family in ("fwd", "bwd", "decode", "paged"))
        assert "trend-h100-80gb-hbm3.png" in dom and "origin-l4.png" in dom and "0.743" in dom
    if page == "sessions":
        assert "RuntimeError: no kernel image is available" in dom
    if page == "bugs":
        assert "BUG-L4-2" in dom and "RUN-n7_split_k-RuntimeError" in dom
    shots = build / "screenshots"
    shots.mkdir(exist_ok=True)
    run_chromium(browser, build, [f"--screenshot={shots / page}.png", "--window-size=1280,1600"], url)
    assert (shots / f"{page}.png").stat().st_size > 10_000
    kept = REPO / "_build" / "screenshots"  # ignored folder: the latest screenshots stay for a human to look at
    kept.mkdir(parents=True, exist_ok=True)
    shutil.copy(shots / f"{page}.png", kept / f"{page}.png")


FIT_SCRIPT = """<script>
window.addEventListener("load", function () {
  var found = [];
  document.querySelectorAll("article table").forEach(function (table, i) {
    var box = table.parentElement, article = table.closest("article");
    found.push(i + ":" + table.getBoundingClientRect().width.toFixed(0) + "/" + box.clientWidth + "/" +
               box.scrollWidth + "/" + article.clientWidth);
  });
  document.body.setAttribute("data-tables", found.join(" "));
});
</script>"""


def test_front_page_tables_fit_a_1400px_window(built, browser):
    """At a 1400 px wide window every table of the front page (the standings) fits its text column: nothing
    sits behind a horizontal scrollbar."""
    root, _ = built
    build = root / "_build"
    page = build / "html" / "intro.html"
    probe = page.with_name("intro-fit-probe.html")  # beside intro.html, so its stylesheets load the same
    probe.write_text(page.read_text().replace("</body>", FIT_SCRIPT + "</body>"))
    dom = run_chromium(browser, build, ["--window-size=1400,2000", "--dump-dom"], probe.as_uri())
    match = re.search(r'data-tables="([^"]*)"', dom)
    assert match and match.group(1), "the probe found no table on the front page"
    for entry in match.group(1).split():
        index, sizes = entry.split(":")
        table, box, scroll, article = (float(x) for x in sizes.split("/"))
        assert scroll <= box + 1 and table <= article + 1, f"front page table {index} overflows: {entry}"


def test_make_book_builds_the_book_and_names_failed_chapters_when_the_session_fails(tmp_path):
    """The Makefile's contract, with stand-ins for the venv's python and jupyter-book: a failed session
    does not stop the log or the book; the failed chapters are named; the exit status is the session's."""
    if not shutil.which("make"):
        pytest.skip("make is not installed")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    calls = tmp_path / "calls.txt"
    python = venv / "bin" / "python"
    python.write_text(f"""#!/bin/sh
echo "python $*" >> {calls}
case "$*" in
  *"lab session"*) echo "session x failed; failed chapters: n7_split_k"; exit 1 ;;
  *"--summary"*) echo "latest session x: complete; failed chapters: n7_split_k" ;;
  *"lab log"*) echo "wrote outputs/log/sessions.md" ;;
esac
""")
    book = venv / "bin" / "jupyter-book"
    book.write_text(f'#!/bin/sh\necho "jupyter-book $*" >> {calls}\n')
    for stub in (python, book):
        stub.chmod(0o755)
    (venv / ".installed").touch()
    result = subprocess.run(["make", "-s", "book", f"VENV={venv}", f"VPY={python}"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0  # the session's failure is the target's failure...
    assert calls.read_text().splitlines() == [  # ...but the log and the book were still built
        "python -m lab session --no-log --prebuild", "python -m lab log", "jupyter-book build . --keep-going",
        "python -m lab log --summary"]
    assert "book: " in result.stdout and "failed chapters: n7_split_k" in result.stdout.splitlines()[-1]
