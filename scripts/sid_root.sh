#!/usr/bin/env bash
# A Debian unstable (sid) root with CPython 3.14 and sid's own MPICH 5, for make test's py314 stage and
# make wheel's 3.14 wheel: the newest Python on the newest Debian, as a researcher on a rolling
# distribution has it, on a machine whose own Debian ships 3.11. Made once with debootstrap, cached
# outside the checkout (so every clone reuses it), and entered with chroot.
#
#   scripts/sid_root.sh up                     make the root, or reuse it if its stamp matches the recipe
#   scripts/sid_root.sh run [--bind SRC:DST]... -- CMD...
#                                              CMD inside the root, as root, with /src etc. bound
#   scripts/sid_root.sh path                   print where the root is
#
# The root is ${PYDIST_SID_ROOT:-/var/cache/pydist/sid-root}; /v in it is a 3.14 venv with numpy,
# pytest and hypothesis. `up` builds a new root beside the old one and renames it into place once its
# stamp is written, so an interrupted set-up never leaves a half root that looks done. `run` works in a
# mount namespace of its own (unshare): /proc, /sys, /dev, a fresh /dev/shm (MPICH's shared memory)
# and the binds vanish with it, whatever way it ends. The host's DNS and CA bundle (PyPI goes through a
# proxy whose CA it holds) are copied in at each run, never through a link planted in the root.
set -euo pipefail
ROOT=${PYDIST_SID_ROOT:-/var/cache/pydist/sid-root}
MIRROR=${PYDIST_SID_MIRROR:-http://deb.debian.org/debian}
PACKAGES=(python3.14 python3.14-venv python3.14-dev mpich libmpich-dev gcc libc6-dev pkg-config
          libopenblas-dev zlib1g-dev ca-certificates)
PIP_PACKAGES=("setuptools>=70" wheel numpy "pytest>=7" "hypothesis==6.170.15")
RECIPE="pydist sid root 1: ${PACKAGES[*]} | ${PIP_PACKAGES[*]}"
STAMP=.pydist-sid-root   # in the root: the recipe it was made from, written last
CHROOT_ENV=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8
            DEBIAN_FRONTEND=noninteractive PIP_CERT=/etc/ssl/certs/ca-certificates.crt
            PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=180 PYTHONDONTWRITEBYTECODE=1)

die() { echo "sid_root.sh: $*" >&2; exit 1; }

# copy_in ROOT HOSTFILE: the host's file to the same path in ROOT, by a temporary file and a rename in
# that folder, refusing a folder on the way that is a link (a root's files are not ours to trust).
copy_in() {
  local root=$1 file=$2 dir d
  dir=$(dirname "$file")
  d=$root
  for part in ${dir//\// }; do
    d=$d/$part
    [ ! -L "$d" ] || die "$d is a link; refusing to write through it"
    mkdir -p "$d"
  done
  local tmp
  tmp=$(mktemp "$root$dir/.pydist.XXXXXX")
  cat "$file" > "$tmp"
  chmod 644 "$tmp"
  mv -fT "$tmp" "$root$file"
}

# in_root ROOT [--bind SRC:DST]... -- CMD...: CMD in ROOT's chroot, in a private mount namespace.
in_root() {
  local root=$1; shift
  local binds=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do
    [ "$1" = "--bind" ] && [ $# -ge 2 ] || die "usage: run [--bind SRC:DST]... -- CMD..."
    binds+=("$2"); shift 2
  done
  [ "${1:-}" = "--" ] && [ $# -ge 2 ] || die "usage: run [--bind SRC:DST]... -- CMD..."
  shift
  copy_in "$root" /etc/resolv.conf
  copy_in "$root" /etc/hosts   # (MPICH maps ranks to nodes by host name)
  [ -f /etc/ssl/certs/ca-certificates.crt ] && copy_in "$root" /etc/ssl/certs/ca-certificates.crt
  # The namespace's script: mounts, then chroot. Arguments: root, the binds' count, the binds, CMD.
  unshare --mount --propagation private bash -euo pipefail -c '
    root=$1 n=$2; shift 2
    mount -t proc proc "$root/proc"
    mount --rbind /sys "$root/sys"
    mount --rbind /dev "$root/dev"
    mount -t tmpfs -o size=4g,mode=1777 tmpfs "$root/dev/shm"
    for ((i = 0; i < n; i++)); do
      src=${1%%:*} dst=${1#*:}; shift
      case $dst in /*) ;; *) echo "sid_root.sh: bind target $dst is not absolute" >&2; exit 2 ;; esac
      [ ! -L "$root$dst" ] || { echo "sid_root.sh: $root$dst is a link" >&2; exit 2; }
      mkdir -p "$root$dst"
      mount --bind "$src" "$root$dst"
    done
    exec chroot "$root" "$@"
  ' sid_root "$root" "${#binds[@]}" "${binds[@]}" env -i "${CHROOT_ENV[@]}" "$@"
}

up() {
  if [ -f "$ROOT/$STAMP" ] && [ "$(cat "$ROOT/$STAMP")" = "$RECIPE" ]; then
    echo "sid root: reused $ROOT ($("$0" run -- /v/bin/python -c 'import sys; print(sys.version.split()[0])'))"
    return 0
  fi
  local start=$SECONDS new
  command -v debootstrap >/dev/null || { apt-get update -qq; apt-get install -y -qq debootstrap >/dev/null; }
  mkdir -p "$(dirname "$ROOT")"
  new=$ROOT.new
  rm -rf "$new"
  echo "sid root: debootstrap --variant=minbase sid into $new (a few minutes, once)"
  debootstrap --variant=minbase sid "$new" "$MIRROR" > "$new.log" 2>&1 || { tail -20 "$new.log"; die "debootstrap failed"; }
  # A mirror may serve a frozen snapshot of sid (this machine's does) whose Release file has expired;
  # the packages are still signed, and their signatures still checked.
  echo 'Acquire::Check-Valid-Until "false";' > "$new/etc/apt/apt.conf.d/99pydist-snapshot"
  in_root "$new" -- apt-get -qq update
  in_root "$new" -- apt-get -qq install -y --no-install-recommends "${PACKAGES[@]}" >/dev/null
  in_root "$new" -- apt-get -qq clean
  in_root "$new" -- python3.14 -m venv /v
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
    [ -f "$ROOT/$STAMP" ] || die "no root at $ROOT: run scripts/sid_root.sh up first"
    in_root "$ROOT" "$@" ;;
  path) echo "$ROOT" ;;
  *) die "usage: sid_root.sh up | run [--bind SRC:DST]... -- CMD... | path" ;;
esac
