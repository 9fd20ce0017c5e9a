"""The shell blocks of README.md and docs/guides/install.md, run as a reader types them (make test).

A fenced block whose info string is empty, bash, sh, shell or console is a shell block. Each runs once, in
page order (a block two pages show runs once), in `bash -e`, with what a reader has:
  - a fresh virtual environment active (its bin first on PATH), for the blocks that say `pip`/`python`;
  - HOME a fresh folder, so `~/pd` and `cd ~` start from nothing (pip's cache is still the machine's);
  - the working directory a clean copy of the checkout: the source folder the README starts in.
A block a reader adapts rather than runs starts with a comment that says so on the page,
`# not run as is: WHY`, and is skipped. Blocks of `make` commands run in the checkout itself, and only
with --make: `make train` and `make docs` reinstall the package there, so the suite runs them last, when
nothing else uses it; `make test` is the suite itself. A block fails on a non-zero status or a traceback.

    python tests/docs/shell_blocks.py --list README.md docs/guides/install.md
    python tests/docs/shell_blocks.py --work DIR README.md docs/guides/install.md   # all but make's
    python tests/docs/shell_blocks.py --make README.md                             # make's, in the checkout
    python tests/docs/shell_blocks.py --work DIR --match 'python -m venv ~/pd' README.md   # some
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHELL = {"", "bash", "sh", "shell", "console"}
NOT_RUN = "# not run as is:"
SUITE = {"make test": "the suite itself, which is running it"}
BLOCK_TIMEOUT_S = 1800   # a hang guard: the slowest block (a wheel built and repaired) takes minutes


class Block:
    def __init__(self, path, line, text):
        self.where, self.text = f"{os.path.relpath(path, ROOT)}:{line}", text.strip("\n")

    def commands(self):
        lines = [c.strip() for c in self.text.splitlines()]
        return [c.split(" #")[0].strip() for c in lines if c and not c.startswith("#")]

    def is_make(self):
        return all(c.startswith("make ") or c == "make" for c in self.commands())


def blocks(path):
    """The shell blocks of a Markdown page, each with its first line's number. Fences at the margin only."""
    lines = open(path, encoding="utf-8").read().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^(`{3,}|~{3,})(.*)$", lines[i])
        if not m:
            i += 1
            continue
        fence, info = m.group(1), m.group(2).strip()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(fence)), len(lines))
        if info in SHELL:
            out.append(Block(path, i + 1, "\n".join(lines[i + 1:end])))
        i = end + 1
    return out


def reader_env(work):
    """A reader's shell: a fresh venv active, a fresh HOME, the machine's pip cache."""
    venv, home = os.path.join(work, "venv"), os.path.join(work, "home")
    if not os.path.isdir(venv):
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    os.makedirs(home, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.setdefault("PIP_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "pip"))
    path = [p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(os.path.join(ROOT, ".venv"))]
    env.update(HOME=home, VIRTUAL_ENV=venv, PATH=os.pathsep.join([os.path.join(venv, "bin"), *path]),
               MPIEXEC_TIMEOUT=env.get("MPIEXEC_TIMEOUT", "600"), UCX_ERROR_SIGNALS="")
    return env


def run_block(block, cwd, env):
    print(f"-- {block.where}, in {cwd}:\n" + "".join(f"   $ {c}\n" for c in block.text.splitlines()), flush=True)
    proc = subprocess.Popen(["bash", "-e", "-c", block.text], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    seen = []
    try:
        for line in proc.stdout:
            sys.stdout.write(line)
            seen.append(line)
        rc = proc.wait(timeout=BLOCK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        return f"{block.where}: still running after {BLOCK_TIMEOUT_S} s"
    if rc != 0:
        return f"{block.where}: exit status {rc}"
    if any(line.startswith("Traceback (most recent call last)") for line in seen):
        return f"{block.where}: a traceback in its output"
    return None


def skip_reason(block, seen, args):
    """Why `block` is not run in this call (None: it is run)."""
    first = block.text.splitlines()[0] if block.text else ""
    if first.startswith(NOT_RUN):
        return f"skipped (it says: {first[len(NOT_RUN):].strip()})"
    if block.text in seen:
        return "the same block as above: run once"
    if block.text in SUITE:
        return f"skipped: {SUITE[block.text]}"
    if block.is_make():
        return None if args.make else "run with --make"
    return None if args.work else "run with --work"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tests/docs/shell_blocks.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("pages", nargs="+")
    ap.add_argument("--list", action="store_true", help="list the blocks and what would be done with each")
    ap.add_argument("--work", help="a folder for the reader's venv, HOME and source copy (all but make's)")
    ap.add_argument("--make", action="store_true", help="run the blocks of make commands, in the checkout")
    ap.add_argument("--match", help="only the blocks containing this text")
    args = ap.parse_args(argv)
    if not (args.list or args.make or args.work):
        ap.error("--list, --work DIR or --make")
    found = [b for page in args.pages for b in blocks(page) if args.match is None or args.match in b.text]
    if not found:
        ap.error("no shell block" + (f" containing {args.match!r}" if args.match else ""))
    env = src = None
    failures, ran, seen = [], 0, set()
    for b in found:
        why = skip_reason(b, seen, args)
        seen.add(b.text)
        if args.list or why is not None:
            print(f"-- {b.where}: {why or 'run'}" + ("" if why else ": " + "; ".join(b.commands())))
            continue
        if b.is_make():
            failure = run_block(b, ROOT, dict(os.environ))
        else:
            if env is None:
                env, src = reader_env(args.work), os.path.join(args.work, "src")
                os.makedirs(src, exist_ok=True)
                subprocess.run([os.path.join(ROOT, "scripts", "copy_checkout.sh"), src], check=True)
            failure = run_block(b, src, env)
        ran += 1
        if failure:
            failures.append(failure)
    if args.list:
        return 0
    print(f"shell blocks: {ran} run, {len(failures)} failed" + "".join(f"\n  {f}" for f in failures))
    return 1 if failures or ran == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
