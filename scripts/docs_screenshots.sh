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
# page[|CSS selector]: shown from that element down (the strategy guide from its first figure up to
# the table above it)
pages=(index tutorial "guides/strategies|#the-strategies-side-by-side table" reference/api)
sizes=(desktop:1400,1000 phone:390,844)
for page in "${pages[@]}"; do
  for size in "${sizes[@]}"; do
    name="$(echo "${page%%|*}" | tr / -)-${size%%:*}.png"
    url="file://$PWD/docs/_build/html/${page%%|*}.html"
    if [[ "$page" == *"|"* ]]; then
      # headless Chromium does not scroll to a URL's anchor before it shoots: a frame tall enough to
      # hold the page down to the anchor, moved up by the anchor's offset, shows it from there (a
      # script reads the offset; file:// frames need --allow-file-access-from-files)
      frame="$out/${name%.png}.html"
      cat > "$frame" <<HTML
<html><body style="margin:0;overflow:hidden"><iframe id="f" src="$url" style="border:0;width:100vw;height:100vh"></iframe>
<script>document.getElementById("f").onload = function () {
  var y = this.contentWindow.document.querySelector("${page#*|}").getBoundingClientRect().top;
  this.style.height = (y + 2 * window.innerHeight) + "px";   /* the page down past there, shown from y */
  this.style.marginTop = (-y) + "px";
};</script></body></html>
HTML
      url="file://$PWD/$frame"
    fi
    # root needs --no-sandbox; a fresh profile each time so nothing cached from an earlier build shows
    chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --allow-file-access-from-files --user-data-dir="$(mktemp -d)" \
      --virtual-time-budget=3000 --window-size="${size#*:}" --screenshot="$out/$name" "$url" \
      >/dev/null 2>&1
    echo "$out/$name"
  done
done
