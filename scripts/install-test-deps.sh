#!/bin/sh
# System packages that only the tests need, from Debian's archive (no browser download):
#   chromium    the browser test (Playwright drives /usr/bin/chromium)
#   postgresql  the Spark sinks' PostgreSQL test (scripts/pg-local.sh starts a throwaway server)
# Idempotent: installs only what is missing. Needs root (or sudo) for apt-get.
set -eu
missing=""
[ -x /usr/bin/chromium ] || missing="$missing chromium"
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$missing postgresql"
[ -n "$missing" ] || exit 0
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
echo "installing test dependencies:$missing"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
