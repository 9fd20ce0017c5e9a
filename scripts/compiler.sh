# Sourced by scripts/setup.sh --test, scripts/test.sh and scripts/check.sh: compile through ccache when
# it is installed (setup.sh --test installs it) and CC is not set already. make test builds the
# extension's 58 files several times over (in place, again for the no-warnings test, for each other
# Python): ccache hands back the objects (and the warnings) of a file it has compiled with the same
# flags before, and an edit recompiles only what it touched (setuptools recompiles every file).
if [ -z "${CC:-}" ] && command -v ccache >/dev/null 2>&1; then
  export CC="ccache gcc"
fi
