# Every target installs what it needs first (scripts/setup.sh is idempotent), so on a fresh machine
# `make train` or `make test` is the only command to type.
.PHONY: setup setup-test train check test torch-suite bench docs wheel clean

setup:
	scripts/setup.sh

setup-test:
	scripts/setup.sh --test

# The main job: LeNet-5 on Fashion-MNIST, data parallel over 2 ranks, 5 epochs (about half a minute
# of training on 2 AVX2 cores); metrics.jsonl and curves.png land in results/.
train: setup
	mkdir -p results
	cd results && UCX_ERROR_SIGNALS= mpiexec.mpich -n 2 ../.venv/bin/python -m pydist.train --model lenet5 \
	  --epochs 5 --checkpoint lenet5.ckpt --overwrite

# While editing: a core of every kind of test in about two minutes (scripts/check.sh says which).
check:
	[ -x .venv/bin/python ] || scripts/setup.sh --test   # set up once; the lane itself installs nothing
	scripts/check.sh

# The whole test suite: unit tests, multi-rank tests at 1-4 ranks, and an AddressSanitizer run.
test: setup-test
	scripts/test.sh

# torch's own distributed test suite over pydist's backend and over gloo, at 2 and 3 ranks: every test,
# a table of outcomes and the differences (make test runs a bounded subset of it).
torch-suite: setup-test
	.venv/bin/python tests/torch_suite/run.py

# The documentation site, docs/_build/html (open index.html): needs only the package and Sphinx
# (pyproject.toml's docs extra).
docs:
	scripts/setup.sh --docs
	.venv/bin/python -m sphinx -W --keep-going -b html docs docs/_build/html

# pydist beside raw MPI in C and mpi4py: five collectives, 4 B .. 64 MiB, at 2 and 4 ranks.
bench: setup-test
	.venv/bin/python benchmarks/collectives_sweep.py

# Release wheels in dist/: one per supported CPython (3.11-3.14), manylinux_2_28 (glibc 2.28: RHEL/Rocky 8
# and newer), MPICH 5 and OpenBLAS from PyPI as dependencies; each installed and run at 2 ranks.
wheel: setup-test
	scripts/build_wheels.sh

clean:
	rm -rf build pydist/*.so .venv docs/_build
