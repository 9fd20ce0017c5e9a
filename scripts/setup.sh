#!/usr/bin/env bash
# Install everything pydist needs on a fresh Debian/Ubuntu machine, then build pydist into .venv.
#
#   scripts/setup.sh          MPICH, OpenBLAS, Fashion-MNIST and the package (what `make train` needs)
#   scripts/setup.sh --test   also the test and benchmark peers: pytest, hypothesis, torch (CPU), mpi4py,
#                             Sphinx for the documentation site, and Slurm with MUNGE (scripts/slurm.sh)
#   scripts/setup.sh --docs   what `make train` needs, and Sphinx for the documentation site (make docs)
#
# Safe to run again: it installs only what is missing. Needs root (or sudo) for apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."

# MPICH is the system's MPI here. The other MPIs the libraries stage runs on (Open MPI among them) live
# in prefixes of their own (scripts/test_libraries.sh), so that the plain mpiexec and mpicc keep naming
# MPICH's for the rest of the suite: Debian's openmpi-bin (and python3-mpi4py, which pulls it in) would
# switch them through its alternatives, so they are never installed system-wide.
# OpenBLAS and zlib for the training engine, and the Fashion-MNIST data set its main job trains on.
APT_PACKAGES=(mpich libmpich-dev pkg-config libopenblas-dev zlib1g-dev dataset-fashion-mnist)
# The test suite's builds go through ccache (scripts/compiler.sh); the docs stage looks at the built site
# in headless Chromium (tests/docs/test_docs.py, scripts/docs_screenshots.sh).
if [ "${1:-}" = "--test" ]; then APT_PACKAGES+=(ccache chromium); fi
# A real single-node Slurm for the tests under srun/sbatch/salloc (scripts/slurm.sh). Without
# --no-install-recommends apt adds slurm-wlm-plugins and with it 31 packages (hdf5, influxdb, rrd,
# ipmi, rocm-smi, ...) that nothing here uses. libpmix2 and libpmix-dev: Slurm's --mpi=pmix plugin
# dlopens libpmix.so (the -dev package's link), for the test that pydist refuses --mpi=pmix with an
# MPICH that cannot speak PMIx.
SLURM_PACKAGES=()
if [ "${1:-}" = "--test" ]; then SLURM_PACKAGES=(slurmd slurmctld slurm-client munge libpmix2 libpmix-dev); fi
# not_installed PKG...: those of PKG that dpkg does not have installed.
not_installed() {
  local pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || echo "$pkg"
  done
}
mapfile -t missing < <(not_installed "${APT_PACKAGES[@]}")
mapfile -t missing_slurm < <(not_installed "${SLURM_PACKAGES[@]}")
SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
if [ ${#missing[@]} -gt 0 ] || [ ${#missing_slurm[@]} -gt 0 ]; then $SUDO apt-get update -qq; fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]} with apt-get"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
if [ ${#missing_slurm[@]} -gt 0 ]; then
  echo "setup: installing ${missing_slurm[*]} with apt-get"
  # munge's postinst starts the system munged through invoke-rc.d (socket /run/munge/munge.socket.2,
  # the key it makes in /etc/munge) unless a policy-rc.d forbids it (Docker images' does); slurmd's
  # and slurmctld's start nothing without /etc/slurm/slurm.conf. scripts/slurm.sh runs a munged of its
  # own, so a system one does not conflict, but one this install started is stopped again (munged
  # --stop: the one bound to the system socket; never another by its name): the machine is left with
  # no daemon it did not have.
  munge_was_up=0
  [ -S /run/munge/munge.socket.2 ] && munge_was_up=1
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing_slurm[@]}" >/dev/null
  if [ "$munge_was_up" = 0 ] && [ -S /run/munge/munge.socket.2 ]; then
    echo "setup: the munge package started the system munged; stopping it (scripts/slurm.sh runs its own)"
    $SUDO munged --stop >/dev/null 2>&1 || true
  fi
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
  "${PIP[@]}" "pytest>=7" "hypothesis==6.170.15" "torch==2.13.0" "ml_dtypes==0.6.0" "expecttest==0.3.0"
  # mpi4py from source against MPICH (about 2 minutes, once): the PyPI wheel wants another libmpi.
  if ! .venv/bin/python -c "import mpi4py" 2>/dev/null; then
    echo "setup: building mpi4py against MPICH"
    MPICC=mpicc.mpich "${PIP[@]}" --no-binary mpi4py --no-cache-dir mpi4py
  fi
fi
# The documentation site (make docs; make test builds it): Sphinx, MyST for the Markdown pages, furo, at
# the versions of pyproject.toml's docs extra.
if [ "${1:-}" = "--test" ] || [ "${1:-}" = "--docs" ]; then
  mapfile -t DOCS < <(.venv/bin/python -c 'import tomllib
print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]))')
  "${PIP[@]}" "${DOCS[@]}"
fi
# Editable, so the tests and examples run against this checkout; the C extension is built in place.
if [ "${1:-}" = "--test" ]; then source scripts/compiler.sh; fi
"${PIP[@]}" --no-build-isolation -e .
.venv/bin/python -c "import pydist, numpy; print('setup: pydist', pydist.__version__, 'ready in .venv')"
# The venvs of the other Pythons pyproject.toml claims, for make test's pythons stage (made once).
if [ "${1:-}" = "--test" ]; then scripts/test_pythons.sh --venvs; fi
# The other MPI libraries the libraries stage runs the same install on (PyPI's MPICH 5, Intel MPI, Open
# MPI 5.0; Debian's Open MPI 4.1, unpacked), each under a prefix of its own (made once).
if [ "${1:-}" = "--test" ]; then scripts/test_libraries.sh --install; fi
# Python 3.14 with MPICH 5 in a Debian unstable root, for the py314 stage (made once, cached under
# /var/cache/pydist; a few minutes and 1.4 GB).
if [ "${1:-}" = "--test" ]; then scripts/sid_root.sh up; fi
