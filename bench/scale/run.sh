#!/usr/bin/env bash
# `npm run bench:scale`: installs what the scale scenarios need (as test:scale does), then measures.
set -euo pipefail
cd "$(dirname "$0")/../.."
source test/scale/install.sh
export DATABASE_URL="${DATABASE_URL:-${SCALE_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}}"
exec node_modules/.bin/bun bench/scale/run.ts "$@"
