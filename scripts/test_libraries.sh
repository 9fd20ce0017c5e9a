#!/usr/bin/env bash
# One pydist build on each MPI library of MPICH's ABI the machine can have (part of `make test`).
#
# .venv's pydist is built against Debian's MPICH 4.0.2 and linked to no MPI library: its MPI calls bind
# at import to the library pydist/_libraries.py loads. Here the same installed build runs on
#   PyPI's MPICH 5 (the `mpich` package)  and  Intel MPI from PyPI (`impi-rt`),
# each installed under a prefix of its own (.mpi-mpich5, .mpi-impi: bin/mpiexec, lib/libmpi.so.12), and
#   1. under each library's own mpiexec, with nothing set, a rank takes its launcher's library (its
#      parent is PREFIX/bin/hydra_pmi_proxy), and `python -m pydist --version` names it;
#   2. with PYDIST_LIBMPI=PREFIX/lib/libmpi.so.12, the core multi-rank tests pass at 2 ranks under that
#      library's mpiexec (tests/run_mpi.py takes the launcher that matches the library loaded).
# (The rest of make test runs on Debian's MPICH 4.0.2, the build's own.)
#
#   scripts/test_libraries.sh            both
#   scripts/test_libraries.sh --install  only install the libraries that are missing (setup.sh --test)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=.venv/bin/python
# impi-rt 2021.16.2: the newest whose own dependencies pip finds here (2021.17 and later need a
# `libfabric` package that this machine's PyPI mirror lacks).
declare -A PACKAGE=([mpich5]="mpich==5.0.2" [impi]="impi-rt==2021.16.2")
declare -A EXPECT=([mpich5]="MPICH Version: *5\\.0\\.2" [impi]="Intel\\(R\\) MPI Library 2021\\.16")

install() {
  local name=$1 prefix=.mpi-$1
  if [ ! -e "$prefix/lib/libmpi.so.12" ]; then
    echo "test_libraries: installing ${PACKAGE[$name]} under $prefix"
    rm -rf "$prefix"
    $PY -m pip install -q --disable-pip-version-check --no-deps --prefix "$prefix" "${PACKAGE[$name]}"
  fi
}

for name in mpich5 impi; do install "$name"; done
if [ "${1:-}" = "--install" ]; then exit 0; fi

source scripts/core_tests.sh   # CORE_MPI, NO_TORCH
for name in mpich5 impi; do
  prefix=$PWD/.mpi-$name
  echo "-- $name: the launcher's own library, nothing set ($prefix/bin/mpiexec -n 2 ... -m pydist --version)"
  out=$(env -u PYDIST_LIBMPI MPIEXEC_TIMEOUT=120 "$prefix/bin/mpiexec" -n 2 $PY -P -m pydist --version)
  echo "$out" | sed -n '3,4p'
  for line in "running on ${EXPECT[$name]}" "library $prefix/lib/libmpi.so.12, the launcher's own"; do
    [ "$(echo "$out" | grep -cE "$line")" = 2 ] || { echo "FAIL: not on both ranks: $line"; exit 1; }
  done
  echo "-- $name: the elastic launcher with that mpiexec (python -m pydist.run --mpiexec ...): each rank,"
  echo "   started by pydist.run's watcher rather than by hydra, takes the library its watcher took"
  work=$(mktemp -d)
  # one write of the whole line: print's pieces are separate writes when unbuffered (PYTHONUNBUFFERED),
  # and the two ranks' lines then interleave ("rankrank 1 on ...")
  printf '%s\n' "import sys, pydist as dist, pydist._libraries as libraries" "dist.init_process_group()" \
    "sys.stdout.write(f'rank {dist.get_rank()} on {libraries.LIBMPI[0]}\\n'); sys.stdout.flush()" \
    "dist.destroy_process_group()" > "$work/which.py"
  out=$(cd "$work" && env -u PYDIST_LIBMPI MPIEXEC_TIMEOUT=120 PYTHONPATH="$ROOT" "$ROOT/$PY" -m pydist.run -n 2 \
        --mpiexec "$prefix/bin/mpiexec" --run-dir "$work/run" -- which.py 2>&1)
  rm -rf "$work"
  [ "$(echo "$out" | grep -c "^rank [01] on $prefix/lib/libmpi.so.12$")" = 2 ] || { echo "FAIL:"; echo "$out"; exit 1; }
  echo "-- $name: core multi-rank tests at 2 ranks, PYDIST_LIBMPI=$prefix/lib/libmpi.so.12"
  PYDIST_LIBMPI=$prefix/lib/libmpi.so.12 $PY tests/run_mpi.py -n 2 -- "${CORE_MPI[@]}" -k "$NO_TORCH"
done
