#!/usr/bin/env bash
# Install everything pydist needs on a fresh Debian/Ubuntu machine, then build pydist into .venv.
#
#   scripts/setup.sh          MPICH, OpenBLAS, Fashion-MNIST and the package (what `make train` needs)
#   scripts/setup.sh --test   also the test and benchmark peers: pytest, hypothesis, torch (CPU), mpi4py,
#                             and Sphinx for the documentation site
#
# Safe to run again: it installs only what is missing. Needs root (or sudo) for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

# MPICH, never Open MPI: a library linked to one MPI and launched by the other's mpiexec runs every
# process as rank 0 of 1. Debian's python3-mpi4py pulls Open MPI in, so it is never installed here.
# OpenBLAS and zlib for the training engine, and the Fashion-MNIST data set its main job trains on.
APT_PACKAGES=(mpich libmpich-dev pkg-config libopenblas-dev zlib1g-dev dataset-fashion-mnist)
# The test suite's builds go through ccache (scripts/compiler.sh).
if [ "${1:-}" = "--test" ]; then APT_PACKAGES+=(ccache); fi
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]} with apt-get"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PYTHON" -m venv .venv
fi
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)
"${PIP[@]}" -U "setuptools>=70" wheel "numpy>=1.23"
# Optional for pydist, wanted by the main job: a progress bar and the PNG of the curves.
"${PIP[@]}" tqdm matplotlib
if [ "${1:-}" = "--test" ]; then
  # torch 2.13.0 is the CPU build (a local file here); other versions download GBs of CUDA.
  # hypothesis is pinned: the fuzz tests draw from a fixed seed, and the same version draws the same
  # cases on every machine.
  # ml_dtypes: bfloat16 as a NumPy dtype (JAX's), which pydist reduces as torch's bfloat16.
  "${PIP[@]}" "pytest>=7" "hypothesis==6.170.15" "torch==2.13.0" "ml_dtypes==0.6.0"
  # The documentation site (make docs; make test builds it): Sphinx, MyST for the Markdown pages, furo.
  "${PIP[@]}" "sphinx==9.0.4" "myst-parser==5.2.0" "furo==2025.12.19"
  # mpi4py from source against MPICH (about 2 minutes, once): the PyPI wheel wants another libmpi.
  if ! .venv/bin/python -c "import mpi4py" 2>/dev/null; then
    echo "setup: building mpi4py against MPICH"
    MPICC=mpicc.mpich "${PIP[@]}" --no-binary mpi4py --no-cache-dir mpi4py
  fi
fi
# Editable, so the tests and examples run against this checkout; the C extension is built in place.
if [ "${1:-}" = "--test" ]; then source scripts/compiler.sh; fi
"${PIP[@]}" --no-build-isolation -e .
.venv/bin/python -c "import pydist, numpy; print('setup: pydist', pydist.__version__, 'ready in .venv')"
# The venvs of the other Pythons pyproject.toml claims, for make test's pythons stage (made once).
if [ "${1:-}" = "--test" ]; then scripts/test_pythons.sh --venvs; fi
