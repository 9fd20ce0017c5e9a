#!/usr/bin/env bash
# Build the fault probe against two MPICHs and run the whole matrix.
#   MPICH 4.0.2 (Debian, ch4:ucx): mpicc.mpich / mpiexec.mpich
#   MPICH 5.0.2 (PyPI wheel "mpich") in a scratch venv (default /tmp/mpich5)
# Every mpiexec is wrapped in `timeout -k 3 30`; leftover processes of each run
# (its own mpiexec/proxy/probe pids only) are SIGKILLed afterwards.
# Usage: benchmarks/fault_probe/run.sh [filter-regex-on-case-name]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${PROBE_OUT:-/tmp/fault_probe_out}
M5=${MPICH5_PREFIX:-/tmp/mpich5}
FILTER=${1:-.}
mkdir -p "$OUT/logs"

if [ ! -x "$M5/bin/mpicc" ]; then
  python3.11 -m venv "$M5" && "$M5/bin/pip" install -q mpich || { echo "cannot install PyPI mpich"; exit 1; }
fi
mpicc.mpich   -O1 -g -Wall -o "$OUT/probe4" "$HERE/probe.c" -lpthread || exit 1
"$M5/bin/mpicc" -O1 -g -Wall -o "$OUT/probe5" "$HERE/probe.c" -lpthread || exit 1
# make sure each binary loads its own libmpi (RUNPATH of probe5 must win)
unset LD_LIBRARY_PATH
echo "probe4 -> $(ldd "$OUT/probe4" | grep -o 'libmpi[^ ]* => [^ ]*')"
echo "probe5 -> $(ldd "$OUT/probe5" | grep -o 'libmpi[^ ]* => [^ ]*')"

descendants() { local p=$1 c; for c in $(ps -o pid= --ppid "$p" 2>/dev/null); do echo "$c"; descendants "$c"; done; }

# run_case NAME MPI(4|5) NP MODE STEPS [ENV=VAL ...]   (AUTOCLEAN=1: omit -disable-auto-cleanup)
run_case() {
  local name=$1 mpi=$2 np=$3 mode=$4 steps=$5; shift 5
  [[ "$name" =~ $FILTER ]] || return 0
  local envs=("$@") hflag=-disable-auto-cleanup
  [[ " ${envs[*]} " == *" AUTOCLEAN=1 "* ]] && hflag=""
  local mpiexec bin
  if [ "$mpi" = 4 ]; then mpiexec=mpiexec.mpich; bin=$OUT/probe4; else mpiexec=$M5/bin/mpiexec; bin=$OUT/probe5; fi
  local log=$OUT/logs/$name.log
  local cmd="env ${envs[*]} timeout -k 3 30 $mpiexec $hflag -n $np $bin $mode $steps"
  echo "=== $name: $cmd" | tee "$log"
  local t0=$(date +%s.%N)
  env "${envs[@]}" timeout -k 3 30 "$mpiexec" $hflag -n "$np" "$bin" "$mode" "$steps" >>"$log" 2>&1 &
  local top=$! pids=""
  while kill -0 "$top" 2>/dev/null; do pids="$pids $(descendants "$top")"; sleep 0.3; done
  wait "$top"; local rc=$?
  local t1=$(date +%s.%N)
  printf 'MPIEXEC_EXIT rc=%d wall=%.1fs\n' "$rc" "$(echo "$t1 - $t0" | bc)" >>"$log"
  # leftovers: only pids that belonged to this run
  local left=""
  for p in $(echo $pids | tr ' ' '\n' | sort -u); do
    if kill -0 "$p" 2>/dev/null; then left="$left $p"; kill -9 "$p" 2>/dev/null; fi
  done
  [ -n "$left" ] && echo "LEFTOVER processes killed after mpiexec exit:$left" >>"$log"
  tail -n 1 "$log"
  sleep 1
}

SH=""                                      # default: ch4 POSIX shm between local ranks
UCX_ALL="MPIR_CVAR_NOLOCAL=1"              # all traffic through the UCX netmod (UCX picks shm/cma)
UCX_TCP="MPIR_CVAR_NOLOCAL=1 UCX_TLS=tcp,self"  # all traffic through UCX over TCP sockets

for mpi in 4 5; do
  run_case "m${mpi}_control_n3"           $mpi 3 none acf
  for mode in exit kill; do
    run_case "m${mpi}_shm_${mode}_n3"     $mpi 3 $mode bsacf
    run_case "m${mpi}_ucxshm_${mode}_n3"  $mpi 3 $mode bsacf $UCX_ALL
    run_case "m${mpi}_ucxtcp_${mode}_n3"  $mpi 3 $mode bsacf $UCX_TCP
    run_case "m${mpi}_shm_${mode}_n4"     $mpi 4 $mode bsacf
  done
  # survivors with SIGUSR1 left at its default disposition (terminate)
  run_case "m${mpi}_shm_exit_n3_nosig"    $mpi 3 exit bsacf PROBE_NOSIG=1
  # without -disable-auto-cleanup (hydra default) for contrast
  run_case "m${mpi}_shm_exit_n3_autoclean" $mpi 3 exit bsacf AUTOCLEAN=1
done
# survivors that never address the dead rank (no step s): MPICH 5 over UCX/TCP segfaults in step s
run_case "m5_ucxtcp_exit_n3_nos"          5 3 exit bacf $UCX_TCP
run_case "m4_ucxtcp_exit_n3_nos"          4 3 exit bacf $UCX_TCP
# no operation ever addressed to the dead rank after init (is the finalize hang due to pending requests?)
run_case "m4_shm_exit_n3_clean"           4 3 exit acf
run_case "m5_shm_exit_n3_clean"           5 3 exit acf
# MPICH 5 with fault tolerance enabled (MPIX_ ULFM-style calls in step x)
run_case "m5_ofi_exit_n3"                  5 3 exit bsacf MPIR_CVAR_CH4_NETMOD=ofi
for mode in exit kill; do
  run_case "m5ft_shm_${mode}_n3"          5 3 $mode bsaxcf MPIR_CVAR_ENABLE_FT=1
  run_case "m5ft_ucxtcp_${mode}_n3"       5 3 $mode bsaxcf MPIR_CVAR_ENABLE_FT=1 $UCX_TCP
  run_case "m5ft_ofi_${mode}_n3"          5 3 $mode bsaxcf MPIR_CVAR_ENABLE_FT=1 MPIR_CVAR_CH4_NETMOD=ofi
done

python3 "$HERE/summarize.py" "$OUT/logs"
