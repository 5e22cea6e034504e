#!/usr/bin/env bash
# Debian's chromium for the browser tests (tests/e2e/test_ui.py; tests/deploy/test_dashboard_data.py
# and scripts/dashboard_snapshot.py, which draw the dashboard's panels), which drive it headless
# with Playwright for Python. Playwright's own browser download (`playwright install`) is not
# used: they launch /usr/bin/chromium.
#
#   scripts/chromium.sh install            apt-get install -y chromium if /usr/bin/chromium is missing
set -euo pipefail

CHROMIUM=/usr/bin/chromium

die() {
    echo "chromium.sh: $*" >&2
    exit 1
}

cmd_install() {
    if [[ -x $CHROMIUM ]]; then
        echo "Chromium is installed ($CHROMIUM)"
        return
    fi
    [[ $(id -u) -eq 0 ]] || die "installing needs root: sudo $0 install"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q chromium
    [[ -x $CHROMIUM ]] || die "apt-get installed chromium but $CHROMIUM is missing"
}

case ${1:-} in
    install) cmd_install ;;
    *) die "usage: $0 install" ;;
esac
