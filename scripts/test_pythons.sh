#!/usr/bin/env bash
# pydist on every Python version that pyproject.toml claims, besides the main .venv's (which runs the
# whole suite). For each other claimed 3.x: a venv .venv-py3.x (made once, then reused) with numpy,
# pytest and hypothesis; the extension built in place with that Python (the .so name carries the
# version tag, so the builds sit side by side); then the tests that exercise the C API: the core unit
# files (minus the torch comparisons: torch is installed for .venv's Python only), which reach every C
# API entry. (The multi-rank core runs on .venv's Python against both MPICHs: stages 2 and 4 of
# scripts/test.sh.) A compiler warning or a failing test fails the script;
# a claimed Python that this machine does not have is one line saying so, not a failure (3.14, which
# Debian 12 lacks, is the py314 stage's: built and tested in a Debian unstable root, scripts/sid_root.sh).
#
#   scripts/test_pythons.sh              every claimed version but .venv's
#   scripts/test_pythons.sh 3.12 3.13    just these
#   scripts/test_pythons.sh --venvs      only make the venvs that are missing (scripts/setup.sh --test
#                                        does, so that make test's time is the tests', not pip's)
set -euo pipefail
cd "$(dirname "$0")/.."
unset PYDIST_REQUIRE_PEERS   # scripts/test.sh sets it; the torch comparisons are not run here
source scripts/core_tests.sh   # CORE_UNIT, NO_TORCH

main=$(.venv/bin/python -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true)
claimed=$(sed -n 's/^ *"Programming Language :: Python :: \(3\.[0-9][0-9]*\)",*$/\1/p' pyproject.toml)
[ -n "$claimed" ] || { echo "test_pythons: no 'Programming Language :: Python :: 3.x' classifiers in pyproject.toml"; exit 1; }
venvs_only=0
if [ "${1:-}" = "--venvs" ]; then venvs_only=1; shift; fi
versions=("$@")
if [ ${#versions[@]} -eq 0 ]; then
  for v in $claimed; do
    if [ "$v" != "$main" ]; then versions+=("$v"); fi
  done
fi
sid=$(scripts/sid_root.sh python)   # the Python that make test's py314 stage tests in a Debian unstable root

# The interpreter for version $1: python3.x on PATH if it runs (a pyenv shim may not), else pyenv's
# newest 3.x.y, else the system's.
find_python() {
  local cand
  for cand in "$(command -v "python$1" || true)" \
              $(ls -d "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/"$1".*/bin/python"$1" 2>/dev/null | sort -V -r) \
              "/usr/bin/python$1"; do
    if [ -n "$cand" ] && [ -x "$cand" ] && "$cand" -c 'import venv' >/dev/null 2>&1; then
      echo "$cand"; return 0
    fi
  done
  return 1
}

failed=()
for v in "${versions[@]}"; do
  start=$(date +%s)
  if ! py=$(find_python "$v"); then
    if [ "$v" = "$sid" ]; then
      echo "== Python $v: no python$v on this machine; make test's py314 stage tests it, with MPICH 5, in a Debian unstable root (scripts/sid_root.sh)"
    else
      echo "== Python $v: NOT TESTED: no python$v on this machine (PATH, pyenv, /usr/bin)"
    fi
    continue
  fi
  venv=.venv-py$v
  if ! "$venv/bin/python" -c "import numpy, pytest, hypothesis, setuptools" >/dev/null 2>&1; then
    echo "setup: making $venv ($py)"
    rm -rf "$venv"
    "$py" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -U "setuptools>=70" wheel "numpy>=1.23" \
      "pytest>=7" "hypothesis==6.170.15"
  fi
  if [ $venvs_only -eq 1 ]; then continue; fi
  echo "== Python $v ($py)"
  build_log=$("$venv/bin/python" setup.py build_ext --inplace 2>&1) || { echo "$build_log"; failed+=("$v: build"); continue; }
  if grep -q "warning:" <<<"$build_log"; then
    grep -B2 -A4 "warning:" <<<"$build_log"; failed+=("$v: compiler warnings")
  fi
  export PYTHONPATH=$PWD
  "$venv/bin/python" -P -c "import pydist._C as c, sys; assert c.__file__.startswith('$PWD/'), c.__file__; \
print('python', sys.version.split()[0], 'imports', c.__file__)"
  "$venv/bin/python" -P -m pytest -q -p no:cacheprovider -k "$NO_TORCH" "${CORE_UNIT[@]}" || failed+=("$v: tests/unit")
  unset PYTHONPATH
  echo "== Python $v: done in $(( $(date +%s) - start )) s"
done
if [ ${#failed[@]} -gt 0 ]; then
  printf 'test_pythons: FAILED on Python %s\n' "${failed[@]}"
  exit 1
fi
