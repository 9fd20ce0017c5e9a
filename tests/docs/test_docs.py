"""The documentation site cannot rot: it builds with warnings as errors (a broken reference, an
undocumented public name, a docstring that does not parse), and every multi-rank example on its pages
runs under mpiexec at the rank count it states and prints what the page shows (doc_examples.py).
The single-process ``>>>`` sessions run as doctests in the same pytest call (scripts/test.sh)."""
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.parse

import pytest

import doc_examples

sys.path.insert(0, os.path.join(doc_examples.ROOT, "tests"))
from run_mpi import MPIEXEC, mpi_env  # noqa: E402

sys.path.insert(0, doc_examples.ROOT)
from pydist import _figures as figures  # noqa: E402

EXAMPLES = doc_examples.examples()
TIMEOUT = 180   # per example, a hang guard: the longest (DDP with torch) takes under 10 s here


def example_env():
    """The jobs' environment, with Python's output buffered as a reader's would be: unbuffered (as
    PYTHONUNBUFFERED makes it), print() writes a line's text and its newline apart, and another rank's
    line can land between them."""
    env = mpi_env(TIMEOUT)
    env.pop("PYTHONUNBUFFERED", None)
    return env


def test_the_site_builds_with_warnings_as_errors():
    out = os.path.join(doc_examples.DOCS, "_build", "html")
    proc = subprocess.run([sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
                           doc_examples.DOCS, out], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"sphinx-build failed:\n{proc.stdout}\n{proc.stderr}"
    assert os.path.exists(os.path.join(out, "index.html")) and os.path.exists(os.path.join(out, "search.html"))


def test_an_unbuilt_checkout_documents_the_installed_pydist(tmp_path):
    """Sphinx run in a checkout with no build in it (pydist installed into the environment, as by
    pip install .[docs]): conf.py takes the installed pydist, never the source folder's, which cannot
    import. (The whole build from a pip install is the same build as above, on that pydist.)"""
    import shutil
    checkout = tmp_path / "pydist-src"
    shutil.copytree(doc_examples.DOCS, checkout / "docs", ignore=shutil.ignore_patterns("_build"))
    shutil.copytree(os.path.join(doc_examples.ROOT, "pydist"), checkout / "pydist",
                    ignore=shutil.ignore_patterns("_C_*", "_build_config.py", "__pycache__"))
    shutil.copy(os.path.join(doc_examples.ROOT, "setup.py"), checkout)
    (checkout / "csrc").mkdir()
    code = "import runpy, sys; runpy.run_path('docs/conf.py'); print(sys.modules['pydist'].__file__)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=checkout, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == os.path.join(doc_examples.ROOT, "pydist", "__init__.py"), proc.stdout


def test_the_pages_have_examples():
    assert len(EXAMPLES) >= 10, [e.name for e in EXAMPLES]


def within(example):
    """What the page's `% numbers within` comment allows, for a failure's message."""
    if example.tolerance is None:
        return ""
    value, relative = example.tolerance
    return f" (numbers within {value * 100:g}%)" if relative else f" (numbers within {value:g})"


SLURM = os.path.join(doc_examples.ROOT, "scripts", "slurm.sh")


@pytest.fixture(scope="session")
def slurm_conf():
    """A real single-node Slurm for the examples that run under srun, salloc or sbatch (scripts/slurm.sh;
    scripts/setup.sh --test installs Slurm), up for the session."""
    proc = subprocess.run([SLURM, "up"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"scripts/slurm.sh up failed:\n{proc.stdout}{proc.stderr}"
    try:
        yield os.path.join(proc.stdout.strip().splitlines()[-1], "slurm.conf")
    finally:
        subprocess.run([SLURM, "down"], capture_output=True, text=True, timeout=120)


def run_under_slurm(example, tmp_path, conf):
    """The example's Slurm command line as the page shows it, `python` being this interpreter (first on
    PATH; srun passes the environment on). A batch script's output is the file it names."""
    env = dict(example_env(), SLURM_CONF=conf)
    for var in [k for k in env if k.startswith(("SLURM_", "PMI_", "PMIX_"))]:
        if var != "SLURM_CONF":
            del env[var]
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(shlex.split(example.slurm), cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT + 30)
    output = re.search(r"^#SBATCH\s+--output=(\S+)", example.code, re.M)
    if example.slurm.startswith("sbatch"):
        assert output, f"{example.name}: a batch script on a page names its output (#SBATCH --output=...)"
        path = tmp_path / output.group(1)
        proc.stdout = path.read_text() if path.exists() else ""
    return proc


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_example(example, tmp_path, request):
    script = tmp_path / example.script
    script.write_text(example.code)
    if example.slurm:
        proc = run_under_slurm(example, tmp_path, request.getfixturevalue("slurm_conf"))
    else:
        proc = subprocess.run([MPIEXEC, "-n", str(example.ranks), sys.executable, str(script)], cwd=tmp_path,
                              env=example_env(), capture_output=True, text=True, timeout=TIMEOUT + 30)
    if example.fails:   # a failure shown on purpose: its lines are among what it printed anywhere
        printed = [line for line in (proc.stdout + proc.stderr).split("\n") if line.strip()]
        assert proc.returncode != 0, f"{example.name} was shown failing, but exited 0:\n{proc.stdout}"
        assert example.expected and doc_examples.contains(example.expected, printed, example.tolerance), (
            f"{example.name}: the page shows{within(example)}\n" + "\n".join(example.expected or []) +
            "\nbut it printed\n" + "\n".join(printed))
        return
    assert proc.returncode == 0, f"{example.name} exited with {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    if example.expected is not None:
        got = [line for line in proc.stdout.split("\n") if line.strip()]
        assert doc_examples.matches(example.expected, got, example.tolerance), (
            f"{example.name}: the page shows{within(example)}\n" + "\n".join(example.expected) +
            "\nbut the example printed\n" + "\n".join(got))


@pytest.mark.parametrize("ranks", doc_examples.docstring_rank_counts())
def test_docstring_examples(ranks, tmp_path):
    """The API reference's examples (docstrings marked ``Example (``mpiexec -n N``)::``) as doctests
    on every rank of an N-rank job; each rank writes how many it ran and which failed."""
    runner = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run_docstrings.py")
    proc = subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable, runner, str(ranks), str(tmp_path)],
                          env=example_env(), capture_output=True, text=True, timeout=TIMEOUT + 30)
    reports = sorted(tmp_path.glob("rank*.txt"))
    assert proc.returncode == 0 and len(reports) == ranks, f"{proc.stdout}\n{proc.stderr}"
    for r in reports:
        ran, failed = r.read_text().split("\n", 1)
        assert int(ran) > 0 and not failed.strip(), f"{r.name}: {failed}"


def test_shell_blocks_run_as_written_and_a_block_not_meant_to_run_says_so(tmp_path):
    """tests/docs/shell_blocks.py, which runs the README's and the install guide's shell blocks in make test
    (the blocks and pip stages): a failing block fails it, a traceback fails it, a block that says it is not
    run as is is skipped, the same block twice runs once, and make's blocks wait for --make."""
    import shell_blocks
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n```bash\necho one > ~/mark && cd ~ && cat mark\n```\n\n"
                    "```python\nraise SystemExit(1)\n```\n\n"
                    "```\n# not run as is: DIR is yours\nls DIR\n```\n\n"
                    "```bash\necho one > ~/mark && cd ~ && cat mark\n```\n\n"
                    "```\nmake train\n```\n\n"
                    "```{cli-help} pydist.run\n```\n")
    found = shell_blocks.blocks(str(page))
    echo = "echo one > ~/mark && cd ~ && cat mark"
    assert [b.text.splitlines()[0] for b in found] == [echo, "# not run as is: DIR is yours", echo, "make train"]
    assert [b.is_make() for b in found] == [False, False, False, True]
    work = tmp_path / "work"
    proc = subprocess.run([sys.executable, shell_blocks.__file__, "--work", str(work), str(page)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("\none\n") == 1 and "shell blocks: 1 run, 0 failed" in proc.stdout, proc.stdout
    assert "skipped (it says: DIR is yours)" in proc.stdout and "the same block as above: run once" in proc.stdout
    assert "run with --make" in proc.stdout and (work / "home" / "mark").exists(), proc.stdout
    for body, why in (("false", "exit status 1"),
                      ("python -c 'import nosuchmodule' || true", "a traceback in its output")):
        page.write_text(f"```bash\n{body}\n```\n")
        proc = subprocess.run([sys.executable, shell_blocks.__file__, "--work", str(work), str(page)],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1 and f"page.md:1: {why}" in proc.stdout, proc.stdout + proc.stderr


PROBE = """<html><body><pre id="out">pending</pre>
<iframe id="page" style="width:%(width)dpx;height:900px;border:0"></iframe>
<script>
var pages = %(pages)s, i = 0, found = [], pictures = [], phone = %(width)d < 600;
var frame = document.getElementById("page");
frame.onload = function () {   // each page in turn: the code blocks wider than what shows of them
  frame.contentWindow.document.querySelectorAll("pre").forEach(function (pre) {
    // a diagram keeps its lines (it cannot wrap): it must fit a laptop's column, and scrolls on a phone
    if (pre.scrollWidth > pre.clientWidth + 1 && !(phone && pre.closest(".diagram"))) {
      found.push(pages[i].split("/html/")[1] + ": " + pre.textContent.split("\\n")[0].slice(0, 70) + " (" +
                 pre.scrollWidth + " px in " + pre.clientWidth + ")");
    }
  });
  frame.contentWindow.document.querySelectorAll("img").forEach(function (img) {   // how wide each picture shows
    pictures.push("picture " + pages[i].split("/html/")[1] + " " + img.src + " " + img.naturalWidth + " " +
                  img.getBoundingClientRect().width);
  });
  i += 1;
  if (i < pages.length) { frame.src = pages[i]; }
  else { document.getElementById("out").textContent = ["checked " + pages.length].concat(found, pictures).join("\\n"); }
};
frame.src = pages[0];
</script></body></html>"""


@pytest.mark.parametrize("width", [1280, 390])   # a laptop's window, a phone's
def test_code_blocks_and_pictures_fit_the_column_in_a_real_browser(width, tmp_path):
    """Every page of the built site in headless Chromium: no code block hides the end of a line behind a
    scroll bar (a cut-off command reads as another one); a diagram, which cannot wrap, fits a laptop's
    column; in a laptop's window every picture's smallest text (recorded by pydist._figures when it
    was drawn) shows at least figures.MIN_PAGE_PX px at the width the page gives it, and none was cut
    off or drawn over other text (a phone's reader zooms). scripts/docs_screenshots.sh shows the pages."""
    html = os.path.join(doc_examples.DOCS, "_build", "html")
    if not os.path.exists(os.path.join(html, "index.html")):
        test_the_site_builds_with_warnings_as_errors()
    chromium = shutil.which("chromium")
    assert chromium, "headless Chromium is missing (Debian's chromium package; scripts/setup.sh --test installs it)"
    pages = sorted(os.path.join(root, name) for root, _, names in os.walk(html) for name in names
                   if name.endswith(".html") and name not in ("genindex.html", "search.html")
                   and not os.path.relpath(root, html).startswith("_"))   # (_static, _sources: not pages)
    assert len(pages) >= 20, pages
    probe = tmp_path / "probe.html"
    probe.write_text(PROBE % {"width": width, "pages": repr(["file://" + p for p in pages])})
    proc = subprocess.run([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
                           f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=120000",
                           "--window-size=1400,1000", "--dump-dom", probe.as_uri()],
                          capture_output=True, text=True, timeout=300)
    out = re.search(r'<pre id="out">(.*?)</pre>', proc.stdout, re.S)
    assert out and out.group(1).startswith(f"checked {len(pages)}"), proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = out.group(1).splitlines()[1:]
    wide = [line for line in lines if not line.startswith("picture ")]
    assert not wide, f"code blocks wider than the column at {width} px:\n" + "\n".join(wide)
    # the pages' own pictures (Sphinx copies them to _images/; its theme's icons are not ours)
    pictures = [line.split()[1:] for line in lines if line.startswith("picture ") and "/_images/" in line]
    assert len(pictures) >= 9, lines   # the guides' figures
    if width < 600:
        return
    small = []
    for page, url, natural, shown in pictures:
        path = urllib.parse.unquote(urllib.parse.urlparse(url).path)
        if int(natural) == 0:
            small.append(f"{page}: {url} did not load")
            continue
        recorded = figures.page_px(path, column_px=float(shown))
        if recorded is None or recorded < figures.MIN_PAGE_PX:
            small.append(f"{page}: {os.path.basename(path)} shown {float(shown):.0f} px wide: smallest text "
                         + ("not recorded (not drawn by pydist._figures)" if recorded is None else f"{recorded:.1f} px"))
        small += [f"{page}: {os.path.basename(path)}: {problem}" for problem in figures.recorded_problems(path) or []]
    assert not small, f"pictures a reader cannot read at {width} px:\n" + "\n".join(small)
