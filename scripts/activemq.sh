#!/usr/bin/env bash
# ActiveMQ 5.17 (Debian package) for tests and CI: install it, run a private broker instance in a
# directory, stop it. Service scripts do not work in containers, so the broker is started with
# java directly (docs/operations.md, "ActiveMQ").
#
#   scripts/activemq.sh install            apt-get install -y activemq openssl if missing
#   scripts/activemq.sh start DIR          instance config in DIR, broker in the background,
#                                          returns once the STOMP port(s) accept connections
#   scripts/activemq.sh stop DIR           SIGTERM, then SIGKILL after a bounded wait
#   scripts/activemq.sh status DIR         exit 0 when the broker of DIR is running
#
# Environment (all optional):
#   ACTIVEMQ_HOST           interface to listen on (default 127.0.0.1)
#   ACTIVEMQ_STOMP_PORT     STOMP port (default 61613)
#   ACTIVEMQ_OPENWIRE_PORT  OpenWire port (default 61616)
#   ACTIVEMQ_START_TIMEOUT  seconds to wait for the STOMP port (default 90)
#   ACTIVEMQ_JAVA_OPTS      JVM options (default -Xms64m -Xmx512m)
#   ACTIVEMQ_MAX_MESSAGE_BYTES  largest message body a producer may send over STOMP (default
#                           4194304, 4 MiB; ActiveMQ's own is 100 MiB): a consumer holds up to
#                           its prefetch of them, so this bounds its memory
#   ACTIVEMQ_STOMP_SSL_PORT STOMP over TLS port (default: none, no TLS connector); needs
#   ACTIVEMQ_KEYSTORE       PKCS12 file with the broker's key and certificate chain, and
#   ACTIVEMQ_STORE_PASSWORD its password (also the truststore's); written only into the
#                           instance's activemq.xml (mode 0600), never on the JVM's command line
#   ACTIVEMQ_TRUSTSTORE     PKCS12 file of the CAs that sign client certificates: when set, the
#                           TLS connector requires a client certificate (needClientAuth)
set -euo pipefail

ACTIVEMQ_HOME=/usr/share/activemq
DEBIAN_INSTANCE=/etc/activemq/instances-available/main
HOST=${ACTIVEMQ_HOST:-127.0.0.1}
STOMP_PORT=${ACTIVEMQ_STOMP_PORT:-61613}
OPENWIRE_PORT=${ACTIVEMQ_OPENWIRE_PORT:-61616}
START_TIMEOUT=${ACTIVEMQ_START_TIMEOUT:-90}
JAVA_OPTS=${ACTIVEMQ_JAVA_OPTS:--Xms64m -Xmx512m}
SSL_PORT=${ACTIVEMQ_STOMP_SSL_PORT:-}
KEYSTORE=${ACTIVEMQ_KEYSTORE:-}
TRUSTSTORE=${ACTIVEMQ_TRUSTSTORE:-}
STORE_PASSWORD=${ACTIVEMQ_STORE_PASSWORD:-}
MAX_MESSAGE_BYTES=${ACTIVEMQ_MAX_MESSAGE_BYTES:-4194304}
# The STOMP connectors' options (see write_config): "\&amp;" is an & in an XML attribute,
# written through sed's replacement.
CONNECTOR_OPTIONS="transport.tcpNoDelay=true\\&amp;transport.maxDataLength=$MAX_MESSAGE_BYTES"

die() {
    echo "activemq.sh: $*" >&2
    exit 1
}

installed() {
    [[ -f $ACTIVEMQ_HOME/bin/activemq.jar && -f $DEBIAN_INSTANCE/activemq.xml ]]
}

tls_tools() {
    # openssl and the JDK's keytool make the TLS tests' certificates and stores.
    command -v openssl >/dev/null && command -v keytool >/dev/null
}

cmd_install() {
    if installed && tls_tools; then
        echo "ActiveMQ is installed ($ACTIVEMQ_HOME), with openssl and keytool"
        return
    fi
    [[ $(id -u) -eq 0 ]] || die "installing needs root: sudo $0 install"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    # The package's postinst tries to start the service; where policy-rc.d forbids it (containers)
    # that is reported and ignored, which is what we want: brokers are started by this script.
    apt-get install -y -q activemq openssl
    installed || die "apt-get installed activemq but $ACTIVEMQ_HOME/bin/activemq.jar is missing"
    tls_tools || die "apt-get installed activemq and openssl but openssl or keytool is missing"
}

pid_of() {
    local dir=$1
    [[ -f $dir/broker.pid ]] || return 1
    local pid
    pid=$(<"$dir/broker.pid")
    kill -0 "$pid" 2>/dev/null || return 1
    echo "$pid"
}

port_open() {
    # bash's /dev/tcp: no netcat needed; a refused connect fails at once.
    (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

write_config() {
    local dir=$1
    mkdir -p "$dir/data"
    # The Debian instance listens on OpenWire only; the STOMP connector is added next to it,
    # with TCP_NODELAY on its sockets (ActiveMQ's default leaves Nagle's algorithm on: a small
    # MESSAGE frame can wait for the consumer's delayed ACK of the one before) and a bound on
    # a message's body (a consumer holds up to its prefetch of them in memory).
    [[ $MAX_MESSAGE_BYTES =~ ^[1-9][0-9]*$ ]] ||
        die "ACTIVEMQ_MAX_MESSAGE_BYTES must be a whole number of bytes, got '$MAX_MESSAGE_BYTES'"
    sed -e "s#<transportConnector name=\"openwire\"[^>]*/>#<transportConnector name=\"openwire\" uri=\"tcp://$HOST:$OPENWIRE_PORT\"/>\n            <transportConnector name=\"stomp\" uri=\"stomp://$HOST:$STOMP_PORT?$CONNECTOR_OPTIONS\"/>#" \
        "$DEBIAN_INSTANCE/activemq.xml" >"$dir/activemq.xml"
    grep -q "name=\"stomp\"" "$dir/activemq.xml" ||
        die "could not add the STOMP connector to $dir/activemq.xml (Debian config changed?)"
    [[ -z $SSL_PORT ]] || write_tls_config "$dir"
    # What the platform needs from the broker (see sis_platform/queues/stomp/):
    # - strictOrderDispatch: when the only consumer backs out (unsubscribes with messages
    #   unacked), ActiveMQ 5.17 puts them back *before* earlier backed-out messages it has not
    #   redelivered yet; without it, repeated partial backouts reorder the queue.
    # Not persistJMSRedelivered (keep the redelivered flag across a broker restart): it makes
    # the broker store every message synchronously and write it again before its first
    # dispatch, which bounds a backlog's drain to a fraction of its rate without it. The
    # platform counts deliveries as a lower bound anyway
    # (sis_platform/queues/stomp/source.py).
    sed -i \
        -e '/<persistenceAdapter>/i\
        <destinationPolicy>\
            <policyMap>\
                <policyEntries>\
                    <policyEntry queue=">" strictOrderDispatch="true"/>\
                </policyEntries>\
            </policyMap>\
        </destinationPolicy>\
' "$dir/activemq.xml"
    grep -q 'strictOrderDispatch="true"' "$dir/activemq.xml" ||
        die "could not add the destination policy to $dir/activemq.xml (Debian config changed?)"
    # Debian builds ActiveMQ against log4j 1.2 (lib/optional/log4j-1.2.jar), so the instance's
    # log4j2.properties is never read; without this file the broker logs nothing at all.
    cat >"$dir/log4j.properties" <<EOF
log4j.rootLogger=INFO, logfile
log4j.logger.org.springframework=WARN
log4j.logger.org.apache.xbean=WARN
log4j.appender.logfile=org.apache.log4j.RollingFileAppender
log4j.appender.logfile.file=$dir/data/activemq.log
log4j.appender.logfile.maxFileSize=4MB
log4j.appender.logfile.maxBackupIndex=2
log4j.appender.logfile.layout=org.apache.log4j.PatternLayout
log4j.appender.logfile.layout.ConversionPattern=%d | %-5p | %m | %c | %t%n
EOF
}

write_tls_config() {
    local dir=$1
    [[ -f $KEYSTORE ]] || die "ACTIVEMQ_STOMP_SSL_PORT needs ACTIVEMQ_KEYSTORE (a PKCS12 file)"
    [[ -n $STORE_PASSWORD ]] || die "ACTIVEMQ_STOMP_SSL_PORT needs ACTIVEMQ_STORE_PASSWORD"
    [[ $STORE_PASSWORD != *[\"\'\<\>\&#]* ]] ||
        die "ACTIVEMQ_STORE_PASSWORD must not contain quotes, <, >, & or #"
    local trust="" options="?$CONNECTOR_OPTIONS"
    if [[ -n $TRUSTSTORE ]]; then
        [[ -f $TRUSTSTORE ]] || die "ACTIVEMQ_TRUSTSTORE=$TRUSTSTORE is not a file"
        trust=" trustStore=\"file:$TRUSTSTORE\" trustStorePassword=\"$STORE_PASSWORD\" trustStoreType=\"pkcs12\""
        # "&amp;": the URI is an XML attribute; "\&": a literal & in sed's replacement.
        options+="\\&amp;transport.needClientAuth=true"
    fi
    # The file now holds the store password: readable by this user only.
    chmod 600 "$dir/activemq.xml"
    sed -i \
        -e "s#<transportConnector name=\"stomp\"[^>]*/>#&\n            <transportConnector name=\"stomp+ssl\" uri=\"stomp+ssl://$HOST:$SSL_PORT$options\"/>#" \
        -e "/<transportConnectors>/i\\
        <sslContext>\\
            <sslContext keyStore=\"file:$KEYSTORE\" keyStorePassword=\"$STORE_PASSWORD\" keyStoreType=\"pkcs12\"$trust/>\\
        </sslContext>" \
        "$dir/activemq.xml"
    grep -q 'name="stomp+ssl"' "$dir/activemq.xml" && grep -q '<sslContext keyStore=' "$dir/activemq.xml" ||
        die "could not add the STOMP TLS connector to $dir/activemq.xml (Debian config changed?)"
}

ports_open() {
    port_open "$HOST" "$STOMP_PORT" && { [[ -z $SSL_PORT ]] || port_open "$HOST" "$SSL_PORT"; }
}

cmd_start() {
    local dir=${1:?usage: $0 start DIR}
    installed || die "ActiveMQ is not installed; run: $0 install"
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    if pid=$(pid_of "$dir"); then
        die "a broker for $dir is already running (pid $pid)"
    fi
    if port_open "$HOST" "$STOMP_PORT"; then
        die "$HOST:$STOMP_PORT is already in use; set ACTIVEMQ_STOMP_PORT"
    fi
    write_config "$dir"
    # shellcheck disable=SC2086  # JAVA_OPTS is a list of options
    nohup java $JAVA_OPTS \
        -Dactivemq.home="$ACTIVEMQ_HOME" -Dactivemq.base="$dir" -Dactivemq.conf="$dir" \
        -Dactivemq.data="$dir/data" -Dlog4j.configuration="file:$dir/log4j.properties" \
        -jar "$ACTIVEMQ_HOME/bin/activemq.jar" start "xbean:file:$dir/activemq.xml" \
        >"$dir/broker.out" 2>&1 </dev/null &
    local pid=$!
    echo "$pid" >"$dir/broker.pid"
    # Readiness is an observable event (the port accepts connections), polled with a deadline.
    local deadline=$((SECONDS + START_TIMEOUT))
    until ports_open; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 40 "$dir/broker.out" >&2 || true
            die "broker exited during start-up (log: $dir/broker.out)"
        fi
        if ((SECONDS >= deadline)); then
            kill -9 "$pid" 2>/dev/null || true
            tail -n 40 "$dir/broker.out" >&2 || true
            die "STOMP port(s) $HOST:$STOMP_PORT ${SSL_PORT:+and $SSL_PORT }not open after ${START_TIMEOUT}s"
        fi
        sleep 0.2
    done
    echo "ActiveMQ running: pid $pid, stomp://$HOST:$STOMP_PORT${SSL_PORT:+, stomp+ssl://$HOST:$SSL_PORT}, dir $dir"
}

cmd_stop() {
    local dir=${1:?usage: $0 stop DIR}
    local pid
    if ! pid=$(pid_of "$dir"); then
        rm -f "$dir/broker.pid"
        echo "no broker running for $dir"
        return
    fi
    kill -TERM "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.2
    done
    rm -f "$dir/broker.pid"
    echo "ActiveMQ stopped (pid $pid)"
}

cmd_status() {
    local dir=${1:?usage: $0 status DIR}
    local pid
    pid=$(pid_of "$dir") || die "no broker running for $dir"
    echo "running: pid $pid"
}

case ${1:-} in
install) cmd_install ;;
start) cmd_start "${2:-}" ;;
stop) cmd_stop "${2:-}" ;;
status) cmd_status "${2:-}" ;;
*)
    echo "usage: $0 install | start DIR | stop DIR | status DIR" >&2
    exit 2
    ;;
esac
