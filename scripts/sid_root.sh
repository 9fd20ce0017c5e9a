#!/usr/bin/env bash
# A Debian unstable (sid) root with CPython 3.14 and sid's own MPICH 5, for make test's py314 stage and
# make wheel's 3.14 wheel: the newest Python on the newest Debian, as a researcher on a rolling
# distribution has it, on a machine whose own Debian ships 3.11. Made once with debootstrap, cached
# outside the checkout (so every clone reuses it), and entered with chroot.
#
#   scripts/sid_root.sh up      make the root, or reuse it if its stamp matches the recipe below
#   scripts/sid_root.sh run [--bind SRC:DST | --ro-bind SRC:DST]... -- CMD...
#                               CMD inside the root, as root, with SRC (a folder or a file of this
#                               machine) at DST (an absolute path in the root); its exit status is CMD's
#   scripts/sid_root.sh path    print where the root is
#   scripts/sid_root.sh python  print the root's Python version (3.14)
#
# The root is ${PYDIST_SID_ROOT:-/var/cache/pydist/sid-root}. In it: python3.14 (with its headers),
# MPICH 5 (mpicc, mpiexec), gcc, ccache, OpenBLAS and zlib headers, and /v, a 3.14 venv with numpy, pytest
# and hypothesis. `up` builds a new root beside the old one and renames it into place once its stamp is
# written, so an interrupted set-up never leaves a half root that looks done. A lock beside the root
# ($ROOT.lock) keeps `up` from replacing a root that a `run` is using (a clone whose recipe differs, a
# second make test): `run` holds it shared, a rebuild exclusive, and each waits for the other, saying so.
#
# `run` works in a mount namespace of its own (unshare): /proc, /sys, /dev, a fresh /dev/shm (MPICH's
# and UCX's shared memory) and the binds vanish with it, however it ends. CMD starts with a clean
# environment (PATH, HOME=/root, LANG) plus this machine's PIP_* variables. At each run, what may have
# changed on this machine is copied in: DNS (resolv.conf, hosts), the CA bundle (PyPI goes through a
# proxy whose CA it holds) and pip's configuration files, with the local package folders that
# configuration names bound read-only at the same paths, so pip in the root finds what this machine's
# pip finds. Nothing is written through a link planted in the root.
set -euo pipefail
ROOT=${PYDIST_SID_ROOT:-/var/cache/pydist/sid-root}
MIRROR=${PYDIST_SID_MIRROR:-http://deb.debian.org/debian}
PYTHON=3.14   # (scripts/test_pythons.sh leaves it to the py314 stage where this machine has none)
PACKAGES=(python$PYTHON python$PYTHON-venv python$PYTHON-dev mpich libmpich-dev gcc libc6-dev pkg-config
          libopenblas-dev zlib1g-dev ca-certificates ccache)
PIP_PACKAGES=("setuptools>=70" wheel numpy "pytest>=7" "hypothesis==6.170.15")   # scripts/setup.sh's pins
RECIPE="pydist sid root 2: ${PACKAGES[*]} | ${PIP_PACKAGES[*]}"
STAMP=.pydist-sid-root   # in the root: the recipe it was made from, written last
LOCK=$ROOT.lock
CA=/etc/ssl/certs/ca-certificates.crt
CHROOT_ENV=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
            DEBIAN_FRONTEND=noninteractive PIP_CERT=$CA SSL_CERT_FILE=$CA PIP_DISABLE_PIP_VERSION_CHECK=1
            PIP_DEFAULT_TIMEOUT=180 PYTHONDONTWRITEBYTECODE=1)

die() { echo "sid_root.sh: $*" >&2; exit 1; }

# lock -s|-x: the root's lock on fd 9, shared or exclusive, held until this script exits.
lock() {
  mkdir -p "$(dirname "$LOCK")"
  [ ! -L "$LOCK" ] || die "$LOCK is a link; refusing to open it"
  exec 9>>"$LOCK"
  if ! flock -n "$1" 9; then
    echo "sid root: waiting for $([ "$1" = -s ] && echo "a set-up" || echo "its users") to finish ($LOCK)" >&2
    flock "$1" 9
  fi
}

# safe_dir ROOT DIR: make ROOT/DIR, refusing any folder on the way that is a link (a root's files are
# not ours to trust: a link there would lead a write or a mount out of the root).
safe_dir() {
  local d=$1 part
  for part in ${2//\// }; do
    d=$d/$part
    [ ! -L "$d" ] || die "$d is a link; refusing to write through it"
    [ -d "$d" ] || mkdir "$d"
  done
}

# copy_in ROOT HOSTFILE [DEST]: the host's file to DEST (default: the same path) in ROOT, by a temporary
# file and a rename in that folder, so a link planted at DEST is replaced, never followed.
copy_in() {
  local root=$1 file=$2 dest=${3:-$2} tmp
  safe_dir "$root" "$(dirname "$dest")"
  tmp=$(mktemp "$root$(dirname "$dest")/.pydist.XXXXXX")
  cat "$file" > "$tmp"
  chmod 644 "$tmp"
  mv -fT "$tmp" "$root$dest"
}

# pip_config ROOT: this machine's pip configuration files into ROOT (or removed from it, where this
# machine has none now), and the files and folders they or the PIP_* variables name (constraints,
# find-links folders, file:// indexes) printed one a line, for run to bind read-only.
pip_config() {
  local root=$1 host dest v
  for host in /etc/pip.conf /etc/xdg/pip/pip.conf "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf"; do
    dest=${host/#$HOME//root}
    if [ -f "$host" ]; then copy_in "$root" "$host" "$dest"
    elif [ -e "$root$dest" ] || [ -L "$root$dest" ]; then safe_dir "$root" "$(dirname "$dest")"; rm -f "$root$dest"; fi
  done
  command -v pip >/dev/null || return 0
  for v in $(pip config list 2>/dev/null | sed -nE "s/^[^=]*\.(find-links|index-url|extra-index-url|constraint|requirement)='(.*)'$/\2/p"); do
    v=${v#file://}
    case $v in /*) ;; *) continue ;; esac
    # a file:// index's pages link into the folder above simple/ (../../files/...)
    [ "$(basename "$v")" != simple ] || v=$(dirname "$v")
    [ -e "$v" ] && echo "$v"
  done | sort -u
}

# in_root ROOT [--bind|--ro-bind SRC:DST]... -- CMD...: CMD in ROOT's chroot, in a private mount namespace.
in_root() {
  local root=$1; shift
  local binds=() src dst mode
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    case $1 in --bind) mode=rw ;; --ro-bind) mode=ro ;; *) mode= ;; esac
    [ -n "$mode" ] && [ $# -ge 2 ] || die "usage: run [--bind|--ro-bind SRC:DST]... -- CMD..."
    binds+=("$mode:$2"); shift 2
  done
  [ "${1:-}" = "--" ] && [ $# -ge 2 ] || die "usage: run [--bind|--ro-bind SRC:DST]... -- CMD..."
  shift
  copy_in "$root" /etc/resolv.conf
  copy_in "$root" /etc/hosts   # (hydra looks its own host name up)
  [ ! -f $CA ] || copy_in "$root" $CA
  local pip_paths
  pip_paths=$(pip_config "$root")
  for src in $pip_paths; do binds+=("ro:$src:$src"); done
  local env=("${CHROOT_ENV[@]}")
  while IFS= read -r v; do env+=("$v"); done < <(env | grep '^PIP_' || true)
  # The mount points, made here where a link on the way can be refused (a file's is an empty file).
  local b
  for b in "${binds[@]}"; do
    src=${b#*:}; dst=${src#*:}; src=${src%%:*}
    case $dst in /*) ;; *) die "bind target $dst is not absolute" ;; esac
    [ -e "$src" ] || die "bind source $src does not exist"
    if [ -d "$src" ]; then safe_dir "$root" "$dst"
    else safe_dir "$root" "$(dirname "$dst")"; [ ! -L "$root$dst" ] || die "$root$dst is a link"; touch "$root$dst"; fi
  done
  # The namespace's script: mounts, then chroot. Arguments: root, the binds' count, the binds, CMD.
  unshare --mount --propagation private bash -euo pipefail -c '
    root=$1 n=$2; shift 2
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs -o size=4g,mode=1777 tmpfs "$root/dev/shm"
    for ((i = 0; i < n; i++)); do
      mode=${1%%:*} rest=${1#*:}; shift
      src=${rest%%:*} dst=${rest#*:}
      mount --bind "$src" "$root$dst"
      [ "$mode" = rw ] || mount -o remount,bind,ro "$root$dst"
    done
    exec chroot "$root" "$@"
  ' sid_root "$root" "${#binds[@]}" "${binds[@]}" env -i "${env[@]}" "$@" 9>&-
}

current() { [ -f "$ROOT/$STAMP" ] && [ "$(cat "$ROOT/$STAMP")" = "$RECIPE" ]; }

up() {
  lock -s
  if ! current; then
    flock -u 9
    lock -x
  fi
  if current; then   # (or made by another set-up while this one waited)
    echo "sid root: reused $ROOT ($(in_root "$ROOT" -- /v/bin/python -c 'import sys; print("Python", sys.version.split()[0])'))"
    return 0
  fi
  local start=$SECONDS new=$ROOT.new
  command -v debootstrap >/dev/null || { apt-get update -qq; apt-get install -y -qq debootstrap >/dev/null; }
  mkdir -p "$(dirname "$ROOT")"
  rm -rf "$new"
  echo "sid root: debootstrap --variant=minbase sid into $new (a few minutes, once)"
  debootstrap --variant=minbase sid "$new" "$MIRROR" > "$new.log" 2>&1 || { tail -20 "$new.log"; die "debootstrap failed"; }
  # A mirror may serve a frozen snapshot of sid (this machine's does) whose Release file has expired;
  # the packages are still signed, and their signatures still checked.
  echo 'Acquire::Check-Valid-Until "false";' > "$new/etc/apt/apt.conf.d/99pydist-snapshot"
  in_root "$new" -- apt-get -qq update
  in_root "$new" -- apt-get -qq install -y --no-install-recommends "${PACKAGES[@]}" >/dev/null
  in_root "$new" -- apt-get -qq clean
  in_root "$new" -- python$PYTHON -m venv /v
  in_root "$new" -- /v/bin/pip install -q "${PIP_PACKAGES[@]}"
  echo "$RECIPE" > "$new/$STAMP"
  rm -rf "$ROOT" "$new.log"
  mv -T "$new" "$ROOT"
  echo "sid root: made $ROOT in $((SECONDS - start)) s, $(du -sh "$ROOT" | cut -f1)"
}

case "${1:-}" in
  up) up ;;
  run)
    shift
    lock -s
    [ -f "$ROOT/$STAMP" ] || die "no root at $ROOT: run scripts/sid_root.sh up first"
    in_root "$ROOT" "$@" ;;
  path) echo "$ROOT" ;;
  python) echo "$PYTHON" ;;
  *) die "usage: sid_root.sh up | run [--bind|--ro-bind SRC:DST]... -- CMD... | path | python" ;;
esac
