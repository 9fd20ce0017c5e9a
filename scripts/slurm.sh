#!/usr/bin/env bash
# A real single-node Slurm on this machine, for the tests of pydist under srun/sbatch/salloc: munged,
# slurmctld and slurmd started directly (no systemd), each from files in one state folder.
#
#   scripts/slurm.sh up [--cpus N]    start munged, slurmctld, slurmd (node `hostname -s`, N CPUs, default 4,
#                                     partition debug); wait until the node is idle and `srun -n 1 true`
#                                     runs; print the state folder on stdout. Brings down a cluster left
#                                     up before. Fails (status 1, with the tail of each daemon's log) if
#                                     the node is not usable within 60 s.
#   scripts/slurm.sh env              the lines a client needs, for eval: eval "$(scripts/slurm.sh env)"
#   scripts/slurm.sh status           the daemons, the node and the queue (status 1 when none is up)
#   scripts/slurm.sh down             cancel the jobs (SIGKILL to what is left of them after 1 s), stop
#                                     the daemons (TERM, then KILL), remove the state folder
#                                     (idempotent; status 0 when nothing is up)
#
# The state folder is /run/pydist-slurm, or $PYDIST_SLURM_DIR. Needs root (slurmd runs jobs as their
# users; Debian's slurm-client, slurmd, slurmctld and munge: scripts/setup.sh --test installs them).
#
# Layout: everything is in the state folder, nothing in /etc/slurm, /etc/munge or /run/munge, so that
# the cluster neither reads nor disturbs a system Slurm or MUNGE:
#   slurm.conf                 clients find it through SLURM_CONF (what `env` prints), the daemons by -f
#   munge.key                  made fresh by each `up` (0400)
#   munge.socket(.lock)        munged's socket; Slurm finds it through AuthInfo=socket=..., which both
#                              auth/munge (every RPC) and cred/munge (job credentials) read, in the
#                              daemons and in the clients alike (no AuthAltTypes or other setting needed)
#   munged.{pid,log,seed}  slurmctld.{pid,log}  slurmd.{pid,log}
#   ctld/                      StateSaveLocation: empty at each `up`, so no job or node state carries over
#   spool/                     SlurmdSpoolDir: batch scripts, the step daemons' sockets
# The folder is root's and 0711, its files root's alone (the key 0400): munged refuses a socket, key or log in
# a folder others may write to, and a socket in a folder others cannot enter ("execute permissions for
# all required"), as every client, of any user, connects to it. Others can reach the socket by its name
# and list nothing (as with /run/munge, 0755, on a system MUNGE).
#
# slurm.conf, and why (the rest is Slurm's defaults, as on a site that sets nothing):
#   SlurmctldHost=HOST(127.0.0.1), NodeName=HOST NodeAddr=127.0.0.1
#         HOST is `hostname -s`, the name slurmd gives itself (slurmd -C); the address is fixed so that
#         nothing depends on how this machine's name resolves. slurmd is also told its name (-N).
#   CPUs=N with SlurmdParameters=config_overrides
#         N may exceed this machine's CPUs (2 here) so that 3- and 4-rank jobs run: config_overrides
#         makes slurmctld trust slurm.conf's node instead of draining a node that reports fewer CPUs
#         than configured (Slurm's "Low socket*core*thread count"; FastSchedule=2 of old). Nothing binds
#         tasks to CPUs (task/none), so oversubscribing the real CPUs is harmless.
#   SlurmctldPort=26817 SlurmdPort=26818
#         not the defaults (6817, 6818), so a system Slurm can run beside it; below Linux's ephemeral
#         range (32768-60999), so no outgoing connection can be holding them.
#   ProctrackType=proctrack/linuxproc TaskPlugin=task/none
#         no cgroups: without systemd nothing sets up or delegates a cgroup tree for slurmd, and the
#         tests need no confinement. linuxproc tracks a step's processes by parentage.
#   MpiDefault=none (Slurm's default, written out because it matters)
#         plain `srun` starts tasks without a PMI server, as on a site that sets nothing; --mpi=pmi2
#         asks for one. The tests rely on both behaviours. --mpi=pmix works too (Debian's plugin
#         dlopens libpmix.so: libpmix-dev, which setup.sh installs), for the test that pydist refuses
#         it with an MPICH that speaks PMI-1/PMI-2 only.
#   SelectType=select/cons_tres SelectTypeParameters=CR_Core
#         several jobs can share the node, one task per core, as on most sites.
#   AccountingStorageType=accounting_storage/none JobAcctGatherType=jobacct_gather/none
#   JobCompType=jobcomp/none   no slurmdbd, nothing polls the jobs' processes.
#   ReturnToService=2
#         a node that was DOWN becomes usable again as soon as its slurmd registers.
#   SchedulerParameters=batch_sched_delay=0
#         an sbatch job starts at once (0.3 s) instead of at the next batch scheduling pass (2-3 s).
#   MinJobAge=5
#         `sbatch --wait` asks slurmctld every 2 s, then every 8 s, then every 32 s unless MinJobAge/2
#         is at most 2 s (sbatch.c: it must ask before a finished job is forgotten). So a 3 s job
#         returns after 4 s, not 10, a 20 s one after 22 s, not 42. Finished jobs stay in squeue and
#         scontrol for 5 s instead of 300.
#   KillWait stays 30 s (Slurm's): a cancelled or timed-out job that ignores SIGTERM gets 30 s
#         before SIGKILL, as on a site. `down` does not wait for that (see kill_jobs).
#   SlurmUser=root SlurmdUser=root
#         no slurm user to own the state; slurmd must be root anyway to start jobs as their users.
set -euo pipefail

STATE=${PYDIST_SLURM_DIR:-/run/pydist-slurm}
CTLD_PORT=26817
SLURMD_PORT=26818
UP_DEADLINE=60      # seconds for `up` to get a usable node
STOP_WAIT=10        # seconds a daemon has to exit after SIGTERM, before SIGKILL

die() { echo "slurm.sh: $*" >&2; exit 2; }
say() { echo "slurm.sh: $*" >&2; }

# `down` removes the state folder: only an absolute path, never /, and only a folder `up` made.
[[ $STATE == /*[!/]* ]] || die "PYDIST_SLURM_DIR must be an absolute path other than / (it is '$STATE')"
STATE=${STATE%/}
MARK="# Written by scripts/slurm.sh up"
ours() { [ -z "$(ls -A "$STATE" 2>/dev/null)" ] || head -n 1 "$STATE/slurm.conf" 2>/dev/null | grep -qF "$MARK"; }

need_root() {
  [ "$(id -u)" = 0 ] || die "must run as root (slurmd starts jobs as their users); try: sudo $0 $*"
}

need_tools() {
  local t
  for t in munged mungekey slurmctld slurmd srun sinfo scancel squeue timeout hostname find; do
    command -v "$t" >/dev/null 2>&1 || die "'$t' not found (needs munge, slurmctld, slurmd and slurm-client: scripts/setup.sh --test)"
  done
}

now_ms() { local t=${EPOCHREALTIME/[.,]/}; echo $((t / 1000)); }

# alive PID: the process exists and is not a zombie (PID 1 here may be slow to reap what we kill).
alive() {
  local st
  st=$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$1/status" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ]
}

# daemon_pid NAME: the pid in $STATE/NAME.pid, if that process is alive and is NAME (Debian's binaries
# are NAME-wlm behind an alternatives link), so that a stale pid file never gets another process killed.
daemon_pid() {
  local name=$1 pid exe
  [ -r "$STATE/$name.pid" ] || return 1
  pid=$(tr -dc 0-9 < "$STATE/$name.pid")
  [ -n "$pid" ] && alive "$pid" || return 1
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
  exe=${exe##*/}; exe=${exe% (deleted)}
  [[ $exe == "$name" || $exe == "$name"-* ]] || return 1
  echo "$pid"
}

# wait_gone PID SECONDS: status 0 once PID has exited, 1 if it is still there at the deadline.
wait_gone() {
  local end=$(( $(now_ms) + $2 * 1000 ))
  while alive "$1"; do
    [ "$(now_ms)" -lt "$end" ] || return 1
    sleep 0.1
  done
}

# stop PID WHAT: SIGTERM, then SIGKILL after $STOP_WAIT s; status 1 if it outlives that too.
stop() {
  local pid=$1 what=$2
  kill -TERM "$pid" 2>/dev/null || true
  wait_gone "$pid" "$STOP_WAIT" && return 0
  say "$what (pid $pid) is still there ${STOP_WAIT} s after SIGTERM; sending SIGKILL"
  kill -KILL "$pid" 2>/dev/null || true
  wait_gone "$pid" 5 && return 0
  say "$what (pid $pid) survived SIGKILL"
  return 1
}

# Our step daemons (slurmstepd; they outlive slurmd by design): those holding a file of the state
# folder open (slurmd's log, which they write to).
stepds() {
  local exe
  for exe in $(find /proc -mindepth 2 -maxdepth 2 -path '/proc/[0-9]*/exe' -lname '*/slurmstepd*' 2>/dev/null); do
    exe=${exe%/exe}
    [ -n "$(find "$exe/fd" -lname "$STATE/*" -print -quit 2>/dev/null)" ] && echo "${exe#/proc/}"
  done
  return 0
}

# job_processes: every process under our step daemons (tasks, batch scripts and what they started).
job_processes() {
  local roots d k v p q
  roots=" $(stepds | tr '\n' ' ') "
  [ "$roots" != "  " ] || return 0
  local -A parent=()
  for d in /proc/[0-9]*; do
    while read -r k v; do
      if [ "$k" = PPid: ]; then parent[${d#/proc/}]=$v; break; fi
    done 2>/dev/null < "$d/status" || true
  done
  for p in "${!parent[@]}"; do
    q=${parent[$p]}
    while [ "${q:-0}" -gt 1 ]; do
      if [[ $roots == *" $q "* ]]; then echo "$p"; break; fi
      q=${parent[$q]:-0}
    done
  done
}

# kill_jobs: SIGKILL every process under our step daemons; they then report their steps done and exit.
kill_jobs() {
  local left pid
  left=$(job_processes)
  [ -n "$left" ] || return 0
  # shellcheck disable=SC2086   # one argument per pid
  kill -KILL $left 2>/dev/null || true
  for pid in $left; do wait_gone "$pid" 5 || true; done
}

# The lines a client of the running cluster needs (`env`); the clients, here, use them too.
client_env() {
  echo "export SLURM_CONF=$(printf %q "$STATE/slurm.conf")"
}

write_conf() {
  local node=$1 cpus=$2
  cat > "$STATE/slurm.conf" <<EOF
$MARK: a single-node cluster for pydist's tests (see that script for why).
ClusterName=pydist
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge.socket
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
PlugStackConfig=$STATE/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerParameters=batch_sched_delay=0
MinJobAge=5
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus Boards=1 SocketsPerBoard=1 CoresPerSocket=$cpus ThreadsPerCore=1 State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  # Empty: Slurm's default would be the one beside slurm.conf anyway; named so that it is never /etc's.
  : > "$STATE/plugstack.conf"
}

# up_failed WHY: say why, show the end of each daemon's log, take down what was started.
up_failed() {
  local log
  say "up failed: $1"
  for log in munged slurmctld slurmd; do
    [ -s "$STATE/$log.log" ] || continue
    echo "---- last lines of $STATE/$log.log" >&2
    tail -n 15 "$STATE/$log.log" >&2
  done
  cmd_down >/dev/null 2>&1 || true
  exit 1
}

cmd_up() {
  local cpus=4
  while [ $# -gt 0 ]; do
    case $1 in
      --cpus) [ $# -ge 2 ] || die "--cpus needs a number"; cpus=$2; shift 2 ;;
      --cpus=*) cpus=${1#--cpus=}; shift ;;
      *) die "up: unknown argument '$1' (usage: $0 up [--cpus N])" ;;
    esac
  done
  [[ $cpus =~ ^[0-9]+$ ]] && [ "$cpus" -ge 1 ] && [ "$cpus" -le 1024 ] || die "--cpus needs a number of CPUs, 1..1024"
  need_root up; need_tools
  local start node
  start=$(now_ms)
  cmd_down >/dev/null   # a cluster left up by an earlier run
  node=$(hostname -s)
  [ -n "$node" ] || die "hostname -s gives no name"

  trap 'up_failed "a command failed (line $LINENO)"' ERR
  umask 077
  mkdir -p "$STATE"
  chown root:root "$STATE"; chmod 0711 "$STATE"
  write_conf "$node" "$cpus"   # first: it marks the folder as this script's (see ours)
  mkdir -m 0700 "$STATE/ctld" "$STATE/spool"
  mungekey --create --keyfile="$STATE/munge.key" >/dev/null 2>&1 || head -c 1024 /dev/urandom > "$STATE/munge.key"
  chmod 0400 "$STATE/munge.key"

  munged --socket="$STATE/munge.socket" --key-file="$STATE/munge.key" --pid-file="$STATE/munged.pid" \
         --log-file="$STATE/munged.log" --seed-file="$STATE/munged.seed" ||
    up_failed "munged did not start"
  # munged forks once its socket listens; the other daemons authenticate through it from their start.
  local end=$(( start + UP_DEADLINE * 1000 ))
  until [ -S "$STATE/munge.socket" ] && daemon_pid munged >/dev/null; do
    [ "$(now_ms)" -lt "$end" ] || up_failed "munged's socket did not appear"
    sleep 0.05
  done
  slurmctld -f "$STATE/slurm.conf" || up_failed "slurmctld did not start"
  slurmd -f "$STATE/slurm.conf" -N "$node" || up_failed "slurmd did not start"

  # Until the node is idle: it starts UNKNOWN and turns IDLE when slurmd registers (a second or so).
  export SLURM_CONF="$STATE/slurm.conf"
  local st="" d
  while :; do
    # A daemon writes its pid file after it forks, which a busy machine can delay past the first
    # look: only a pid file whose process is gone means the daemon exited.
    for d in slurmctld slurmd; do
      [ ! -s "$STATE/$d.pid" ] || daemon_pid "$d" >/dev/null || up_failed "$d exited"
    done
    st=$(timeout 5 sinfo -h -n "$node" -o %T 2>/dev/null || true)
    [ "$st" = idle ] && break
    [ "$(now_ms)" -lt "$end" ] || up_failed "node $node is not idle after ${UP_DEADLINE} s (state: ${st:-no answer from slurmctld})"
    sleep 0.2
  done
  # ... and a job step runs end to end (credential, slurmstepd, I/O back to srun).
  local left=$(( (end - $(now_ms)) / 1000 ))
  [ "$left" -ge 1 ] || left=1
  local out
  out=$(timeout -k 2 "$left" srun -n 1 -t 1 true 2>&1) || up_failed "srun -n 1 true failed: $out"
  trap - ERR
  local ms=$(( $(now_ms) - start ))
  say "up: node $node, $cpus CPUs, partition debug, ports $CTLD_PORT/$SLURMD_PORT, in $((ms / 1000)).$(printf %03d $((ms % 1000))) s; for clients: eval \"\$($0 env)\""
  echo "$STATE"
}

cmd_env() {
  daemon_pid slurmctld >/dev/null || { say "no slurm cluster is up (state: $STATE); run: $0 up"; exit 1; }
  client_env
}

cmd_status() {
  local name pid any=0
  for name in munged slurmctld slurmd; do
    if pid=$(daemon_pid "$name"); then echo "$name: running, pid $pid"; any=1; else echo "$name: not running"; fi
  done
  if [ "$any" = 0 ]; then echo "no slurm cluster is up (state: $STATE)"; return 1; fi
  echo "state: $STATE"
  if daemon_pid slurmctld >/dev/null; then
    eval "$(client_env)"
    timeout 5 sinfo -N -o '%N %T %c %P' || true
    timeout 5 squeue || true
  fi
  return 0
}

cmd_down() {
  local rc=0 pid name
  if [ ! -e "$STATE" ]; then echo "slurm down (nothing was up)"; return 0; fi
  ours || die "$STATE is not a state folder of this script (no slurm.conf of its own): not touching it"
  # The jobs first, while slurmctld and slurmd run, so that a waiting srun, salloc or `sbatch --wait`
  # hears that its job ended (without slurmctld, sbatch --wait retries forever): cancel them all, then
  # SIGKILL what is left of them (Slurm itself gives a job that ignores SIGTERM KillWait, 30 s; slurmd
  # would not exit before) and wait, within a deadline, until the queue is empty.
  if daemon_pid slurmctld >/dev/null && daemon_pid munged >/dev/null; then
    (
      eval "$(client_env)"
      queue() { timeout 5 squeue -h -o %i 2>/dev/null || true; }   # pending, running, completing
      ids=$(queue)
      [ -n "$ids" ] || exit 0
      # shellcheck disable=SC2086   # one argument per job id
      timeout 5 scancel $ids 2>/dev/null || true
      end=$(( $(now_ms) + 1000 ))   # a second for jobs that end on SIGTERM, as Slurm means them to
      while [ -n "$(queue)" ] && [ "$(now_ms)" -lt "$end" ]; do sleep 0.1; done
      kill_jobs
      end=$(( $(now_ms) + STOP_WAIT * 1000 ))
      while [ -n "$(queue)" ] && [ "$(now_ms)" -lt "$end" ]; do sleep 0.1; done
      sleep 2.5   # `sbatch --wait` asks every 2 s (MinJobAge=5): let it ask once more and exit
    )
  fi
  kill_jobs   # if slurmctld was gone: step daemons left by an earlier, interrupted run
  # slurmd before slurmctld (it would only retry to reach it), munged last (both talk through it).
  for name in slurmd slurmctld munged; do
    if pid=$(daemon_pid "$name"); then stop "$pid" "$name" || rc=1; fi
  done
  for pid in $(stepds); do stop "$pid" "slurmstepd" || rc=1; done
  if [ "$rc" != 0 ]; then say "down: something survived SIGKILL; the state folder $STATE is kept"; return 1; fi
  rm -rf "$STATE"
  echo "slurm down"
}

main() {
  local cmd=${1:-}
  [ $# -gt 0 ] && shift
  case $cmd in
    up) cmd_up "$@" ;;
    env) cmd_env ;;
    status) cmd_status ;;
    down) need_root down; cmd_down ;;
    *) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
}
main "$@"
