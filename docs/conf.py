"""Sphinx configuration of pydist's documentation site: `make docs` builds docs/_build/html.

Markdown pages (MyST) for the prose, autodoc with napoleon for the API reference from the docstrings,
the furo theme. `make test` builds it with warnings as errors (tests/docs), so a broken reference, a
public name the reference leaves out (_ext/pydist_docs.py) or a docstring that does not parse fails.
"""
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKOUT = os.path.dirname(HERE)
if glob.glob(os.path.join(CHECKOUT, "pydist", "_C_*.so")):
    sys.path.insert(0, CHECKOUT)                 # the checkout's pydist, built in place (make setup)
else:   # an unbuilt checkout: the installed pydist (pip install .[docs]), not the source folder's
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != CHECKOUT]
sys.path.insert(0, os.path.join(HERE, "_ext"))

import pydist  # noqa: E402

project = "pydist"
author = "the pydist developers"
copyright = "2026, the pydist developers"
release = version = pydist.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "pydist_docs",
]
source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3          # [text](page.md#a-heading) links resolve, and are checked
suppress_warnings = []

# The API reference: members in source order, docstrings in Google/NumPy style (napoleon).
autodoc_member_order = "bysource"
autodoc_typehints = "none"        # the signatures say it; most functions take torch's argument names
napoleon_google_docstring = True
napoleon_numpy_docstring = True
# No network at build time: intersphinx only where a local inventory exists (none needed to build).
intersphinx_mapping = {}

nitpicky = True                   # every cross-reference must resolve
nitpick_ignore_regex = [
    (r"py:.*", r"(numpy\.)?ndarray|np\..*|numpy\..*|torch\..*|optional|callable|array-like|int|float|str|"
               r"bool|None|list|tuple|dict|bytes|object|Exception|ValueError|TypeError|RuntimeError|"
               r"KeyboardInterrupt|ResourceWarning|FutureWarning|enum\..*|threading\..*|os\..*|pathlib\..*"),
]

html_theme = "furo"
html_title = f"pydist {release}"
html_static_path = ["_static"]
html_css_files = ["wrap.css"]   # code blocks wrap at the column width
html_theme_options = {
    "source_repository": "",
    "navigation_with_keys": True,
}
pygments_style = "friendly"
