/**
 * Tests wait on signals, not time (STYLE 16, 24): a fixed wait passes only
 * when the machine is idle. Outside test/support (where `waitFor` and its
 * kin live) no test sleeps, unless the sleep is the scenario itself (a
 * fault's schedule, a client's pacing) and is listed here with its count and
 * why. A new one fails this test: wait for the event with `waitFor`, move an
 * injected clock, or argue it into the list. A count below the list's fails
 * too, so the list shrinks with the code.
 */
import { expect, test } from 'bun:test'
import { Glob } from 'bun'
import { readFileSync } from 'node:fs'
import { join } from 'node:path'

/** A fixed wait: Bun's sleep, a promise around a timer's resolve, a sleep helper awaited. */
const FIXED_WAIT = /Bun\.sleep\(|setTimeout\(r|await sleep\(/g

const ROOT = join(import.meta.dir, '..', '..')
const SELF = 'test/guard/fixed-waits.test.ts'

/** The sleeps that stay: file, how many, and why each is not a synchronisation. */
const ALLOWED: Record<string, { count: number; why: string }> = {
  'test/core/batcher.test.ts': { count: 4, why: 'batcher timers: owned by issue 46 work (its overlap timer reads the real clock; the waits let time pass to show nothing went out)' },
  'test/admin/force-expire.test.ts': { count: 1, why: 'the race itself: a random offset spreads the expire over the worker\'s writes and its commit' },
  'test/chaos/clients.ts': { count: 1, why: 'a retrying client\'s random pause: the load\'s shape' },
  'test/citus/support/load.ts': { count: 1, why: 'a retrying client\'s random pause: the load\'s shape (the Citus fault tests)' },
  'test/chaos/edges/sigterm-burst.test.ts': { count: 1, why: 'the fault\'s timing: SIGTERM lands a set delay after the burst' },
  'test/chaos/kill-restart.test.ts': { count: 3, why: 'clients starting in waves, the kill schedule, and the closed port between kill and restart: the scenario' },
  'test/chaos/postgres-restart.test.ts': { count: 3, why: 'clients spread over the outage, the outage\'s start, and the pace of POSTs during it: the scenario' },
  'test/chaos/terminate-loop.test.ts': { count: 1, why: 'the terminator\'s random schedule: the fault' },
  'test/chaos/workers.test.ts': { count: 1, why: 'a background sampler\'s period (pg_stat_activity), not a synchronisation' },
  'test/dashboards/prometheus-drills.test.ts': { count: 4, why: 'an alert poller\'s resolution, the load\'s pacing, and two fault schedules: the drills\' time' },
  'test/shutdown/drain-metrics.test.ts': { count: 1, why: 'a regular scraper\'s interval: the drain tunes its wait to it' },
  'test/shutdown/simulator-restart.test.ts': { count: 1, why: 'the operator\'s 0.6 s before restarting: the scenario' },
  'test/store/database-contract.test.ts': { count: 1, why: 'a retrying client\'s pause between 409s in a retry storm: the load\'s shape' },
  'test/upgrade/rolling.test.ts': { count: 1, why: 'a retrying client\'s pause between attempts: the load\'s shape' },
  'test/scale/patroni.scale.ts': { count: 2, why: 'a recovery watcher\'s resolution, and the pace of requests during a stall' },
  'test/scale/pgbouncer.scale.ts': { count: 5, why: 'an absent warning (the service logs only a failed check), a pool sampler\'s period, clients in waves, the kill schedule, the closed port' },
  'test/scale/support/load.ts': { count: 2, why: 'clients\' pause and think time: the load\'s shape' },
  'test/scale/support/relay-failover.ts': { count: 2, why: 'arrivals spread over the run, and the slow link\'s second: the scenario' },
}

function fixedWaits(): Map<string, number> {
  const found = new Map<string, number>()
  for (const file of new Glob('test/**/*.{ts,tsx}').scanSync({ cwd: ROOT })) {
    if (file.startsWith('test/support/') || file === SELF) continue
    const count = readFileSync(join(ROOT, file), 'utf8').match(FIXED_WAIT)?.length ?? 0
    if (count > 0) found.set(file, count)
  }
  return found
}

test('no fixed wait in test/ outside test/support, but the listed ones', () => {
  const found = fixedWaits()
  const unexpected = [...found].filter(([file, count]) => count > (ALLOWED[file]?.count ?? 0))
    .map(([file, count]) => `${file}: ${count} fixed wait(s), ${ALLOWED[file]?.count ?? 0} allowed: wait for the event (test/support/wait.ts) or move a clock`)
  expect(unexpected).toEqual([])
})

test('the allow-list is no longer than what it allows', () => {
  const found = fixedWaits()
  const stale = Object.entries(ALLOWED).filter(([file, { count }]) => (found.get(file) ?? 0) < count)
    .map(([file, { count }]) => `${file}: ${found.get(file) ?? 0} fixed wait(s) now, ${count} listed: lower the count`)
  expect(stale).toEqual([])
})
