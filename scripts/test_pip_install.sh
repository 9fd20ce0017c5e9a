#!/usr/bin/env bash
# pydist installed the way a user without root installs it, and on PyPI's MPICH 5 (part of `make test`).
#
#   1. No system packages: in a mount namespace whose /usr has Debian's MPICH, OpenBLAS, BLAS/LAPACK
#      and zlib headers whited out (an overlay; nothing changes outside it), check that mpicc, mpi.h,
#      cblas.h, zlib.h and their pkg-config files cannot be found, then what the README says (~ being
#      $WORK/reader/home here), run as written by tests/docs/shell_blocks.py (in the source folder itself,
#      python -m pydist must say it is there, in one sentence). pip fetches MPICH 5 and scipy-openblas32
#      from PyPI for the build (buildsys/pydist_backend.py).
#   2. A wheel of the same checkout (`pip wheel .`), then `auditwheel repair` leaving libmpi and OpenBLAS to
#      their PyPI packages. The repaired wheel goes into a fresh venv, back on the full machine
#      (Debian's MPICH in view: the wheel must still load PyPI's), and passes the core tests on MPICH 5:
#      every collective, p2p, async work, groups, errors and timeouts, and the training engine's data
#      parallelism at 2 and 3 ranks; dying and stuck ranks; the launcher checks and the import (PyPI's
#      OpenBLAS must start with one thread, as Debian's does).
#
# Needs root (a mount namespace and an overlay), as scripts/cluster.sh does, and PyPI (or pip's cache).
#   scripts/test_pip_install.sh [WORKDIR]   (default: a fresh temporary folder, removed on success)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
PIP_QUIET=(-q --disable-pip-version-check)

if [ "${1:-}" = "--inside" ]; then   # step 1, run by step 0 below inside the mount namespace
  WORK=$2
  # Every file Debian's packages for MPI, BLAS/LAPACK and zlib headers put under /usr, and every link
  # under /usr that leads to one (the alternatives: mpicc, mpiexec, cblas.h, libblas.so ...).
  mapfile -t pkgs < <(dpkg-query -W -f '${Package} ${Status}\n' 2>/dev/null |
    awk '$NF == "installed" && $1 ~ /^(mpich|libmpich|libopenblas|libblas|liblapack|zlib1g-dev)/ { print $1 }')
  hidden=$(mktemp)
  for p in "${pkgs[@]}"; do dpkg -L "$p"; done | grep '^/usr/' | while read -r f; do
    [ -d "$f" ] && [ ! -L "$f" ] || echo "$f"; done | sort -u > "$hidden"
  find /usr/bin /usr/include /usr/lib/x86_64-linux-gnu /usr/share/pkgconfig -maxdepth 3 -type l 2>/dev/null |
    while read -r l; do
      t=$(readlink -f "$l" || true)
      if [ -n "$t" ] && grep -qxF "$t" "$hidden"; then echo "$l"; fi
    done >> "$hidden"
  over=$(mktemp -d)
  mount -t tmpfs tmpfs "$over"
  mkdir "$over/upper" "$over/work"
  while read -r f; do   # an overlay "whiteout": a 0/0 character device hides the lower file
    mkdir -p "$over/upper$(dirname "${f#/usr}")"
    mknod "$over/upper${f#/usr}" c 0 0
  done < <(sort -u "$hidden")
  mount -t overlay overlay -o "lowerdir=/usr,upperdir=$over/upper,workdir=$over/work" /usr
  echo "-- hidden: $(sort -u "$hidden" | wc -l) files of ${pkgs[*]}"
  # The proof: none of it can be found any more.
  for cmd in mpicc mpicc.mpich mpiexec mpiexec.mpich; do
    if command -v "$cmd" >/dev/null; then echo "FAIL: $cmd is still on PATH"; exit 1; fi
  done
  for header in mpi.h cblas.h zlib.h; do
    if echo "#include <$header>" | gcc -E -x c - >/dev/null 2>&1; then echo "FAIL: gcc still finds $header"; exit 1; fi
  done
  for pc in mpich openblas blas zlib; do
    if pkg-config --exists "$pc"; then echo "FAIL: pkg-config still finds $pc"; exit 1; fi
  done
  echo "-- no mpicc, mpiexec, mpi.h, cblas.h, zlib.h or their pkg-config files on this machine now"

  # The README's install block, as written (tests/docs/shell_blocks.py: a fresh venv active, HOME a fresh
  # folder, in a clean copy of the checkout): pip builds on MPICH 5 and OpenBLAS from PyPI
  # (buildsys/pydist_backend.py), and trains one epoch through pydist.run.
  "$PYTHON" "$ROOT/tests/docs/shell_blocks.py" --work "$WORK/reader" --match "python -m venv ~/pd" \
    "$ROOT/README.md" | tee "$WORK/blocks.txt"
  pd="$WORK/reader/home/pd"
  grep -q "built with MPI from PyPI's mpich 5" "$WORK/blocks.txt" || { echo "FAIL: not built on PyPI's MPICH"; exit 1; }
  grep -q "running on MPICH Version: *5" "$WORK/blocks.txt" || { echo "FAIL: not running on MPICH 5"; exit 1; }
  grep -q "BLAS from PyPI's scipy-openblas32" "$WORK/blocks.txt" || { echo "FAIL: BLAS not from PyPI"; exit 1; }
  "$pd/bin/python" - "$WORK/blocks.txt" <<'EOF'
import json, sys
summary = [l for l in open(sys.argv[1]) if l.startswith("summary ")]
acc = json.loads(summary[-1].split(" ", 1)[1])["final_test_accuracy"]
assert acc > 0.7, f"one epoch on PyPI's MPICH reached test accuracy {acc}, expected above 0.7"
print(f"-- trained: test accuracy {acc} after one epoch")
EOF
  # in the source folder, as a user who has not left it yet: one sentence, not a deep import error
  cd "$WORK/reader/src"
  if out=$("$pd/bin/python" -m pydist --version 2>&1) || ! grep -q "is pydist's source folder" <<<"$out"; then
    echo "FAIL: python -m pydist in the unbuilt checkout: $out"; exit 1
  fi
  # the wheel of the same build, for step 2
  "$pd/bin/pip" wheel "${PIP_QUIET[@]}" --no-deps . -w "$WORK/wheel"
  exit 0
fi

# Step 0: the namespace, then step 2 on the full machine.
if [ "$(id -u)" -ne 0 ]; then
  echo "test_pip_install: needs root (a mount namespace with an overlay over /usr hides the system's MPI)"
  exit 1
fi
WORK=${1:-$(mktemp -d)}
mkdir -p "$WORK"
unshare --mount --propagation private "$0" --inside "$WORK"

# libmpi.so.12 and libscipy_openblas.so stay outside the wheel: they come from the mpich and
# scipy-openblas32 packages the wheel depends on, so mpiexec and libmpi always match. manylinux_2_28:
# RHEL/Rocky 8's glibc (csrc/core/glibc_floor.h keeps the module's symbols at 2.27 or older), repaired
# and checked as make wheel does it.
"$ROOT/scripts/build_wheels.sh" --repair "$WORK"/wheel/pydist-*.whl "$WORK/wheelhouse"
wheel=$(ls "$WORK"/wheelhouse/pydist-*manylinux*.whl)
echo "-- the wheel in a fresh venv: $(basename "$wheel")"
"$PYTHON" -m venv "$WORK/w"
"$WORK/w/bin/pip" install "${PIP_QUIET[@]}" "$wheel" "pytest>=7" "hypothesis==6.170.15"
# The tests from a folder with no pydist/ in it, so that they import the installed wheel.
mkdir -p "$WORK/t" && cp -r "$ROOT/tests" "$ROOT/examples" "$ROOT/pyproject.toml" "$WORK/t/"
cd "$WORK/t"
export PATH="$WORK/w/bin:$PATH"
"$WORK/w/bin/python" -P -m pydist --version | tee "$WORK/version.txt"
grep -q "running on MPICH Version: *5" "$WORK/version.txt" || { echo "FAIL: the wheel does not run on MPICH 5"; exit 1; }
"$WORK/w/bin/python" -P -c "import pydist; assert pydist.__file__.startswith('$WORK/w/'), pydist.__file__"
source "$ROOT/scripts/core_tests.sh"   # CORE_MPI, NO_TORCH
echo "-- core tests on MPICH 5: tests/mpi at 2 and 3 ranks"
"$WORK/w/bin/python" tests/run_mpi.py -n 2 3 -- "${CORE_MPI[@]}" -k "$NO_TORCH"
echo "-- core tests on MPICH 5: a timeout, a missing rank, dead ranks (exception, exit, SIGKILL), Ctrl-C;"
echo "   the process around them (launchers, PyPI's OpenBLAS loaded with one thread, the environment left alone)"
"$WORK/w/bin/python" -P -m pytest -q -p no:cacheprovider tests/unit/test_faults.py tests/unit/test_launcher.py \
  -k "timeout_names or names_the_missing_rank or dead_rank or ctrl_c or test_launcher"
cd /
rm -rf "$WORK"
