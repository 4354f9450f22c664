#!/usr/bin/env bash
# The system programs `make test` needs, installed when missing: espeak-ng speaks the training
# tests' sentences, sox pads and converts them (flac and ogg through its format plugins), the
# playground's browser tests drive the system's headless Chromium (playwright, no browser
# download; chromium-driver for selenium users), and the cluster tests start redis-server
# processes of their own (so the binary is needed, not a Redis already running), and Debian's
# prometheus package brings promtool (the alert rules' tests) and prometheus (a real one scrapes a
# dev server in tests/project/test_monitoring_scrape.py; the package's own service is not used:
# the test starts its own on a free port).
#
# Installs them with apt-get when this user may (root, or sudo without a password); otherwise it
# stops at once, naming the one command to run. Programs are looked up by name, not by package,
# so a machine that has them from elsewhere passes.
set -euo pipefail

missing=()
have() { command -v "$1" >/dev/null 2>&1; }
sox_reads() { sox -h 2>/dev/null | grep -A3 'AUDIO FILE FORMATS' | grep -qw "$1"; }

check() {
  missing=()
  have espeak-ng || missing+=(espeak-ng)
  have sox || missing+=(sox)
  if ! have sox || ! sox_reads flac || ! sox_reads ogg; then missing+=(libsox-fmt-base); fi
  have chromium || missing+=(chromium)
  have chromedriver || missing+=(chromium-driver)
  have redis-server || missing+=(redis-server)
  if ! have promtool || ! have prometheus; then missing+=(prometheus); fi
}

check
[ ${#missing[@]} -eq 0 ] && exit 0

install="apt-get install -y ${missing[*]}"
if ! have apt-get; then
  echo "make test needs these programs (Debian's package names): ${missing[*]}." >&2
  echo "No apt-get here: install them with this system's package manager, then run make test again." >&2
  exit 1
fi
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif have sudo && sudo -n true 2>/dev/null; then
  sudo=(sudo -n)
else
  echo "make test needs: ${missing[*]}. Install them, then run make test again:" >&2
  echo "  sudo apt-get update && sudo $install" >&2
  exit 1
fi

echo "make test: installing ${missing[*]}" >&2
"${sudo[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
check
if [ ${#missing[@]} -gt 0 ]; then
  echo "still missing after apt-get install: ${missing[*]}" >&2
  exit 1
fi
