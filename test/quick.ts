/**
 * `npm run test:quick`: the unit tests, and one database test file per room
 * (the fastest that still goes through the room's main path), in well under a
 * minute on two cores, for the edit-test loop. `npm test` is the whole suite;
 * chaos, fuzz, bench, scale and versions are left to it. Extra arguments go
 * to `bun test` (e.g. `-t claim`).
 */
import { existsSync } from 'node:fs'
import { join } from 'node:path'

/** No database, no process: pure functions, in-memory state, a moved clock. */
const UNIT = [
  'test/admin/runbooks.test.ts',
  'test/client/retry-policy.test.ts',
  'test/config.test.ts',
  'test/core/batcher.test.ts',
  'test/core/deadline.test.ts',
  'test/core/errors.test.ts',
  'test/core/fingerprint.test.ts',
  'test/guard/fixed-waits.test.ts',
  'test/http/auth.test.ts',
  'test/http/client-address.test.ts',
  'test/http/idempotency-key.test.ts',
  'test/http/problem.test.ts',
  'test/http/tenant-refusals.test.ts',
  'test/log/log.test.ts',
  'test/metrics/provider-in-flight.test.ts',
  'test/metrics/scrapes.test.ts',
  'test/operations/boundaries.test.ts',
  'test/provider/client.test.ts',
  'test/provider/simulator.test.ts',
  'test/store/driver-fixes.test.ts',
]

/** One file per room, with its time alone on two idle cores (2026-12-06). */
const ROOMS: Record<string, string> = {
  core: 'test/core/engine.test.ts', // 1.8 s: claim, replay, reclaim, release, complete
  store: 'test/store/request-path-plans.test.ts', // 1.0 s: every request-path statement's plan
  http: 'test/http/plugin.test.ts', // 0.5 s: the plugin on a route of its own
  admin: 'test/admin/detail.test.ts', // 0.7 s: a key's page and clearing it
  cli: 'test/cli/inputs.test.ts', // 1.2 s
  operations: 'test/operations/operations.test.ts', // 0.7 s
  metrics: 'test/metrics/gauges.test.ts', // 0.8 s
  maintenance: 'test/maintenance/retention-purge.test.ts', // 3.5 s (the only one)
  client: 'test/client/live.test.ts', // 1.7 s
  security: 'test/security/api-cache.test.ts', // 1.0 s
  dashboards: 'test/dashboards/generated.test.ts', // 1.1 s
  log: 'test/log/request-log.test.ts', // 3.4 s: a service process's log lines
  shutdown: 'test/shutdown/port-in-use.test.ts', // 0.8 s: a process's start refused
  provider: 'test/provider/process.test.ts', // 0.7 s: the simulator as a process
  package: 'test/package/license.test.ts', // 0.6 s
  upgrade: 'test/upgrade/settings-change.test.ts', // 4 s: two service processes on one database
}

const ROOT = join(import.meta.dir, '..')
const files = [...UNIT, ...Object.values(ROOMS)]
const missing = files.filter((file) => !existsSync(join(ROOT, file)))
if (missing.length > 0) {
  console.error(`test:quick: no such file: ${missing.join(', ')} (renamed? update test/quick.ts)`)
  process.exit(2)
}

const started = performance.now()
const tests = Bun.spawn([process.execPath, 'test', '--timeout', '60000', ...files, ...process.argv.slice(2)], { cwd: ROOT, stdio: ['inherit', 'inherit', 'inherit'] })
const code = await tests.exited
console.log(`test:quick: ${files.length} files (${UNIT.length} unit, ${Object.keys(ROOMS).length} rooms) in ${((performance.now() - started) / 1000).toFixed(1)} s`)
process.exit(code)
