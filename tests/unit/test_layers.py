"""The house's layers, read from the code (issue 42): every file of csrc/ sits in a layer folder and includes
only its own layer and the ones below (csrc/README.md), no two files of csrc/ or modules of pydist/ reach
each other in a circle, and the checkers themselves catch an upward include and a circle."""
import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# csrc/'s layers, top (may call everything below) to bottom: csrc/README.md says what lives in each
LAYERS = {"api": 9, "session": 8, "strategies": 7, "ops": 6, "paths": 5, "progress": 4, "engine": 3, "compress": 3,
          "observe": 2, "groups": 1, "core": 0}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def cycles(edges):
    """Every circle of the graph {node: {node, ...}}, each as a list of its nodes (Tarjan's components of
    more than one node, or a node that reaches itself)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def c_layers(csrc):
    """(problems, file graph) of a csrc/ tree: a file outside the layer folders, an include that does not
    resolve or that points to a higher layer; the graph's arrows go from a file to the file an include names
    (a header is one with the .c of its name in its folder)."""
    files = sorted(os.path.relpath(os.path.join(d, f), csrc) for d, _, fs in os.walk(csrc) for f in fs
                   if f.endswith((".c", ".h")))
    problems, edges = [], {}

    def layer(path):
        return LAYERS.get(path.split(os.sep)[0])

    def unit(path):
        c = path[:-2] + ".c"
        return c if path.endswith(".h") and os.path.exists(os.path.join(csrc, c)) else path
    for f in files:
        if layer(f) is None:
            problems.append(f"{f}: not in a layer folder ({', '.join(sorted(LAYERS))})")
            continue
        with open(os.path.join(csrc, f), encoding="utf-8") as fh:
            text = fh.read()
        for name in INCLUDE.findall(text):
            here = os.path.normpath(os.path.join(os.path.dirname(f), name))
            target = here if os.path.exists(os.path.join(csrc, here)) else os.path.normpath(name)
            if not os.path.exists(os.path.join(csrc, target)):
                problems.append(f'{f}: #include "{name}" is not a file of csrc/')
                continue
            if layer(target) is None or layer(target) > layer(f):
                problems.append(f'{f} (layer {f.split(os.sep)[0]}/) includes "{name}", a file of the higher layer '
                                f'{target.split(os.sep)[0]}/')
            if unit(target) != unit(f):
                edges.setdefault(unit(f), set()).add(unit(target))
    return problems, edges


def python_imports(package_dir, package):
    """{module: {module it imports, ...}} of a package's modules, imports anywhere in a module (a function's
    too); `from . import x` reaches x when x is a module (or the C extension _C), else the package."""
    modules = {package + "._C"}
    paths = {}
    for d, _, fs in os.walk(package_dir):
        for f in fs:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, f), os.path.dirname(package_dir))[:-3].replace(os.sep, ".")
                name = rel[:-len(".__init__")] if rel.endswith(".__init__") else rel
                modules.add(name)
                paths[name] = os.path.join(d, f)
    edges = {}
    for name, path in sorted(paths.items()):
        here = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
        with open(path, encoding="utf-8") as fh:
            tree = ast.parse(fh.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = here.split(".")[:len(here.split(".")) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules] or [base]
            else:
                continue
            for t in targets:
                while t and t not in modules:
                    t = t.rsplit(".", 1)[0] if "." in t else ""
                if t and t != name:
                    edges.setdefault(name, set()).add(t)
    return edges


# ---------------------------------------------------------------------------------------------------
# The real tree

def test_every_csrc_file_is_in_a_layer_and_includes_only_its_own_and_lower_ones():
    problems, _ = c_layers(os.path.join(ROOT, "csrc"))
    assert not problems, "\n".join(problems)


def test_no_circle_among_csrc_files():
    _, edges = c_layers(os.path.join(ROOT, "csrc"))
    assert sum(len(v) for v in edges.values()) > 100   # the includes were read
    found = cycles(edges)
    assert not found, "circles in csrc/: " + "; ".join(" <-> ".join(c) for c in found)


def test_no_circle_among_pydist_modules():
    edges = python_imports(os.path.join(ROOT, "pydist"), "pydist")
    assert "pydist.distributed" in edges.get("pydist.engine", ())   # the imports were read
    found = cycles(edges)
    assert not found, "circles in pydist/: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_layer_table_is_the_readmes():
    with open(os.path.join(ROOT, "csrc", "README.md"), encoding="utf-8") as fh:
        text = fh.read()
    listed = re.findall(r"^\| `(\w+)/`(?:, `(\w+)/`)? \|", text, re.M)
    order = [name for row in listed for name in row if name]
    assert set(order) == set(LAYERS), order
    ranks = [LAYERS[name] for name in order]
    assert ranks == sorted(ranks, reverse=True), f"csrc/README.md lists the layers in another order: {order}"


# ---------------------------------------------------------------------------------------------------
# The checkers

def write(root, files):
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as fh:
            fh.write(text)


def test_the_c_checker_passes_a_clean_tree_and_catches_an_upward_include(tmp_path):
    write(tmp_path, {"core/errors.h": "", "core/errors.c": '#include "errors.h"\n',
                     "ops/p2p.c": '#include "core/errors.h"\n'})
    problems, edges = c_layers(str(tmp_path))
    assert problems == [] and edges == {"ops/p2p.c": {"core/errors.c"}}
    write(tmp_path, {"core/errors.c": '#include "errors.h"\n#include "ops/p2p.h"\n', "ops/p2p.h": ""})
    problems, _ = c_layers(str(tmp_path))
    assert len(problems) == 1 and "core/errors.c (layer core/) includes \"ops/p2p.h\"" in problems[0], problems


def test_the_c_checker_catches_a_circle_within_a_layer_a_stray_file_and_a_missing_include(tmp_path):
    write(tmp_path, {"groups/a.c": '#include "b.h"\n', "groups/a.h": "", "groups/b.c": '#include "a.h"\n',
                     "groups/b.h": "", "loose.c": "", "core/x.c": '#include "core/nothing.h"\n'})
    problems, edges = c_layers(str(tmp_path))
    assert any(p.startswith("loose.c: not in a layer folder") for p in problems), problems
    assert any('core/x.c: #include "core/nothing.h" is not a file' in p for p in problems), problems
    assert cycles(edges) == [["groups/a.c", "groups/b.c"]]


def test_the_python_checker_catches_a_circle_through_a_function_level_import(tmp_path):
    write(tmp_path, {"pkg/__init__.py": "from .a import f\n", "pkg/a.py": "from . import _C\ndef f():\n    from .b import g\n",
                     "pkg/b.py": "import pkg.c\n", "pkg/c.py": "def h():\n    from . import a\n"})
    edges = python_imports(str(tmp_path / "pkg"), "pkg")
    assert edges["pkg.a"] == {"pkg._C", "pkg.b"} and edges["pkg.b"] == {"pkg.c"}
    assert cycles(edges) == [["pkg.a", "pkg.b", "pkg.c"]]
    write(tmp_path, {"pkg/c.py": "def h():\n    pass\n"})
    assert cycles(python_imports(str(tmp_path / "pkg"), "pkg")) == []


@pytest.mark.parametrize("graph, want", [({"a": {"a"}}, [["a"]]), ({"a": {"b"}, "b": set()}, [])])
def test_cycles_counts_a_self_loop_and_nothing_else(graph, want):
    assert cycles(graph) == want
