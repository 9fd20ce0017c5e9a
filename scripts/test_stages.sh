# The stages of scripts/test.sh, one function each (stage_NAME), sourced by a fresh `bash -euo pipefail`
# per stage: its first failing command fails it. (A function or subshell that test.sh ran as
# `stage || rc=$?` would run with set -e ignored, and go on past a failure.)
PY=.venv/bin/python
# tests/unit in two parts, one per lane: the files that compile the extension or its kernels, or run
# the benchmarks (each a job that keeps both cores busy), go in lane 2.
UNIT2="tests/unit/test_build.py tests/unit/test_simd.py tests/unit/test_benchmarks.py"

stage_unit() {
  $PY -P -m pytest tests/unit -q -p no:cacheprovider $(printf -- '--ignore=%s ' $UNIT2)
}

stage_unit2() {
  $PY -P -m pytest $UNIT2 -q -p no:cacheprovider
}

stage_mpi() {
  $PY tests/run_mpi.py -n 1 2 3 4 --durations 3
}

# The unit and multi-rank stages ran every vector kernel at the widest level this CPU runs; the kernels'
# own tests run again at each narrower one (csrc/core/simd.h), so a wrong or missing build of a convolution,
# pooling, reduction or compressor fails here on any x86-64 machine: sse2 everywhere, avx2 too on an
# AVX-512 CPU. PYDIST_SIMD also caps OpenBLAS's kernels (Prescott at sse2).
lower_levels() {
  $PY -c "from pydist import _C; L = ('sse2', 'avx2', 'avx512'); print(*L[:L.index(_C.simd_info()['cpu'])])"
}

stage_levels() {
  local level
  for level in $(lower_levels); do
    echo "-- the kernels' tests at PYDIST_SIMD=$level"
    PYDIST_SIMD=$level $PY -P -m pytest -q -p no:cacheprovider tests/unit/test_engine.py \
      tests/unit/test_engine_torch.py tests/unit/test_profile.py tests/unit/test_compression_kernels.py \
      tests/unit/test_strategy_options.py
    # at 3 ranks, where the shared-memory paths cut buffers unevenly: every kernel's remainder loop
    PYDIST_SIMD=$level $PY tests/run_mpi.py -n 3 -- tests/mpi/test_shm.py tests/mpi/test_shm_small.py \
      tests/mpi/test_minmax.py tests/mpi/test_all_reduce.py tests/mpi/test_compression.py tests/mpi/test_engine_dp.py
  done
}

stage_docs() {
  $PY -P -m pytest tests/docs docs --doctest-glob='*.md' -q -p no:cacheprovider
}

# The shell blocks of the README and the install guide, as a reader types them, on this machine with
# Debian's MPICH: a fresh venv, a fresh HOME, a clean copy of the checkout (tests/docs/shell_blocks.py).
# The pip stage runs the README's install block again with no MPI on the machine at all.
# torch's own distributed test suite (tests/torch_suite): a bounded subset over pydist and gloo at 2 and
# 3 ranks; it fails on a test that passes over gloo and not over pydist (make torch-suite: every test)
stage_torch() {
  $PY tests/torch_suite/run.py --subset
}

stage_blocks() {
  local work
  work=$(mktemp -d)
  $PY tests/docs/shell_blocks.py --work "$work" README.md docs/guides/install.md | tee "$work/out.txt"
  # what the install guide shows them print: the build's MPI and BLAS, the trained epoch, the wheel's name
  for line in "built with MPI from pkg-config mpich, for the ABIs mpich, openmpi, standard" \
      "running on MPICH Version:" "BLAS from pkg-config openblas" "pydist.run: finished: 2 rank(s), 0 restart(s)"; do
    grep -qF "$line" "$work/out.txt" || { echo "FAIL: the blocks did not print what the pages show: $line"; exit 1; }
  done
  local wheel="pydist-[0-9.]+-cp3[0-9]+-cp3[0-9]+-manylinux_2_27_x86_64\.manylinux_2_28_x86_64\.whl"
  grep -qE "^Fixed-up wheel written to $work/src/dist/$wheel\$" "$work/out.txt" ||
    { echo "FAIL: no manylinux_2_28 wheel of the name the install guide shows"; exit 1; }
  rm -rf "$work"
}

# The README's make commands (make train, make docs) as written, in this checkout: they reinstall the
# package here, so test.sh runs this stage after both lanes, when nothing else uses the checkout.
stage_make() {
  $PY tests/docs/shell_blocks.py --make README.md
}

stage_pip() {
  scripts/test_pip_install.sh
}

stage_libraries() {
  scripts/test_libraries.sh
}

stage_pythons() {
  scripts/test_pythons.sh
}

# CPython 3.14 on Debian unstable with its own MPICH 5 (scripts/sid_root.sh; made by setup.sh --test):
# the checkout as it stands (tracked files and new ones git does not ignore) copied to a folder of its own
# bound into the root at /src (never built in this tree, where other stages run at the same time), built
# there with the root's python3.14 without a warning (through the root's ccache, so a rerun recompiles
# what changed), then the C API core unit tests and the core multi-rank tests at 2 and 3 ranks under the
# root's mpiexec (scripts/core_tests.sh's lists, as on the other Pythons and libraries).
stage_py314() {
  local start=$SECONDS
  scripts/sid_root.sh up
  PY314_SRC=$(mktemp -d)
  trap 'rm -rf "$PY314_SRC"' EXIT
  scripts/copy_checkout.sh "$PY314_SRC"
  echo "-- the root, and the checkout copied: $((SECONDS - start)) s"
  # (Fashion-MNIST from this machine, for the engine's tests that train on it)
  scripts/sid_root.sh run --bind "$PY314_SRC:/src" --ro-bind /usr/share/datasets:/usr/share/datasets -- \
    env CC="ccache gcc" CCACHE_DIR=/var/cache/ccache ${PYDIST_BUILD_JOBS:+PYDIST_BUILD_JOBS=$PYDIST_BUILD_JOBS} \
    bash -euo pipefail -c '
    cd /src
    export PYTHONPATH=/src
    source scripts/core_tests.sh
    t0=$SECONDS
    # (MPICH 5 is what runs here: the build for its ABI alone; the libraries stage runs the others)
    log=$(PYDIST_MPI_ABIS=mpich /v/bin/python setup.py build_ext --inplace 2>&1) || { echo "$log"; exit 1; }
    if grep -q "warning:" <<<"$log"; then grep -B2 -A4 "warning:" <<<"$log"; echo "FAIL: compiler warnings"; exit 1; fi
    version=$(/v/bin/python -P -m pydist --version)
    echo "$version"
    grep -q "MPICH Version: *5\." <<<"$version" || { echo "FAIL: not running on MPICH 5"; exit 1; }
    /v/bin/python -P -c "import sys, pydist._C as c; assert sys.version_info[:2] == (3, 14), sys.version; \
assert c.__file__.startswith(\"/src/pydist/_C_mpich.cpython-314\"), c.__file__; print(\"Python\", sys.version.split()[0], \"imports\", c.__file__)"
    t1=$SECONDS
    echo "-- built in $((t1 - t0)) s; the C API core on 3.14"
    /v/bin/python -P -m pytest -q -p no:cacheprovider -k "$NO_TORCH" "${CORE_UNIT[@]}"
    t2=$SECONDS
    # test_shm_small.py tests the shared-memory slots, which need MPI to say that the ranks share a node
    # (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)). The MPICH 5.0.2 of Debian unstable (ch4:ucx) puts every
    # rank in a node of its own, under its own mpiexec or under MPICH 4 hydra, in a plain C program too, so
    # pydist has no slots there and MPI carries every call; the file runs wherever MPI says otherwise.
    node=$(mpiexec -n 2 /v/bin/python -P -c "import pydist as d; d.init_process_group(); print(d._C.shm_info()[\"node_size\"])" | sort -u)
    mpi_files=("${CORE_MPI[@]}")
    if [ "$node" != 2 ]; then
      echo "-- ranks sharing a node by MPI_COMM_TYPE_SHARED at 2 ranks: $node; tests/mpi/test_shm_small.py left out"
      mpi_files=($(printf "%s\n" "${CORE_MPI[@]}" | grep -v test_shm_small))
    fi
    echo "-- the core multi-rank tests on 3.14 and MPICH 5, at 2 and 3 ranks"
    /v/bin/python tests/run_mpi.py -n 2 3 -- "${mpi_files[@]}" -k "$NO_TORCH"
    echo "-- py314 in the root: build $((t1 - t0)) s, unit $((t2 - t1)) s, mpi $((SECONDS - t2)) s"
  '
}

stage_asan() {
  rm -rf build/asan && mkdir -p build/asan/pydist
  cp pydist/*.py build/asan/pydist/
  # (the build for MPICH's ABI alone: the core tests below run on Debian's MPICH)
  PYDIST_ASAN=1 PYDIST_MPI_ABIS=mpich $PY setup.py -q build_ext --build-lib build/asan --build-temp build/asan-tmp 2>&1 |
    { grep -iE "warning|error" || true; }
  # libstdc++ is preloaded too: with libasan alone, ASan's __cxa_throw hook aborts on any C++ exception
  # torch throws (even one it catches itself).
  ASAN_LIB="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
  # Every process writes its report to $ASAN_DIR. CPython keeps thousands of allocations alive at exit,
  # which LeakSanitizer lists too, so leaks do not fail the run by themselves (exitcode=0): below, a
  # leak fails it only if its allocation stack passes through our own code (csrc/). Memory errors
  # (overflows, use after free) fail at once.
  # malloc_context_size=2: each allocation keeps only malloc and its caller. That caller is where the
  # csrc/ check looks (a frame pointer chain ends in frame-pointer-less libpython, numpy or torch, so
  # frames past it are garbage or absent anyway). And at exit LeakSanitizer looks up every frame of
  # every leak, re-reading /proc/self/maps for each frame that lies in no module: with the default 30
  # frames a process that imported torch (45,000 leaks) took 80-170 s to exit and an MPI rank 25 s;
  # with 2, 1-2 s. For a memory error's full allocation stack, re-run that test with a larger value.
  ASAN_DIR=$(mktemp -d)
  trap asan_memory_errors EXIT   # on failure too: any memory error ASan reported
  export ASAN_OPTIONS=detect_leaks=1:malloc_context_size=2:abort_on_error=1:log_path=$ASAN_DIR/asan
  export LSAN_OPTIONS=exitcode=0
  LD_PRELOAD=$ASAN_LIB PYTHONPATH=$PWD/build/asan $PY -P -c \
    "import pydist._C as c, sys; assert '/build/asan/' in c.__file__, c.__file__; print('asan build:', c.__file__)"
  # LeakSanitizer's own tracer (the thread that stops the others for the leak check at exit) has died
  # of SIGSEGV in CI after every test had passed ("Tracer caught signal 11 ... LeakSanitizer has
  # encountered a fatal error"), on a busy machine, twice in a row; never here in the foreground. That
  # is the sanitizer's crash, not a finding. Only then, with no memory error reported: once more, and
  # if its tracer crashes again, once more without the exit-time leak check (memory errors are still
  # caught; the multi-rank stage below still checks leaks).
  if ! asan_unit; then
    tracer_crashed || return 1
    echo "asan: LeakSanitizer's tracer crashed at exit (not a finding); the stage once more"
    forget_crash
    if ! asan_unit; then
      tracer_crashed || return 1
      echo "asan: its tracer crashed again; the stage without the exit-time leak check"
      forget_crash
      ASAN_OPTIONS=${ASAN_OPTIONS/detect_leaks=1/detect_leaks=0} asan_unit
    fi
  fi
  # The torch backend's tests are left out here: what they add is torch's own code (and DDP under ASan
  # is slow); the pydist calls they make are the ones the rest of tests/mpi runs.
  LD_PRELOAD=$ASAN_LIB PYTHONPATH=$PWD/build/asan $PY tests/run_mpi.py -n 2 --durations 3 -- \
    --ignore=tests/mpi/test_torch_backend.py
  # At 3 ranks, the paths whose buffers are cut by the world size (uneven pieces, odd ring steps); the
  # rest of tests/mpi at 3 ranks doubled the stage for calls the 2-rank run already made.
  LD_PRELOAD=$ASAN_LIB PYTHONPATH=$PWD/build/asan $PY tests/run_mpi.py -n 3 --durations 3 -- \
    tests/mpi/test_shm.py tests/mpi/test_shm_small.py tests/mpi/test_ring.py tests/mpi/test_persistent.py \
    tests/mpi/test_all_reduce.py tests/mpi/test_minmax.py tests/mpi/test_collectives.py tests/mpi/test_path_table.py
  # Each narrower level's builds of the kernels, under ASan too.
  local level
  for level in $(lower_levels); do
    echo "asan: the kernels at PYDIST_SIMD=$level"
    PYDIST_SIMD=$level LD_PRELOAD=$ASAN_LIB PYTHONPATH=$PWD/build/asan $PY -P -m pytest -q -p no:cacheprovider \
      tests/unit/test_engine.py tests/unit/test_compression_kernels.py
    PYDIST_SIMD=$level LD_PRELOAD=$ASAN_LIB PYTHONPATH=$PWD/build/asan $PY tests/run_mpi.py -n 2 -- \
      tests/mpi/test_shm.py tests/mpi/test_compression.py tests/mpi/test_engine_dp.py
  done
  if grep -q "ERROR: AddressSanitizer" "$ASAN_DIR"/asan.* 2>/dev/null; then
    return 1   # asan_memory_errors prints the reports
  fi
  ours=$(cat "$ASAN_DIR"/asan.* 2>/dev/null | awk 'BEGIN { RS = "" } /leak of/ && /csrc\//')
  if [ -n "$ours" ]; then
    echo "$ours"; echo "LeakSanitizer: leaks allocated by pydist's C code (above)"; return 1
  fi
  echo "asan: no memory errors; no leaks from csrc/ ($(ls "$ASAN_DIR" | wc -l) process reports read)"
  rm -rf "$ASAN_DIR"; ASAN_DIR=""
}

asan_unit() {
  LD_PRELOAD=$ASAN_LIB PYTHONPATH=$PWD/build/asan $PY -P -m pytest -q -p no:cacheprovider \
    tests/unit/test_api.py tests/unit/test_errors.py tests/unit/test_float16.py tests/unit/test_gil.py \
    tests/unit/test_engine.py tests/unit/test_engine_torch.py tests/unit/test_profile.py \
    tests/unit/test_ring_args.py tests/unit/test_strategy_options.py \
    tests/unit/test_shm_args.py tests/unit/test_compression_kernels.py
}

tracer_crashed() {
  grep -q "LeakSanitizer has encountered a fatal error" "$ASAN_DIR"/asan.* 2>/dev/null &&
    ! grep -q "ERROR: AddressSanitizer" "$ASAN_DIR"/asan.* 2>/dev/null
}

forget_crash() { rm -f $(grep -l "LeakSanitizer has encountered a fatal error" "$ASAN_DIR"/asan.*); }

asan_memory_errors() {
  if [ -n "${ASAN_DIR:-}" ] && grep -l "ERROR: AddressSanitizer" "$ASAN_DIR"/asan.* 2>/dev/null; then
    cat $(grep -l "ERROR: AddressSanitizer" "$ASAN_DIR"/asan.*); echo "AddressSanitizer found a memory error (above)"
  fi
}

