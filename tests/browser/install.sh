#!/bin/sh
# Debian's chromium for the browser test (Playwright drives it; no browser download).
# Idempotent: does nothing when /usr/bin/chromium exists. Needs root (or sudo) for apt.
set -eu
if [ -x /usr/bin/chromium ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium
