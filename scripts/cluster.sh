#!/usr/bin/env bash
# A simulated cluster on one machine: N "hosts" that are Linux network namespaces, each with its own
# address on a bridged link that tc can shape, and MPICH's launcher told to start ranks inside them.
#
#   scripts/cluster.sh up N [--rate RATE]      hosts pdh1..pdhN (10.77.0.1..N) on bridge pdbr0 (10.77.0.254),
#                                              which lives with mpiexec in a switch namespace, pdsw
#   scripts/cluster.sh rate RATE|none          re-shape every link of the running cluster
#   scripts/cluster.sh run -n R [--ppn K] [--timeout S] -- CMD ARGS...
#                                              mpiexec.mpich across the hosts (round robin, or K per host)
#   scripts/cluster.sh mpiexec [--timeout S]   print the mpiexec command `run` uses, without hosts and ranks:
#                                              python -m pydist.run --mpiexec "$(scripts/cluster.sh mpiexec)"
#                                              --hosts pdh1,pdh2,pdh3 -n 3 -- ...
#   scripts/cluster.sh link HOST down|up       unplug HOST's cable (or plug it back): it stops answering
#   scripts/cluster.sh status                  hosts, addresses, rate, and each link's byte counters
#   scripts/cluster.sh down                    remove everything `up` made (idempotent)
#
# RATE is tc's: 100mbit, 1gbit, 10gbit, 500kbit... Each host's link is shaped in both directions
# (token bucket filter on its own end and on the bridge's end), so a host sends and receives at RATE
# at most, like a machine with a RATE network card on a switch.
#
# Layout: host i is namespace pdh<i>; its interface eth0 (10.77.0.i/24) is one end of a veth pair
# whose other end, pdv<i>, is a port of the bridge pdbr0 in the namespace pdsw, the switch. mpiexec
# runs in the switch too (`ip netns exec pdsw`), where the bridge's address is its own. Nothing is
# added to or taken from the root namespace's interfaces: an MPI job starting there while a cluster
# comes up or goes down would otherwise see an interface vanish as UCX opens it, and fail in
# MPI_Init ("init_worker No such device"; stop 53's CI, a test beside the cluster tests). The state
# lives in /run/pydist-cluster (hostfile, the launcher wrapper, the finalize guard, the rate);
# /etc/netns/pdh<i>/ holds the hosts and resolv.conf files that `ip netns exec` mounts over /etc's
# inside host i.
#
# What `run` passes to mpiexec, and why (each was needed; see README "Several hosts"):
#   ip netns exec pdsw
#         mpiexec in the switch namespace: the hosts reach it at the bridge's address.
#   -launcher ssh -launcher-exec $STATE/launch
#         hydra calls the wrapper exactly as it would call ssh: `launch -x HOST "/usr/bin/hydra_pmi_proxy"
#         --control-port vm:PORT ...` (MPICH 4.0.2). The wrapper runs the command, as the remote shell
#         would, inside HOST's network namespace with its own hostname (unshare --uts), so that each
#         host has its own name as a real machine does (torch's rendezvous compares hostnames).
#   -iface pdbr0
#         the proxies connect back to mpiexec's control port; by default hydra names it by this
#         machine's hostname, which this machine's /etc/hosts maps to 127.0.0.1: inside a host, its
#         own loopback.
#         -iface makes it the bridge's address, reachable from every host.
#   -hosts pdh1,...,pdhN
#         one hydra proxy per host, so MPICH's node map (hence MPI_Comm_split_type(SHARED), hence
#         pydist's shared-memory paths) has one node per host.
#   UCX_NET_DEVICES=eth0
#         the hosts' only network device besides lo, named here as a real cluster names its interface.
#   UCX_TLS left to UCX: shared memory within a host, TCP between hosts. UCX judges "same machine" for
#         shared memory by the boot id and the IPC namespace; every namespace host shares the boot id,
#         so the wrapper gives each host its own IPC namespace too (unshare --ipc), or UCX would join
#         ranks on different hosts through shared memory and never touch the link.
#   LD_PRELOAD=$STATE/finalize_guard.so (scripts/cluster_finalize_guard.c, built by `up`)
#         MPI_Finalize hangs in one job in four to six at 2 ranks (one in three at 3) with UCX over
#         TCP (a UCX bug, see that file);
#         the guard ends a rank whose MPI_Finalize has not returned after 5 s, with status 0.
#         PYDIST_CLUSTER_FINALIZE_GUARD=S sets the seconds, 0 turns it off.
#   MPIEXEC_TIMEOUT=S (--timeout, default 300)
#         hydra kills the whole job after S seconds: a hang becomes a failure, exit status non-zero.
#
# `mpiexec` prints the same as one line for another program to start jobs with (python -m pydist.run,
# whose --mpiexec takes it and adds -hosts, -n, the program and its environment to each job it starts):
#   env MPIEXEC_TIMEOUT=S UCX_ERROR_SIGNALS= UCX_NET_DEVICES=eth0 ip netns exec pdsw mpiexec.mpich
#       -launcher ssh -launcher-exec $STATE/launch -iface pdbr0 -genv LD_PRELOAD $STATE/finalize_guard.so
# MPIEXEC_TIMEOUT then bounds each job that program starts (pydist.run: each attempt and each host probe).
# Without `run`'s outer `timeout`: a program that gives up on a job kills mpiexec itself, not a wrapper.
#
# `link HOST down` sets the bridge's end of HOST's cable (pdv<i>, in pdsw) down; HOST's eth0 then has no carrier
# and every packet to or from it is lost, as when a machine drops off the network; its processes go on.
# Seen with MPICH 4.0.2's hydra: mpiexec never learns that a host has dropped off. A job started on it
# waits until MPIEXEC_TIMEOUT (the host's proxy cannot connect back, "No route to host", and exits
# unheard), and so does a running job whose ranks there die as its link goes down (the proxy's report is
# lost with the link; the other ranks wait in their collective). Ranks that die while the link is up end
# the job within a second.
set -euo pipefail

STATE=/run/pydist-cluster
PREFIX=pdh          # namespace (host) names: pdh1, pdh2, ...
SWITCH=pdsw         # the namespace of the bridge, its ports and mpiexec
VETH=pdv            # bridge-side veth ends: pdv1, pdv2, ... (in $SWITCH)
BRIDGE=pdbr0
NET=10.77.0
BRIDGE_ADDR=$NET.254
MAX_HOSTS=200

die() { echo "cluster.sh: $*" >&2; exit 2; }

need_root() {
  [ "$(id -u)" = 0 ] || die "must run as root (it creates network namespaces and links); try: sudo $0 $*"
}

need_tools() {
  local t
  for t in ip tc unshare hostname mpiexec.mpich timeout; do
    command -v "$t" >/dev/null 2>&1 || die "'$t' not found (needs iproute2, util-linux, MPICH and coreutils)"
  done
}

# tc rate (100mbit, 1gbit, 2.5gbit, 500kbit, 1000000bit) -> bits per second; dies on anything else.
rate_bits() {
  local r=${1,,} n unit
  [[ $r =~ ^([0-9]+(\.[0-9]+)?)([kmgt]?)bit$ ]] || die "rate '$1' is not understood; give it as tc does: 100mbit, 1gbit, 10gbit, 500kbit"
  n=${BASH_REMATCH[1]}; unit=${BASH_REMATCH[3]}
  awk -v n="$n" -v u="$unit" 'BEGIN { m = (u == "k") ? 1e3 : (u == "m") ? 1e6 : (u == "g") ? 1e9 : (u == "t") ? 1e12 : 1;
                                       printf "%.0f\n", n * m }'
}

hosts_up() { [ -f "$STATE/hosts" ] && cat "$STATE/hosts" || echo 0; }

# shape DEV [NETNS] RATE|none: a token bucket on DEV's egress, or none. The bucket holds 2 ms of traffic
# (at least 64 KiB, so that one 64 KiB GSO segment of the veth passes whole) and the queue 50 ms, so
# that TCP fills the link rather than backing off from drops.
shape() {
  local dev=$1 ns=$2 rate=$3 bits burst
  local ipn=(ip); [ -n "$ns" ] && ipn=(ip -n "$ns")
  local tcn=(tc); [ -n "$ns" ] && tcn=(tc -n "$ns")
  if [ "$rate" = none ]; then
    "${tcn[@]}" qdisc del dev "$dev" root 2>/dev/null || true
    return 0
  fi
  bits=$(rate_bits "$rate")
  burst=$(( bits / 8 / 500 )); [ "$burst" -lt 65536 ] && burst=65536
  "${tcn[@]}" qdisc replace dev "$dev" root tbf rate "$bits"bit burst "$burst" latency 50ms
}

cmd_up() {
  local n=${1:-} rate=none
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le $MAX_HOSTS ] || die "usage: $0 up N [--rate RATE] (N hosts, 1..$MAX_HOSTS)"
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      --rate) [ $# -ge 2 ] || die "--rate needs a value (e.g. 1gbit)"; rate=$2; shift 2 ;;
      --rate=*) rate=${1#--rate=}; shift ;;
      *) die "up: unknown argument '$1'" ;;
    esac
  done
  [ "$rate" = none ] || rate_bits "$rate" >/dev/null
  need_root up; need_tools
  if [ -e "$STATE" ] || ip link show "$BRIDGE" >/dev/null 2>&1 || ip netns list | grep -qE "^($PREFIX[0-9]|$SWITCH\b)"; then
    die "a cluster is already up (or left over); run: $0 down"
  fi
  # What the kernel must offer, tried once inside a scratch namespace before anything is kept.
  local probe=pdprobe$$
  ip netns add "$probe" 2>/dev/null || die "cannot create a network namespace (ip netns add failed: no CONFIG_NET_NS, or no permission)"
  if ! ip -n "$probe" link add "${VETH}probe" type veth peer name eth0 2>/dev/null; then
    ip netns del "$probe"; die "cannot create a veth pair (kernel without CONFIG_VETH?)"
  fi
  if ! tc -n "$probe" qdisc replace dev "${VETH}probe" root tbf rate 1gbit burst 65536 latency 50ms 2>/dev/null; then
    ip netns del "$probe"; die "cannot add a tbf qdisc (kernel without CONFIG_NET_SCH_TBF?)"
  fi
  if ! ip -n "$probe" link add "$BRIDGE" type bridge 2>/dev/null; then
    ip netns del "$probe"; die "cannot create a bridge (kernel without CONFIG_BRIDGE?)"
  fi
  ip netns del "$probe"   # takes its links with it

  trap 'echo "cluster.sh: up failed; removing what it made" >&2; cmd_down >/dev/null 2>&1' ERR
  mkdir -p "$STATE"
  ip netns add "$SWITCH"
  ip -n "$SWITCH" link set lo up
  ip -n "$SWITCH" link add "$BRIDGE" type bridge
  ip -n "$SWITCH" addr add "$BRIDGE_ADDR/24" dev "$BRIDGE"
  ip -n "$SWITCH" link set "$BRIDGE" up
  local i here
  here=$(hostname)
  for ((i = 1; i <= n; i++)); do
    ip netns add "$PREFIX$i"
    ip -n "$SWITCH" link add "$VETH$i" type veth peer name eth0 netns "$PREFIX$i"
    ip -n "$SWITCH" link set "$VETH$i" master "$BRIDGE" up
    ip -n "$PREFIX$i" addr add "$NET.$i/24" dev eth0
    ip -n "$PREFIX$i" link set lo up
    ip -n "$PREFIX$i" link set eth0 up
    ip -n "$PREFIX$i" route add default via "$BRIDGE_ADDR"
    shape eth0 "$PREFIX$i" "$rate"
    shape "$VETH$i" "$SWITCH" "$rate"
  done
  # Names inside the hosts: every host, and this machine as the bridge's address.
  for ((i = 1; i <= n; i++)); do
    mkdir -p "/etc/netns/$PREFIX$i"
    {
      echo "127.0.0.1 localhost"
      echo "$BRIDGE_ADDR $here"
      for ((j = 1; j <= n; j++)); do echo "$NET.$j $PREFIX$j"; done
    } > "/etc/netns/$PREFIX$i/hosts"
    # No DNS server is reachable from a host: without this, every lookup of a name that /etc/hosts
    # does not answer fully (getaddrinfo's IPv6 query; torch's rendezvous makes several) waits 10 s.
    # With no nameserver line glibc asks 127.0.0.1, which refuses at once.
    echo "# a simulated host of scripts/cluster.sh: no DNS, names are in /etc/hosts" > "/etc/netns/$PREFIX$i/resolv.conf"
  done
  for ((i = 1; i <= n; i++)); do echo "$PREFIX$i"; done > "$STATE/hostfile"
  echo "$n" > "$STATE/hosts"
  echo "$rate" > "$STATE/rate"
  # The launcher wrapper: what hydra runs instead of ssh.
  cat > "$STATE/launch" <<'EOF'
#!/usr/bin/env bash
# hydra's ssh launcher calls: launch -x HOST "/usr/bin/hydra_pmi_proxy" --control-port HOST:PORT ...
# (the proxy's path in literal quotes, for the remote shell). Run that command line as a remote shell
# would, inside HOST's network namespace, under HOST as hostname, in an IPC namespace of its own
# (UCX then sees another machine: no shared memory between hosts).
while [ "${1:-}" = -x ] || [ "${1:-}" = -q ]; do shift; done
host=$1; shift
case $host in pdh[0-9]*) ;; *) echo "cluster launch: '$host' is not a host of this cluster" >&2; exit 255 ;; esac
exec ip netns exec "$host" unshare --uts --ipc -- /bin/sh -c 'hostname "$1" && exec /bin/bash -c "$2"' sh "$host" "$*"
EOF
  chmod +x "$STATE/launch"
  local here_dir
  here_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  if ! cc -shared -fPIC -O2 -o "$STATE/finalize_guard.so" "$here_dir/cluster_finalize_guard.c" -ldl -lpthread 2>/dev/null; then
    echo "cluster.sh: warning: no C compiler; jobs run without the finalize guard (a rare hang at exit then waits for --timeout)" >&2
  fi
  trap - ERR
  echo "cluster up: $n host(s) $PREFIX""1..$PREFIX$n at $NET.1..$NET.$n, bridge $BRIDGE $BRIDGE_ADDR, rate $rate"
}

cmd_rate() {
  local rate=${1:-} n i
  [ -n "$rate" ] || die "usage: $0 rate RATE|none"
  [ "$rate" = none ] || rate_bits "$rate" >/dev/null
  need_root rate
  n=$(hosts_up); [ "$n" -ge 1 ] || die "no cluster is up; run: $0 up N"
  for ((i = 1; i <= n; i++)); do
    shape eth0 "$PREFIX$i" "$rate"
    shape "$VETH$i" "$SWITCH" "$rate"
  done
  echo "$rate" > "$STATE/rate"
  echo "cluster rate: $rate"
}

cmd_status() {
  local n i
  n=$(hosts_up)
  if [ "$n" -lt 1 ]; then echo "no cluster is up"; return 1; fi
  echo "hosts: $n   bridge: $BRIDGE $BRIDGE_ADDR   rate: $(cat "$STATE/rate")   state: $STATE"
  for ((i = 1; i <= n; i++)); do
    local stats
    stats=$(ip -n "$PREFIX$i" -s link show eth0 2>/dev/null | awk 'f == 1 { rx = $1 } f == 2 { tx = $1 } { f = 0 } /RX:/ { f = 1 } /TX:/ { f = 2 } END { printf "rx %s B, tx %s B", rx, tx }')
    # a cable unplugged by `link HOST down` (the bridge's end of it is down)
    ip -n "$SWITCH" link show "$VETH$i" 2>/dev/null | grep -q "state DOWN" && stats+=", link down"
    printf '  %s  %s.%d  %s\n' "$PREFIX$i" "$NET" "$i" "$stats"
  done
}

# MPIEXEC=(mpiexec.mpich and the options of every job across the hosts) and the variables mpiexec needs
# in its own environment (MPIEXEC_ENV, NAME=VALUE each), as `run` and `mpiexec` use them.
mpiexec_line() {
  local tmo=$1
  MPIEXEC_ENV=("MPIEXEC_TIMEOUT=$tmo" "UCX_ERROR_SIGNALS=${UCX_ERROR_SIGNALS-}"
               "UCX_NET_DEVICES=${UCX_NET_DEVICES:-eth0}")
  MPIEXEC=(ip netns exec "$SWITCH" mpiexec.mpich -launcher ssh -launcher-exec "$STATE/launch" -iface "$BRIDGE")
  if [ -f "$STATE/finalize_guard.so" ] && [ "${PYDIST_CLUSTER_FINALIZE_GUARD:-5}" != 0 ]; then
    MPIEXEC+=(-genv LD_PRELOAD "${LD_PRELOAD:+$LD_PRELOAD }$STATE/finalize_guard.so")
  fi
}

cmd_mpiexec() {
  local tmo=300
  while [ $# -gt 0 ]; do
    case $1 in
      --timeout) [ $# -ge 2 ] || die "mpiexec: --timeout needs whole seconds >= 1"; tmo=$2; shift 2 ;;
      *) die "mpiexec: unknown argument '$1' (usage: $0 mpiexec [--timeout S])" ;;
    esac
  done
  [[ $tmo =~ ^[0-9]+$ ]] && [ "$tmo" -ge 1 ] || die "mpiexec: --timeout needs whole seconds >= 1"
  [ "$(hosts_up)" -ge 1 ] || die "no cluster is up; run: $0 up N"
  mpiexec_line "$tmo"
  local line
  line=$(printf '%q ' env "${MPIEXEC_ENV[@]}" "${MPIEXEC[@]}")   # quoted for a shell (or shlex.split)
  echo "${line% }"
}

cmd_link() {
  local host=${1:-} state=${2:-} n
  [ $# -eq 2 ] && [[ $state == up || $state == down ]] || die "usage: $0 link HOST down|up"
  need_root link
  n=$(hosts_up); [ "$n" -ge 1 ] || die "no cluster is up; run: $0 up N"
  [[ $host =~ ^$PREFIX([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -ge 1 ] && [ "${BASH_REMATCH[1]}" -le "$n" ] ||
    die "link: '$host' is not a host of this cluster ($PREFIX""1..$PREFIX$n)"
  ip -n "$SWITCH" link set "$VETH${BASH_REMATCH[1]}" "$state"
  echo "cluster link: $host $state"
}

cmd_run() {
  local n="" ppn="" tmo=300
  while [ $# -gt 0 ]; do
    case $1 in
      -n) n=${2:-}; shift 2 ;;
      --ppn) ppn=${2:-}; shift 2 ;;
      --timeout) tmo=${2:-}; shift 2 ;;
      --) shift; break ;;
      *) die "run: unknown argument '$1' (usage: $0 run -n R [--ppn K] [--timeout S] -- CMD ARGS...)" ;;
    esac
  done
  [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] || die "run: -n needs a number of ranks >= 1"
  [ -z "$ppn" ] || [[ $ppn =~ ^[0-9]+$ && $ppn -ge 1 ]] || die "run: --ppn needs a number >= 1"
  [[ $tmo =~ ^[0-9]+$ ]] && [ "$tmo" -ge 1 ] || die "run: --timeout needs whole seconds >= 1"
  [ $# -ge 1 ] || die "run: no command given after --"
  need_root run
  local hosts
  hosts=$(hosts_up); [ "$hosts" -ge 1 ] || die "no cluster is up; run: $0 up N"
  local list="" i
  for ((i = 1; i <= hosts; i++)); do list+="${list:+,}$PREFIX$i"; done
  local place=(-hosts "$list")
  [ -n "$ppn" ] && place+=(-ppn "$ppn")
  mpiexec_line "$tmo"
  export "${MPIEXEC_ENV[@]}"
  # hydra kills the job at MPIEXEC_TIMEOUT; the outer timeout is for hydra itself hanging.
  local rc=0
  timeout -k 10 $((tmo + 30)) "${MPIEXEC[@]}" "${place[@]}" -n "$n" "$@" || rc=$?
  return $rc
}

cmd_down() {
  local ns i
  # Whatever still runs in our hosts (a job killed mid-way leaves its ranks and proxies there) holds
  # the namespace, and with it the veth, alive after `ip netns del`: end those processes first.
  for ns in $(ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E "^($PREFIX[0-9]+|$SWITCH)$" || true); do
    local pids
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  # the bridge and its ports in the root namespace, as an older cluster.sh made them
  for i in $(ip -o link show 2>/dev/null | awk -F': ' '{ print $2 }' | sed 's/@.*//' | grep -E "^$VETH[0-9]+$" || true); do
    ip link del "$i" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  rm -rf /etc/netns/"$PREFIX"[0-9]* "$STATE"
  rmdir /etc/netns 2>/dev/null || true   # `up` made it; kept if anything else lives there
  echo "cluster down"
}

main() {
  local cmd=${1:-}
  [ $# -gt 0 ] && shift
  case $cmd in
    up) cmd_up "$@" ;;
    rate) cmd_rate "$@" ;;
    run) cmd_run "$@" ;;
    mpiexec) cmd_mpiexec "$@" ;;
    link) cmd_link "$@" ;;
    status) cmd_status ;;
    down) need_root down; cmd_down ;;
    *) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
  esac
}
main "$@"
