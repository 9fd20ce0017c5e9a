#!/usr/bin/env bash
# The whole test suite (what `make test` and CI run), after scripts/setup.sh --test. Its stages run in
# two lanes side by side: the tests of lane 1 wait for a quarter of their time on the jobs they start,
# and lane 2 fills that time. Alone, one after another, the stages took 32 min on 2 quiet cores (1919 s).
#   lane 1 (its output on the terminal as it runs):
#     unit     tests/unit, world size 1, plain pytest (argument errors, dtype x op matrix, leaks, jobs
#              under mpiexec: examples, a dying rank, the wrong launcher, the launcher's fault handling)
#     mpi      tests/mpi under real mpiexec at world sizes 1, 2, 3 and 4 (tests/run_mpi.py)
#     docs     the documentation site builds with warnings as errors; its examples run (tests/docs)
#     libraries  the same install on PyPI's MPICH 5, Intel MPI (impi-rt), MPICH 5's standard ABI, Open MPI 5.0
#              (PyPI) and 4.1 (Debian's, unpacked), each under its own mpiexec: the core multi-rank tests
#              (scripts/test_libraries.sh)
#   lane 2 (in the background; its output is printed when lane 1 is done):
#     unit2    the unit tests that compile (the build without warnings, the kernels at every level) or
#              run the benchmarks
#     pythons  the C API core tests on every other Python version pyproject.toml claims (3.12, 3.13)
#     py314    CPython 3.14 on Debian unstable with its MPICH 5, in a cached root (scripts/sid_root.sh):
#              the build, the C API core, and the core multi-rank tests at 2 and 3 ranks
#     pip      pip install with no system MPI (MPICH 5 and OpenBLAS from PyPI), the manylinux wheel, and
#              the core multi-rank tests on PyPI's MPICH 5 (the other stages run on Debian's MPICH 4)
#     asan     the core tests on an AddressSanitizer build of the extension (and its narrower levels)
#     levels   the kernels' tests again at each instruction-set level below the CPU's widest (PYDIST_SIMD)
#     blocks   the shell blocks of README.md and docs/guides/install.md, run as written (a fresh venv and
#              HOME, a clean copy of the checkout): tests/docs/shell_blocks.py
#     torch    torch's own distributed test suite over pydist's backend beside gloo, at 2 and 3 ranks: a
#              bounded subset (tests/torch_suite; make torch-suite runs every test)
#   then, after both lanes:
#     make     the README's make commands as written (make train, make docs), which reinstall the
#              package in this checkout: alone, when nothing else uses it
# Lane 2 compiles one file at a time (PYDIST_BUILD_JOBS=1): what it adds to lane 1's load is mostly
# "another process busy on one core", which every test allows for. A failing stage ends its lane, and
# the suite fails if either lane did. Each stage's time is printed as it ends and again at the end.
#   scripts/test.sh                 both lanes
#   scripts/test.sh unit asan ...   just these stages, one after another, in the foreground
set -euo pipefail
cd "$(dirname "$0")/.."
export PYDIST_REQUIRE_PEERS=1   # tests that compare with torch fail, rather than skip, without it
export PATH="$PWD/.venv/bin:$PATH"
source scripts/compiler.sh
LOGS=$(mktemp -d)   # each stage's time, and what each lane printed
start=$(date +%s)
LANE1=(unit mpi docs libraries)
LANE2=(unit2 pythons py314 pip asan levels blocks torch)
LAST=(make)

declare -A TITLE=(
  [unit]="unit tests (world size 1)"
  [unit2]="unit tests that compile or benchmark (test_build.py, test_simd.py, test_benchmarks.py)"
  [mpi]="multi-rank tests under mpiexec (1, 2, 3, 4 ranks)"
  [levels]="the kernels' tests at every instruction-set level below the CPU's widest"
  [pythons]="the C API core on the other Pythons pyproject.toml claims (scripts/test_pythons.sh)"
  [py314]="CPython 3.14 and MPICH 5 on Debian unstable: the C API core, the multi-rank core (scripts/sid_root.sh)"
  [pip]="pip install with no system MPI, the wheel, MPICH 5 (scripts/test_pip_install.sh)"
  [asan]="AddressSanitizer build: core tests"
  [docs]="the documentation site: built with warnings as errors, every example run"
  [blocks]="the README's and the install guide's shell blocks, as written (tests/docs/shell_blocks.py)"
  [torch]="torch's own distributed tests over pydist and gloo, a subset (tests/torch_suite/run.py --subset)"
  [make]="the README's make commands, as written: make train, make docs"
  [libraries]="one install on each other MPI: MPICH 5, Intel MPI, the standard ABI, Open MPI 5.0 and 4.1 (scripts/test_libraries.sh)"
)

# run_stage NAME: the stage (scripts/test_stages.sh) in a bash of its own, with its time in $LOGS/NAME.time:
# seconds, and the CPU seconds (user + system) of every process it started and waited for, MPI ranks
# included (the 2 cores' worth of CPU is what bounds the suite, more than either lane's time).
run_stage() {
  local rc=0 TIMEFORMAT='%0R %0U %0S'
  echo "== $1: ${TITLE[$1]}"
  { time bash -euo pipefail -c "source scripts/test_stages.sh; stage_$1" 2>&3; } 3>&2 2> "$LOGS/$1.rusage" || rc=$?
  awk '{ printf "%d s (CPU %d s)\n", $1, $2 + $3 }' "$LOGS/$1.rusage" > "$LOGS/$1.time"
  echo "-- $1 took $(< "$LOGS/$1.time")$([ $rc -eq 0 ] || echo ": FAILED")"
  return $rc
}

# run_lane STAGE...: the stages one after another, stopping at the first that fails
run_lane() {
  local s
  for s in "$@"; do run_stage "$s" || return 1; done
}

LANE2_PID=""
on_exit() {
  if [ -n "$LANE2_PID" ] && kill -0 "$LANE2_PID" 2>/dev/null; then
    kill -TERM -- -"$LANE2_PID" 2>/dev/null || true   # lane 2's whole process group
  fi
  echo "stage times:"
  local s
  for s in "${LANE1[@]}" "${LANE2[@]}" "${LAST[@]}"; do
    [ -f "$LOGS/$s.time" ] && echo "  $s: $(< "$LOGS/$s.time")"
  done
  rm -rf "$LOGS"
  return 0
}
trap on_exit EXIT

for s in "$@"; do
  [ -n "${TITLE[$s]:-}" ] || { echo "test.sh: no stage '$s' (stages: ${!TITLE[*]})"; exit 2; }
done
if [ $# -gt 0 ]; then
  run_lane "$@" 2>&1 | tee "$LOGS/lane1.log"
else
  # Lane 2 compiles one file at a time (PYDIST_BUILD_JOBS, setup.py), in a process group of its own
  # (set -m), so that a failure in lane 1 can end it with everything it started.
  set -m
  ( set +m; PYDIST_BUILD_JOBS=1 run_lane "${LANE2[@]}" ) > "$LOGS/lane2.log" 2>&1 &
  LANE2_PID=$!
  set +m
  echo "(lane 2, in the background: ${LANE2[*]}; its output follows lane 1's)"
  lane1_rc=0
  run_lane "${LANE1[@]}" 2>&1 | tee "$LOGS/lane1.log" || lane1_rc=$?
  if [ $lane1_rc -ne 0 ]; then
    echo "lane 1 failed; lane 2 is stopped (what it printed so far follows)"
    kill -TERM -- -"$LANE2_PID" 2>/dev/null || true
  fi
  lane2_rc=0
  wait "$LANE2_PID" || lane2_rc=$?
  LANE2_PID=""
  echo "======== lane 2 (${LANE2[*]}), run beside lane 1:"
  cat "$LOGS/lane2.log"
  [ $lane1_rc -eq 0 ] && [ $lane2_rc -eq 0 ] || exit 1
  run_lane "${LAST[@]}" 2>&1 | tee -a "$LOGS/lane1.log"
fi

passed=$(cat "$LOGS"/lane*.log | { grep -oE "^[0-9]+ passed" || true; } | awk '{ s += $1 } END { print s + 0 }')
echo "== all tests passed in $(( $(date +%s) - start )) s"
echo "total: $passed passed, 0 failed"
