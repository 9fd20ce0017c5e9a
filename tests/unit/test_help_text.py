"""Every command line's --help speaks to its users: each document it names exists (a page of docs/, a
heading of the README), and it carries none of the project's working notes (issue numbers, commit hashes,
dates of work)."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMANDS = ["pydist", "pydist.train", "pydist.run", "pydist.tune", "pydist.timeline", "pydist.profile",
            "pydist.trace_report"]


def test_every_command_line_is_listed():
    """A new CLI (a module of pydist/ runnable with -m) gets its --help checked here too."""
    folder = os.path.join(ROOT, "pydist")
    found = sorted("pydist" if f == "__main__.py" else f"pydist.{f[:-3]}" for f in os.listdir(folder)
                   if f.endswith(".py") and "__main__" in open(os.path.join(folder, f)).read())
    assert found == sorted(COMMANDS)


@pytest.mark.parametrize("module", COMMANDS)
def test_help_names_only_what_exists_and_no_working_notes(module):
    proc = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())   # argparse wraps lines: join them
    for page in re.findall(r"docs/[\w/.-]+\.md", text):
        assert os.path.isfile(os.path.join(ROOT, page)), f"{module} --help names {page}, which does not exist"
    headings = re.findall(r"^#+ (.+)$", open(os.path.join(ROOT, "README.md")).read(), re.M)
    for section in re.findall(r'README(?:\'s)? "([^"]+)"', text):
        assert section in headings, f"{module} --help names the README's {section!r}, which has no such heading"
    # an issue's number, a commit's hash (hex with a letter and a digit), a date
    notes = re.findall(r"\b[Ii]ssue ?\d+|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b|\b20\d\d-\d\d-\d\d\b",
                       text)
    assert not notes, f"{module} --help carries working notes: {notes}"


def user_texts():
    """What users read: the README, the docs site's pages, the package, the benchmarks and examples."""
    for folder, exts in (("docs", (".md", ".py")), ("pydist", (".py",)), ("benchmarks", (".py", ".c")),
                         ("examples", (".py", ".md"))):
        for top, dirs, files in os.walk(os.path.join(ROOT, folder)):
            dirs[:] = [d for d in dirs if not d.startswith(("_build", ".", "__"))]
            yield from (os.path.join(top, f) for f in files if f.endswith(exts))
    yield os.path.join(ROOT, "README.md")


def test_no_working_notes_in_what_users_read():
    """No issue numbers or dates of work in the docs, the package, the benchmarks' output or the
    examples (the history lives in git)."""
    found = []
    for path in user_texts():
        for n, line in enumerate(open(path, encoding="utf-8"), 1):
            if re.search(r"\b[Ii]ssue ?\d+\b|\bissue\d+_|\b20\d\d-[01]\d-[0-3]\d\b", line):
                found.append(f"{os.path.relpath(path, ROOT)}:{n}: {line.strip()[:100]}")
    assert not found, "\n".join(found)
