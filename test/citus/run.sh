#!/usr/bin/env bash
# npm run test:citus: the tests on a Citus cluster (test/citus/*.test.ts). Each file starts its own
# coordinator and workers through test/support/citus.ts (own ports and data directories under /tmp,
# stopped at its end; suites.test.ts runs test/core and test/http files on one), so all this needs is a PostgreSQL that can load citus: the installed one
# (CITUS_PG_BIN, else /usr/lib/postgresql/N with citus.so), else one built now from ../shared/citus
# (build.sh: about 2 minutes on two cores, once per machine). Arguments go to `bun test`
# (e.g. a file: npm run test:citus -- test/citus/operators.test.ts).
set -euo pipefail
cd "$(dirname "$0")/../.."

if [ -z "${CITUS_PG_BIN:-}" ]; then
  for lib in $(ls -d /usr/lib/postgresql/*/lib 2>/dev/null | sort -t/ -k4 -n -r); do
    if [ -f "$lib/citus.so" ]; then CITUS_PG_BIN=$(dirname "$lib")/bin; break; fi
  done
fi
if [ -z "${CITUS_PG_BIN:-}" ]; then
  # The release source kept beside the checkout (../shared/citus), or CITUS_SOURCE where a clone lives elsewhere.
  build=""
  for dir in "${CITUS_SOURCE:-}" ../shared/citus /work/shared/citus; do
    if [ -n "$dir" ] && [ -f "$dir/build.sh" ]; then build=$dir/build.sh; break; fi
  done
  [ -n "$build" ] || { echo "test:citus: no PostgreSQL with citus installed, and no ../shared/citus/build.sh (or CITUS_SOURCE) to build it with" >&2; exit 1; }
  echo "test:citus: building Citus from ../shared/citus (about 2 minutes)" >&2
  CITUS_PG_BIN=$(bash "$build" | tail -n1)
fi
export CITUS_PG_BIN
echo "test:citus: Citus from $CITUS_PG_BIN" >&2

export PATH="$PWD/node_modules/.bin:$PATH"
if [ "$#" -eq 0 ]; then set -- test/citus; fi
exec bun test --timeout 120000 "$@"
