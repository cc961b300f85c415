#!/usr/bin/env bash
# `npm run test:scale`: the scale suite (a Patroni cluster, PgBouncer,
# failover, HAProxy, capacity properties). Not part of `npm test`. It needs
# Debian's patroni, etcd-server, pgbouncer, haproxy and PostgreSQL server
# binaries (initdb, pg_basebackup, pg_ctl, pg_rewind) and the machine's
# PostgreSQL on 127.0.0.1:5432 (or SCALE_POSTGRES_URL). As root it installs
# what is missing; otherwise each scenario whose binary is absent is skipped
# with a message saying what to install. `npm run bench:scale` uses the same.
set -euo pipefail
cd "$(dirname "$0")/../.."

source test/scale/install.sh

# The preload (test/support/setup.ts) would start an embedded PostgreSQL when
# DATABASE_URL is unset; the scale suite uses the machine's server instead.
export DATABASE_URL="${DATABASE_URL:-${SCALE_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}}"
# The files are *.scale.ts, not *.test.ts, so that `npm test` (bun test over
# the whole tree) never picks them up; bun runs them when named with ./.
if (($#)); then files=("$@"); else files=(./test/scale/*.scale.ts); fi
exec node_modules/.bin/bun test --timeout 300000 "${files[@]}"
