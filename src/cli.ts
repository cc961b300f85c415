#!/usr/bin/env bun
/**
 * The operator CLI: `npm run idem -- <command>` or `idem <command>`. A thin
 * caller of src/operations, like the admin page and its JSON API: the same
 * operations, the same audit trail (as "cli:<who>"), the same snake_case JSON
 * (--json prints what /admin/api answers). It applies the server's TTL and
 * retention as the server recorded them, never its own shell's; on an app's
 * database, where no server records them, the operator names them
 * (--ttl-seconds, --retention-seconds). It reads DATABASE_URL with the
 * server's own parser (config.ts); unset, it finds the embedded PostgreSQL
 * `npm start` runs for this checkout, by the rules that placed it.
 *
 * Every destructive command (expire, expire-stale, purge) shows what it would
 * do and asks, unless given --yes; --dry-run shows it and changes nothing.
 * Each action writes one JSON log line to stderr (src/log.ts), as the server
 * does for the page and the JSON API; its audit entry is the record.
 *
 * Exit codes: 0 done (or, with --dry-run, shown); 1 refused or failed (a live
 * worker holds the key, the key changed, the operator answered no, the
 * database failed); 2 usage (bad arguments, no database to find, no actor,
 * settings neither recorded nor given, a destructive command without --yes
 * where nobody can be asked).
 */
import { runCli } from './cli/run'

// The CLI lives in src/cli/: io.ts (terminal, exit codes), actor.ts, connection.ts (database, settings),
// output.ts, arguments.ts, program.ts, run.ts, and one file per command group in commands/.
export { EXIT, processIo, RefusedError, UsageError, type CliIo, type RunState } from './cli/io'
export { resolveActor } from './cli/actor'
export { buildProgram } from './cli/program'
export { runCli }

if (import.meta.main) process.exit(await runCli(process.argv.slice(2)))
