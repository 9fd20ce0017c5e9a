"""One rank of tests/docs/test_docs.py::test_docstring_examples: under ``mpiexec -n N``, run as doctests
the API docstring examples marked for N ranks, with ``dist`` (initialized) and ``np`` in scope, and
write rank<r>.txt: the number run, then one line per failure."""
import doctest
import io
import os
import sys

import numpy as np

import pydist as dist
from doc_examples import docstring_examples

ranks, out_dir = int(sys.argv[1]), sys.argv[2]
dist.init_process_group(backend="mpi")
rank = dist.get_rank()
ran, failures = 0, []
for n, name, obj in docstring_examples():
    if n != ranks:
        continue
    for test in doctest.DocTestFinder(recurse=False).find(obj, name, globs={"dist": dist, "np": np}):
        report = io.StringIO()
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        result = runner.run(test, out=report.write)
        ran += result.attempted
        if result.failed:
            failures.append(f"{name}: {report.getvalue()!r}")
        dist.barrier()   # examples do not leak into each other's collectives
with open(os.path.join(out_dir, f"rank{rank}.txt"), "w") as f:
    f.write(f"{ran}\n" + "\n".join(failures))
dist.destroy_process_group()
