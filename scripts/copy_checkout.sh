#!/usr/bin/env bash
# scripts/copy_checkout.sh DEST: the checkout as it stands into the folder DEST, as a clone of it with
# the work in progress would be: tracked files and new ones git does not ignore, less tracked files
# deleted here; nothing built, no venv. For the stages and scripts that build elsewhere than this tree
# (the py314 stage, the pip stage, make wheel).
set -euo pipefail
[ $# -eq 1 ] && [ -d "$1" ] || { echo "usage: copy_checkout.sh DEST (an existing folder)" >&2; exit 1; }
dest=$(cd "$1" && pwd)
cd "$(dirname "$0")/.."
git ls-files -z -co --exclude-standard | while IFS= read -r -d '' f; do
  if [ -e "$f" ] || [ -L "$f" ]; then printf '%s\0' "$f"; fi
done | tar --null -cf - -T - | tar xf - -C "$dest"
