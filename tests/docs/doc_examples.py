"""The runnable examples of the documentation site (docs/), found where a reader sees them.

A multi-rank example is a fenced ``python`` block (or a ``{literalinclude}`` of a file) whose first line
is ``# run: mpiexec -n N ...``. What it prints is the ``text`` block that follows it (before any other
``python`` block), if there is one: every rank's lines, in any order (they interleave), compared as a
sorted list; ``...`` in an expected line stands for any text. An example whose marker ends with
``(exits non-zero)`` shows a failure: it must exit non-zero, and each line shown must be among the
lines it printed (stdout and stderr, where a traceback goes). Single-process examples are ``>>>``
sessions, which pytest's doctest runs (``--doctest-glob='*.md'``, docs/conftest.py).

A number the CPU decides (a training run's loss: float sums round differently with the vector width,
FMA and BLAS kernels, and training grows the difference; a buffer padded to whole vectors) is allowed
for by a MyST comment, which readers do not see, on the line just above the output block:
``% numbers within 0.03`` (or ``5%``, of the number shown) lets each number printed differ that much.
The rest of the line must match as before, and a tolerance below 1 keeps integers (ranks, steps) exact.

An example run under Slurm (docs/guides/cluster.md) says so on its first line instead:
``# run: srun --mpi=pmi2 -n 2 python hello.py`` (or ``salloc ...``), and a batch script, a ``bash``
block, names itself among its opening comments: ``# run: sbatch --wait job.sh``; what it prints is
read from the file its ``#SBATCH --output=`` names. tests/docs/test_docs.py runs these on a real
single-node Slurm (scripts/slurm.sh), with ``python`` the interpreter under test.

Docstring examples marked ``Example (``mpiexec -n N``)::`` run as doctests on every rank of an N-rank
job (tests/docs/run_docstrings.py).
"""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(ROOT, "docs")
RUN = re.compile(r"^#\s*run:\s*mpiexec\s+-n\s+(\d+)\b.*?(\(exits non-zero\))?\s*$")
SLURM_RUN = re.compile(r"^#\s*run:\s*((?:srun|salloc|sbatch)\b.*?)\s*(\(exits non-zero\))?\s*$")
FENCE = re.compile(r"^(`{3,}|:{3,})\s*(\{[\w-]+\})?\s*([^\s`]*)\s*(.*)$")


TOLERANCE = re.compile(r"^%\s*numbers within\s+(\d+(?:\.\d+)?)\s*(%?)")
NUMBER = re.compile(r"\d+(?:\.\d+)?")
NUMBER_GROUP = r"(?<!\d)(\d+(?:\.\d+)?)(?!\d)"


class Example:
    def __init__(self, page, line, ranks, code, expected, fails=False, tolerance=None):
        self.page, self.line, self.ranks, self.code, self.expected = page, line, ranks, code, expected
        self.fails = fails
        self.tolerance = tolerance   # None (exact), or (value, relative) from a `% numbers within` comment
        self.slurm = None            # the Slurm command line (srun, salloc, sbatch) it runs under, if any

    @property
    def name(self):
        return f"{os.path.relpath(self.page, DOCS if self.page.startswith(DOCS) else ROOT)}:{self.line}"


def pages():
    yield os.path.join(ROOT, "README.md")   # its example is the first a reader runs
    for top, dirs, files in os.walk(DOCS):
        dirs[:] = [d for d in dirs if not d.startswith(("_", "."))]
        for f in sorted(files):
            if f.endswith(".md"):
                yield os.path.join(top, f)


def blocks(path):
    """(line, kind, argument, body) of each fenced block: kind is the language, or the directive's
    name without braces ('literalinclude'), with its argument."""
    with open(path) as f:
        lines = f.read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, directive, word, rest = m.group(1), m.group(2), m.group(3), m.group(4)
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].startswith(fence):
            body.append(lines[i])
            i += 1
        i += 1
        if directive:
            kind, arg = directive.strip("{}"), (word + " " + rest).strip()
        else:
            kind, arg = word, rest
        out.append((start, kind, arg, body))
    return out


def tolerance_above(lines, fence_line):
    """(value, relative) from a ``% numbers within 0.03`` (or ``5%``) comment just above the block
    whose fence is on line `fence_line` (1-based), else None."""
    m = TOLERANCE.match(lines[fence_line - 2]) if fence_line >= 2 else None
    return (float(m.group(1)) / (100 if m.group(2) else 1), bool(m.group(2))) if m else None


def examples():
    found = []
    for page in pages():
        bs = blocks(page)
        with open(page) as f:
            page_lines = f.read().split("\n")
        for k, (line, kind, arg, body) in enumerate(bs):
            if kind == "literalinclude":
                with open(os.path.normpath(os.path.join(os.path.dirname(page), arg.split()[0]))) as f:
                    code = f.read()
            elif kind in ("python", "bash"):
                code = "\n".join(b for b in body if not b.startswith(":"))   # directive options
            else:
                continue
            if kind == "bash":   # a batch script: its marker among its opening comments
                lines = code.split("\n")
                opening = lines[:next((i for i, c in enumerate(lines) if not c.startswith("#")), len(lines))]
                first = next((c for c in opening if SLURM_RUN.match(c)), "")
            else:
                first = next((c for c in code.split("\n") if c.strip()), "")
            m, slurm = RUN.match(first), SLURM_RUN.match(first)
            if not m and not slurm:
                continue
            expected, tolerance = None, None
            for line2, kind2, _, body2 in bs[k + 1:]:
                if kind2 in ("python", "literalinclude"):
                    break
                if kind2 == "text":
                    expected = [b for b in body2 if b.strip() and not b.startswith(":")]
                    tolerance = tolerance_above(page_lines, line2)
                    break
            ex = Example(page, line, int(m.group(1)) if m else 0, code, expected,
                         fails=(m or slurm).group(2) is not None, tolerance=tolerance)
            named = re.findall(r"\b(\w+\.(?:py|sh))\b", first)
            ex.script = named[-1] if named else "example.py"   # the name the page runs it under
            if slurm:
                ex.slurm = slurm.group(1)
            found.append(ex)
    return found


def line_regex(expected_line, numbers=False):
    """The regex of an expected line: '...' any text; with `numbers`, each number a group."""
    def part(text):
        return NUMBER_GROUP.join(re.escape(t) for t in NUMBER.split(text)) if numbers else re.escape(text)
    return ".*".join(part(p) for p in expected_line.rstrip().split("..."))


def deviation(expected_line, got_line, tolerance=None):
    """None if `got_line` does not match `expected_line`; else how far its numbers are from the ones
    shown, as a fraction of the tolerance (0 for an exact match; above 1 is no match)."""
    m = re.fullmatch(line_regex(expected_line, tolerance is not None), got_line.rstrip())
    if m is None:
        return None
    if tolerance is None:
        return 0.0
    value, relative = tolerance
    shown = [float(n) for p in expected_line.rstrip().split("...") for n in NUMBER.findall(p)]
    worst = max([abs(float(g) - s) / max(value * (s if relative else 1), 1e-300)
                 for s, g in zip(shown, m.groups()) if float(g) != s], default=0.0)
    return worst if worst <= 1 + 1e-9 else None


def contains(expected, got, tolerance=None):
    """Whether every line of `expected` ('...' matching any text) is among the lines `got`."""
    return all(any(deviation(e, g, tolerance) is not None for g in got) for e in expected)


def matches(expected, got, tolerance=None):
    """Whether the lines `got` are the lines `expected` in some order, '...' in an expected line
    matching any text (and its numbers within `tolerance`). Exact lines are matched first, so a
    wildcard never takes an exact line's match; a line with numbers takes the closest."""
    if len(expected) != len(got):
        return False
    left = [g.rstrip() for g in got]
    inexact = (lambda e: "..." in e or (tolerance is not None and NUMBER.search(e) is not None))
    for e in sorted(expected, key=inexact):
        hits = [(d, g) for g in left for d in [deviation(e, g, tolerance)] if d is not None]
        if not hits:
            return False
        left.remove(min(hits, key=lambda h: h[0])[1])
    return True


DOCSTRING_RUN = re.compile(r"Example \(``mpiexec -n (\d+)``")
PUBLIC_MODULES = ("pydist", "pydist.engine")


def docstring_examples():
    """(ranks, qualified name, object) of every public object whose docstring has a marked example."""
    import importlib
    found = []
    for mod in PUBLIC_MODULES:
        m = importlib.import_module(mod)
        for name in m.__all__:
            obj = getattr(m, name)
            doc = getattr(obj, "__doc__", None) or ""
            hit = DOCSTRING_RUN.search(doc) if callable(obj) else None
            if hit:
                found.append((int(hit.group(1)), f"{mod}.{name}", obj))
    return found


def docstring_rank_counts():
    return sorted({n for n, _, _ in docstring_examples()})
