#!/usr/bin/env bash
# Screenshots of the built documentation site as a reader sees it, in headless Chromium: the home page,
# the tutorial, a strategy guide with its figure and an API reference page, at desktop and phone widths.
#
#   scripts/docs_screenshots.sh            # builds the site if needed; PNGs in docs/_build/screenshots/
#
# Installs Debian's chromium if it is missing (root or sudo). Look at the PNGs after any change to the
# theme, conf.py or a page's layout.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium >/dev/null
fi
[ -f docs/_build/html/index.html ] || .venv/bin/python -m sphinx -W --keep-going -q -b html docs docs/_build/html
out=docs/_build/screenshots
mkdir -p "$out"
pages=(index tutorial guides/strategies reference/api)
sizes=(desktop:1400,1000 phone:390,844)
for page in "${pages[@]}"; do
  for size in "${sizes[@]}"; do
    name="$(echo "$page" | tr / -)-${size%%:*}.png"
    # root needs --no-sandbox; a fresh profile each time so nothing cached from an earlier build shows
    chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$(mktemp -d)" \
      --window-size="${size#*:}" --screenshot="$out/$name" "file://$PWD/docs/_build/html/$page.html" \
      >/dev/null 2>&1
    echo "$out/$name"
  done
done
