"""Sphinx extension of pydist's docs: what keeps the site from rotting.

- ``{cli-help} pydist.train``: the output of ``python -m pydist.train --help``, run at build time, so the
  command-line reference is always the parser's own text.
- After reading, every public name (``__all__`` of pydist, pydist.engine and pydist.torch) must be
  documented in the API reference; a missing one is a warning, which ``-W`` makes an error.
"""
import importlib
import os
import subprocess
import sys

from docutils import nodes
from docutils.parsers.rst import Directive
from sphinx.util import logging

logger = logging.getLogger(__name__)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PUBLIC_MODULES = ("pydist", "pydist.engine", "pydist.torch")


class CliHelp(Directive):
    """The --help text of ``python -m <module> [subcommand]``."""
    required_arguments = 1
    optional_arguments = 1

    def run(self):
        # the pydist this build documents (conf.py's choice: the checkout's if built, else the installed
        # one), and not the current folder's (-P)
        import pydist
        where = os.path.dirname(os.path.dirname(os.path.abspath(pydist.__file__)))
        argv = [sys.executable, "-P", "-m", *self.arguments, "--help"]
        env = dict(os.environ, PYTHONPATH=where + os.pathsep + os.environ.get("PYTHONPATH", ""), COLUMNS="100")
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
        except subprocess.TimeoutExpired:
            raise self.error(f"cli-help: {' '.join(argv)} did not finish in 120 s")
        if proc.returncode != 0:
            raise self.error(f"cli-help: {' '.join(argv)} exited with {proc.returncode}:\n{proc.stderr}")
        block = nodes.literal_block(proc.stdout, proc.stdout)
        block["language"] = "text"
        return [block]


def public_names():
    names = []
    for mod in PUBLIC_MODULES:
        m = importlib.import_module(mod)
        names += [f"{mod}.{n}" for n in m.__all__]
    return names


def check_public_names(app, env):
    documented = set(env.get_domain("py").objects)
    for name in public_names():
        if name not in documented:
            logger.warning(f"the API reference does not document the public name {name} (docs/reference/)")


def setup(app):
    app.add_directive("cli-help", CliHelp)
    app.connect("env-check-consistency", check_public_names)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
