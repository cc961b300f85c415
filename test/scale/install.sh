#!/usr/bin/env bash
# Sourced by test/scale/run.sh and bench/scale/run.sh: installs the Debian
# packages the scale scenarios use, when missing and when root (else says so).
need=()
command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || need+=(pgbouncer)
command -v haproxy >/dev/null || [ -x /usr/sbin/haproxy ] || need+=(haproxy)
command -v patroni >/dev/null || need+=(patroni)
command -v etcd >/dev/null || need+=(etcd-server)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
if ((${#need[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "test:scale: installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null \
      || echo "test:scale: could not install ${need[*]}; those scenarios will be skipped"
  else
    echo "test:scale: ${need[*]} missing and not root: those scenarios will be skipped"
  fi
fi

