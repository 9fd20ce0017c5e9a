# Every target installs what it needs first (scripts/setup.sh is idempotent), so on a fresh machine
# `make train` or `make test` is the only command to type.
.PHONY: setup setup-test train test bench clean

setup:
	scripts/setup.sh

setup-test:
	scripts/setup.sh --test

# The main job: for now the all-reduce of PyTorch's tutorial on 3 ranks of this machine.
train: setup
	mpiexec.mpich -n 3 .venv/bin/python examples/ptdist_allreduce.py

# The whole test suite: unit tests, multi-rank tests at 1-4 ranks, and an AddressSanitizer run.
test: setup-test
	scripts/test.sh

# pydist beside raw MPI in C and mpi4py: five collectives, 4 B .. 64 MiB, at 2 and 4 ranks.
bench: setup-test
	.venv/bin/python benchmarks/collectives_sweep.py

clean:
	rm -rf build pydist/*.so .venv
