#!/usr/bin/env bash
# Prometheus (Debian package, 2.42) for tests and CI: the server the monitoring tests start on a
# loopback port of their own (tests/live/test_prometheus.py), and `promtool`, which checks and
# unit-tests the alert rules under deploy/prometheus/ (tests/deploy/test_alert_rules.py).
# The package's own service is never used (stopped and disabled where systemd started it): each
# test runs a private server on loopback from its own configuration and data folder.
#
#   scripts/prometheus.sh install   apt-get install -y prometheus (no recommends) if missing
#   scripts/prometheus.sh status    exit 0 when prometheus and promtool are on PATH
set -euo pipefail

die() {
    echo "prometheus.sh: $*" >&2
    exit 1
}

installed() {
    command -v prometheus >/dev/null && command -v promtool >/dev/null
}

cmd_install() {
    if installed; then
        echo "Prometheus is installed: $(prometheus --version 2>&1 | head -1)"
        return
    fi
    [[ $(id -u) -eq 0 ]] || die "installing needs root: sudo $0 install"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    # Without recommends: the node exporter and the web UI's assets are not needed. The
    # package's postinst may try to start its service; where policy-rc.d forbids it
    # (containers) that is reported and ignored: tests start their own servers.
    apt-get install -y -q --no-install-recommends prometheus
    installed || die "apt-get installed prometheus but prometheus or promtool is missing"
    # Where systemd runs, the package enables and starts its own server on every interface
    # (:9090): nothing here uses it, and nothing should listen beyond loopback unasked.
    if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
        systemctl disable --now prometheus
        echo "stopped and disabled the package's own prometheus service (tests run their own)"
    fi
}

case ${1:-} in
    install) cmd_install ;;
    status) installed ;;
    *) die "usage: $0 install|status" ;;
esac
