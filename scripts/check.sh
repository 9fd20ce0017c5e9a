#!/usr/bin/env bash
# make check: the edit-compile-test loop's lane, about two minutes on 2 cores. It builds (incrementally),
# then runs a core of each kind of test: the unit tests of the argument checks and errors, the layers, the
# engine's step and checkpoint, the trace reader and the launcher; the collectives, point-to-point calls and groups under
# mpiexec at 2 ranks on every path; and one batch of the conformance fuzzer (2 and 3 ranks, every path).
# `make test` (scripts/test.sh) is the whole suite, for before a change lands.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export PYDIST_REQUIRE_PEERS=${PYDIST_REQUIRE_PEERS:-1} UCX_ERROR_SIGNALS=
source scripts/compiler.sh
start=$(date +%s)
# (its own exit status: a build that fails stops the lane before any test runs the old extension)
$PY setup.py -q build_ext --inplace

$PY -P -m pytest -q -p no:cacheprovider -x tests/unit/test_layers.py tests/unit/test_api.py tests/unit/test_errors.py \
  tests/unit/test_ring_args.py tests/unit/test_shm_args.py tests/unit/test_trace_report.py tests/unit/test_run.py \
  tests/unit/test_engine.py -k "not torch and not slow"
$PY tests/run_mpi.py -n 2 -- tests/mpi/test_collectives.py tests/mpi/test_all_reduce.py tests/mpi/test_p2p.py \
  tests/mpi/test_groups.py tests/mpi/test_broadcast_barrier.py
$PY tests/conformance.py --programs 12 --ranks 2 3 --seed 42
echo "make check: passed in $(( $(date +%s) - start )) s (make test runs the whole suite)"
