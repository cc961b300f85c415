/** The retention purge deletes completed keys past retention, and nothing else, while traffic runs. */
import { afterAll, beforeAll, beforeEach, expect, test } from 'bun:test'
import { claim } from '../../src/core/claim'
import { complete } from '../../src/core/complete'
import { purgeExpired, purgeExpiredBatch } from '../../src/core/purge'
import { PURGE_PAUSE_BOUNDS_MS, purgePauseMs, startRetentionPurge } from '../../src/maintenance/retention-purge'
import { processAlive, startHeartbeat } from '../../src/core/processes'
import { operations } from '../../src/operations'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, postPayment } from '../support/http'
import { createKeys, deleteKeys, identity, secondsBefore } from '../support/keys'
import { startServer } from '../support/server'
import { waitFor } from '../support/wait'
import type { Logger } from '../../src/log'

const RETENTION = 3600
/** Enough batches (50 per purger at 100 rows) that the purge overlaps the traffic. */
const EXPIRED = 10_000
const timing = { ttlSeconds: 30, retentionSeconds: RETENTION }

let db: TestDatabase
beforeAll(async () => {
  db = await createTestDatabase('purge')
})
afterAll(() => db?.drop())
// A stopped process's row stays while its retention lasts (core/processes.ts): each test starts without the last one's.
beforeEach(async () => {
  await db.sql`delete from idempotency_processes`
})

/** Completed keys as finished workers leave them, completed `ageSeconds` ago. */
async function seedDone(prefix: string, count: number, ageSeconds: number): Promise<void> {
  const now = new Date()
  await createKeys(db.sql, count, { prefix, status: 'done', lockedAt: secondsBefore(now, ageSeconds + 1), completedAt: secondsBefore(now, ageSeconds) })
}

const count = async (where: string) => (await db.sql.unsafe(`select count(*)::int as n from idempotency_key_states where ${where}`))[0]!.n as number

test('two purgers under concurrent claims and completions delete only completed keys past retention', async () => {
  await seedDone('expired-', EXPIRED, RETENTION + 600)
  await seedDone('kept-', 300, RETENTION - 600)
  await createKeys(db.sql, 100, { prefix: 'stuck-', status: 'processing', lockedAt: secondsBefore(new Date(), 2 * 3600) })

  let purged = 0
  const purgers = [1, 2].map(() => startRetentionPurge({ sql: db.pools.short, retentionSeconds: RETENTION, batchSize: 100, pauseMs: 2, intervalMs: 3_600_000, onPurged: (deleted) => { purged += deleted } }))
  let trafficOn = true
  const completed = new Set<string>()
  const answers = new Map<string, number>()
  // Traffic: new keys, and retries that reuse expired keys (a claim renews those: claim.ts renewExpired).
  async function traffic(worker: number): Promise<void> {
    for (let i = 0; trafficOn; i++) {
      const key = i % 3 === 0 ? `expired-${1 + ((worker * 997 + i * 31) % EXPIRED)}` : `new-${worker}-${i}`
      const result = await claim(db.pools.short, identity({ key, body: { worker, i } }), timing)
      answers.set(result.kind, (answers.get(result.kind) ?? 0) + 1)
      if (result.kind !== 'created' && result.kind !== 'reclaimed') continue
      await complete(db.pools.work, result.lease, async () => ({ status: 201, headers: {}, body: '{}' }))
      completed.add(key)
    }
  }
  const workers = [0, 1, 2].map(traffic)
  const runs = await Promise.all(purgers.map((purger) => purger.runOnce()))
  trafficOn = false
  await Promise.all(workers)
  await Promise.all(purgers.map((purger) => purger.stop()))
  console.log('purge runs deleted', runs, 'claims:', Object.fromEntries(answers))

  // Nothing but completed-and-expired keys went away.
  expect(await count(`key like 'kept-%' and status = 'done'`)).toBe(300)
  expect(await count(`key like 'stuck-%' and status = 'processing'`)).toBe(100)
  for (const key of completed) expect(await count(`key = '${key}' and status = 'done'`)).toBe(1)
  // An expired key no retry touched is gone; one a retry touched may live again (renewed, or re-created after the purge).
  const touched = [...completed].filter((key) => key.startsWith('expired-'))
  const present = (await db.sql<{ key: string }[]>`select key from idempotency_key_states where key like 'expired-%'`).map((row) => row.key)
  for (const key of present) expect(touched).toContain(key)
  expect(await count(`status = 'done' and completed_at <= now() - interval '${RETENTION} seconds'`)).toBe(0)
  expect(purged).toBeLessThanOrEqual(EXPIRED)
  expect(purged).toBeGreaterThanOrEqual(EXPIRED - touched.length)
  expect(runs[0]! + runs[1]!).toBe(purged)
  expect(runs[0]).toBeGreaterThan(0) // both purgers did share the work (SKIP LOCKED)
  expect(runs[1]).toBeGreaterThan(0)
}, 30_000)

test('a purge batch skips rows another transaction holds, and deletes them once free', async () => {
  await seedDone('held-', 5, RETENTION + 60)
  const holder = await db.sql.reserve()
  await holder`begin`
  await holder`select 1 from idempotency_keys where key = 'held-1' for update`
  try {
    expect(await purgeExpired(db.pools.short, { retentionSeconds: RETENTION })).toBe(4)
  } finally {
    await holder`rollback`
    holder.release()
  }
  expect(await purgeExpired(db.pools.short, { retentionSeconds: RETENTION })).toBe(1)
})

// Catches: a run whose every batch starts at the oldest key, walking again every key it already deleted
// (they stay in the created_at index until vacuum: 62 ms a batch against 3.2 ms at 10 M keys, BENCHMARKS.md).
test('a run goes on from where its last batch ended; a key skipped while locked waits for the next run', async () => {
  await deleteKeys(db.sql)
  // Six expired keys created a second apart, the oldest first.
  for (let i = 0; i < 6; i++) await seedDone(`step-${i}-`, 1, RETENTION + 600 - i)
  const holder = await db.sql.reserve()
  await holder`begin`
  await holder`select 1 from idempotency_keys where key = 'step-0-1' for update`
  let first: Awaited<ReturnType<typeof purgeExpiredBatch>>
  try {
    first = await purgeExpiredBatch(db.pools.short, { retentionSeconds: RETENTION, batchSize: 2 })
  } finally {
    await holder`rollback`
    holder.release()
  }
  expect(first.deleted).toBe(2)
  // It ended at step-2 (step-1 and step-2 deleted, step-0 held): before step-3, after step-1.
  const createdAt = async (key: string) => (await db.sql<{ t: Date }[]>`select created_at as t from idempotency_key_states where key = ${key}`)[0]!.t.getTime()
  expect(first.through!.getTime()).toBeLessThan(await createdAt('step-3-1'))
  expect(first.through!.getTime()).toBeGreaterThan(await createdAt('step-0-1') + 1000)
  // The same run's next batch: the keys after the first batch's, not the one it skipped.
  expect((await purgeExpiredBatch(db.pools.short, { retentionSeconds: RETENTION, from: first.through! })).deleted).toBe(3)
  expect((await db.sql<{ key: string }[]>`select key from idempotency_key_states`).map((row) => row.key)).toEqual(['step-0-1'])
  // The next run starts at the oldest.
  expect(await purgeExpired(db.pools.short, { retentionSeconds: RETENTION })).toBe(1)
})

test('with `now` moved forward, the purge deletes what has expired by then (no sleeping)', async () => {
  await deleteKeys(db.sql)
  await seedDone('later-', 3, 10)
  expect(await purgeExpired(db.pools.short, { retentionSeconds: RETENTION })).toBe(0)
  expect(await purgeExpired(db.pools.short, { retentionSeconds: RETENTION, now: new Date(Date.now() + RETENTION * 1000) })).toBe(3)
})

test('after each full batch the purge pauses three times as long as the batch took (a quarter of a connection), within bounds', async () => {
  await deleteKeys(db.sql)
  await seedDone('paced-', 35, RETENTION + 60)
  // Each batch takes 3 ms by this clock, whatever the machine: a pause of 9 ms after each full one.
  let tick = 0
  const pauses: [number, number][] = []
  const purge = startRetentionPurge({
    sql: db.pools.short, retentionSeconds: RETENTION, batchSize: 10, intervalMs: 3_600_000,
    clock: () => (tick += 3), onPause: (pauseMs, batchMs) => { pauses.push([Math.round(pauseMs * 1000) / 1000, batchMs]) },
  })
  try {
    expect(await purge.runOnce()).toBe(35)
  } finally {
    await purge.stop()
  }
  expect(pauses).toEqual([[9, 3], [9, 3], [9, 3]]) // three full batches; the short fourth ends the run
  // A batch of no time still pauses; one that took seconds stops the purge for 2 s at most.
  expect(purgePauseMs(0)).toBe(PURGE_PAUSE_BOUNDS_MS.min)
  expect(purgePauseMs(10)).toBeCloseTo(30)
  expect(purgePauseMs(5_000)).toBe(PURGE_PAUSE_BOUNDS_MS.max)
})

/** The pauses of one purge run over 25 expired keys in batches of 10, each batch timed at 3 ms, with `processes` beating beside it. */
async function pausesBeside(prefix: string, processes: readonly Record<string, unknown>[]): Promise<number[]> {
  await deleteKeys(db.sql)
  await seedDone(prefix, 25, RETENTION + 60)
  const rows = processes.map((row) => ({ id: crypto.randomUUID(), pid: 1, hostname: 'purge-test', ...row }))
  await db.sql`insert into idempotency_processes ${db.sql(rows)}`
  let tick = 0
  const pauses: number[] = []
  const purge = startRetentionPurge({
    sql: db.pools.short, retentionSeconds: RETENTION, batchSize: 10, intervalMs: 3_600_000,
    clock: () => (tick += 3), onPause: (pauseMs) => { pauses.push(Math.round(pauseMs * 1000) / 1000) },
  })
  try {
    expect(await purge.runOnce()).toBe(25)
  } finally {
    await purge.stop()
    await db.sql`delete from idempotency_processes where hostname = 'purge-test'`
  }
  return pauses
}

test('live processes share the quarter: with three heartbeats each purge pauses eleven times its batch', async () => {
  // Three server processes beating, and one gone (its heartbeat a minute old), which does not count.
  const pauses = await pausesBeside('shared-', [0, 0, 0, 60].map((age) => ({ heartbeat_at: secondsBefore(new Date(), age) })))
  // A twelfth of a connection each (0.25 / 3): 3 ms of batch, 33 ms of pause; three of them take the quarter together.
  expect(pauses).toEqual([33, 33])
  expect(purgePauseMs(3, 3)).toBeCloseTo(33)
  expect(purgePauseMs(3, 0)).toBeCloseTo(9) // no heartbeat (a purge outside a server): the whole quarter
})

test('a process that beats without a purge takes no part of the quarter; one that does not say, or an earlier release\'s, does', async () => {
  // One that said it purges, one that said nothing (an earlier release: counted as purging), two that beat without a purge.
  const pauses = await pausesBeside('apart-', [true, null, false, false].map((purges) => ({ purges })))
  // Two purgers counted: an eighth each, 3 ms of batch and 21 of pause (four live processes would make it 45).
  expect(pauses).toEqual([21, 21])
})

test('a heartbeat says whether its process purges and how long it keeps keys, and an earlier release\'s row says nothing', async () => {
  const [purging, beating, unsaid] = await Promise.all([true, false, undefined].map((purges) => startHeartbeat(db.pools.short, purges === undefined ? {} : { purges, retentionSeconds: purges ? 600 : 60 })))
  try {
    const rows = await db.sql<{ id: string; purges: boolean | null; retention_seconds: number | null }[]>`
      select id::text, purges, retention_seconds from idempotency_processes where id in ${db.sql([purging!.id, beating!.id, unsaid!.id])}`
    const said = (id: string) => rows.find((row) => row.id === id)
    expect([purging!, beating!, unsaid!].map(({ id }) => [said(id)?.purges, said(id)?.retention_seconds])).toEqual([[true, 600], [false, 60], [null, null]])
  } finally {
    await Promise.all([purging, beating, unsaid].map((heartbeat) => heartbeat!.stop()))
  }
})

test('purges told their heartbeat take turns: only the oldest live process that purges deletes, at the whole quarter, and the next takes over when it stops', async () => {
  await deleteKeys(db.sql)
  await seedDone('turns-', 25, RETENTION + 60)
  // Beside them: a process that said nothing, which shares by count (the leader counts it), and an older one that beats without a purge.
  const others = [{ purges: null }, { purges: false, started_at: secondsBefore(new Date(), 60) }]
  await db.sql`insert into idempotency_processes ${db.sql(others.map((row) => ({ id: crypto.randomUUID(), pid: 1, hostname: 'purge-test', ...row })))}`
  const older = await startHeartbeat(db.pools.short, { purges: true })
  const younger = await startHeartbeat(db.pools.short, { purges: true })
  await db.sql`update idempotency_processes set started_at = started_at + interval '1 second' where id = ${younger.id}`
  const lines: string[] = []
  const log = { info: (line: string) => lines.push(line), warn: () => undefined, error: () => undefined, debug: () => undefined }
  const pauses: number[] = []
  // One clock for both, 3 ms a reading.
  let tick = 0
  const start = (processId: string) => startRetentionPurge({
    sql: db.pools.short, retentionSeconds: RETENTION, batchSize: 10, intervalMs: 3_600_000, processId, log: log as unknown as Logger,
    clock: () => (tick += 3), onPause: (pauseMs) => { pauses.push(Math.round(pauseMs * 1000) / 1000) },
  })
  const [first, second] = [start(older.id), start(younger.id)]
  try {
    expect(await second.runOnce()).toBe(0)
    expect(lines).toEqual(['retention purge: another process purges; this one stands by'])
    expect(await count(`key like 'turns-%'`)).toBe(25)
    // The leader and the process that did not say: an eighth of a connection, 21 ms of pause for 3 of batch.
    expect(await first.runOnce()).toBe(25)
    expect(pauses).toEqual([21, 21])
    // The leader stops (its heartbeat row goes): the next run of the other purges.
    await seedDone('turns-next-', 5, RETENTION + 60)
    await older.stop()
    // Until the stand-by counts again, a heartbeat's interval later, it stands by.
    expect(await second.runOnce()).toBe(0)
    tick += 2_000
    expect(await second.runOnce()).toBe(5)
    expect(lines.slice(-2)).toEqual(['retention purge: this process purges now', 'retention purge: deleted 5 expired key(s)'])
  } finally {
    await Promise.all([first.stop(), second.stop()])
    await Promise.all([older.stop(), younger.stop()])
    await db.sql`delete from idempotency_processes where hostname = 'purge-test'`
  }
})

test('a purge keeps keys as long as the longest retention a process says, live or gone less than that ago', async () => {
  await deleteKeys(db.sql)
  // Past this process's retention by a minute (another process still replays them), and past both.
  await seedDone('kept-', 3, RETENTION + 60)
  await seedDone('kept-old-', 2, 2 * RETENTION + 60)
  const own = await startHeartbeat(db.pools.short, { purges: true, retentionSeconds: RETENTION })
  // Beside it: one that beats without a purge and keeps keys twice as long, and one that does not say (an earlier release).
  const longer = await startHeartbeat(db.pools.short, { purges: false, retentionSeconds: 2 * RETENTION })
  const unsaid = await startHeartbeat(db.pools.short, {})
  const lines: string[] = []
  const log = { info: (line: string) => lines.push(line), warn: () => undefined, error: () => undefined, debug: () => undefined }
  let tick = 0
  const purge = startRetentionPurge({
    sql: db.pools.short, retentionSeconds: RETENTION, batchSize: 10, intervalMs: 3_600_000, processId: own.id, log: log as unknown as Logger, clock: () => (tick += 3),
  })
  const ops = operations({ sql: db.pools.short, ttlSeconds: 30, retentionSeconds: RETENTION, log: { info: () => undefined, warn: () => undefined, error: () => undefined, debug: () => undefined } as unknown as Logger })
  try {
    expect(await purge.runOnce()).toBe(2)
    expect(await count(`key like 'kept-%' and key not like 'kept-old-%'`)).toBe(3)
    expect(lines[0]).toBe(`retention purge: a process keeps keys for ${2 * RETENTION} s (live, or gone less than that ago), longer than this process's ${RETENTION} s; deleting past the longer`)
    // An operator's purge, its preview and the counts go by the same retention.
    expect(await ops.previewPurge()).toMatchObject({ done: 0, released: 0, retentionSeconds: 2 * RETENTION })
    expect((await ops.count({ staleOnly: false })).expired).toBe(0)
    expect((await ops.purge('purge-test')).purged).toBe(0)
    // The longer-lived process stops (scaled to zero, or down for a deploy): it is gone at once to every reader,
    // yet a client's retry once it is back must still replay what it completed, so its keys stay.
    await longer.stop()
    const [gone] = await db.sql<{ alive: boolean }[]>`select ${processAlive(db.sql)} as alive from idempotency_processes p where id = ${longer.id}`
    expect(gone?.alive).toBe(false)
    tick += 2_000
    expect(await purge.runOnce()).toBe(0)
    expect(await count(`key like 'kept-%'`)).toBe(3)
    expect((await ops.previewPurge()).retentionSeconds).toBe(2 * RETENTION)
    // Its retention since its last beat passes (its row dated back by as much): the purge goes by its own again.
    await db.sql`update idempotency_processes set heartbeat_at = heartbeat_at - make_interval(secs => ${2 * RETENTION}) where id = ${longer.id}`
    tick += 2_000
    expect(await purge.runOnce()).toBe(3)
    expect(lines.slice(-2)).toEqual([`retention purge: deletes keys past this process's retention (${RETENTION} s) again`, 'retention purge: deleted 3 expired key(s)'])
  } finally {
    await purge.stop()
    await Promise.all([own.stop(), longer.stop(), unsaid.stop()])
    await db.sql`delete from idempotency_processes where id in ${db.sql([own.id, longer.id])}`
  }
})

test('a process that died is kept to its retention as one that stopped; a stop without a retention leaves no row', async () => {
  await deleteKeys(db.sql)
  await seedDone('died-', 2, RETENTION + 60)
  // SIGKILLed half an hour ago, keeping keys twice as long as this process: its row stays as its last beat left it.
  const died = crypto.randomUUID()
  await db.sql`insert into idempotency_processes (id, pid, hostname, purges, retention_seconds, heartbeat_at, started_at)
               values (${died}, 1, 'purge-test', false, ${2 * RETENTION}, now() - interval '30 minutes', now() - interval '1 hour')`
  const plain = await startHeartbeat(db.pools.short, { purges: false })
  // A clock a heartbeat's interval on at every reading: each run counts the processes again.
  let tick = 0
  const purge = startRetentionPurge({ sql: db.pools.short, retentionSeconds: RETENTION, batchSize: 10, intervalMs: 3_600_000, clock: () => (tick += 2_000) })
  try {
    expect(await purge.runOnce()).toBe(0)
    expect(await count(`key like 'died-%'`)).toBe(2)
    await plain.stop()
    expect(await db.sql`select 1 from idempotency_processes where id = ${plain.id}`).toHaveLength(0)
    // Gone for longer than its retention: forgotten.
    await db.sql`update idempotency_processes set heartbeat_at = now() - make_interval(secs => ${2 * RETENTION + 60}) where id = ${died}`
    expect(await purge.runOnce()).toBe(2)
  } finally {
    await purge.stop()
    await plain.stop()
    await db.sql`delete from idempotency_processes where id = ${died}`
  }
})

test('a purge told its heartbeat purges when no live process says it purges (its own heartbeat failing)', async () => {
  await deleteKeys(db.sql)
  await seedDone('alone-', 5, RETENTION + 60)
  // A process that says it purges, but whose heartbeat is a minute old: gone.
  await db.sql`insert into idempotency_processes (id, pid, hostname, purges, heartbeat_at, started_at)
               values (${crypto.randomUUID()}, 1, 'purge-test', true, now() - interval '1 minute', now() - interval '1 hour')`
  const purge = startRetentionPurge({ sql: db.pools.short, retentionSeconds: RETENTION, batchSize: 10, intervalMs: 3_600_000, processId: crypto.randomUUID() })
  try {
    expect(await purge.runOnce()).toBe(5)
  } finally {
    await purge.stop()
    await db.sql`delete from idempotency_processes where hostname = 'purge-test'`
  }
})

test('a process that starts during a run is counted within a heartbeat interval, not at the next run', async () => {
  await deleteKeys(db.sql)
  await seedDone('joined-', 35, RETENTION + 60)
  let tick = 0
  const pauses: number[] = []
  const purge = startRetentionPurge({
    sql: db.pools.short, retentionSeconds: RETENTION, batchSize: 10, intervalMs: 3_600_000,
    clock: () => (tick += 3),
    onPause: async (pauseMs) => {
      pauses.push(Math.round(pauseMs * 1000) / 1000)
      if (pauses.length > 1) return
      // After the first batch two processes start beating, and a heartbeat's interval passes.
      const joined = [0, 0].map(() => ({ id: crypto.randomUUID(), pid: 1, hostname: 'purge-test' }))
      await db.sql`insert into idempotency_processes ${db.sql(joined)}`
      tick += 2_000
    },
  })
  try {
    expect(await purge.runOnce()).toBe(35)
  } finally {
    await purge.stop()
    await db.sql`delete from idempotency_processes where hostname = 'purge-test'`
  }
  // Alone: 3 x 3 ms. Then two: an eighth each, 7 x 3 ms.
  expect(pauses).toEqual([9, 21, 21])
})

test('a run that stops at its batch limit with a backlog left is followed by the next at once, not after the interval', async () => {
  await deleteKeys(db.sql)
  await seedDone('backlog-', 55, RETENTION + 60)
  const deleted: number[] = []
  const log = { info: (_: string, fields?: { purged?: number }) => { if (fields?.purged) deleted.push(fields.purged) }, warn: () => undefined, error: () => undefined, debug: () => undefined }
  // Runs of 2 batches of 10: three runs back to back clear the 55, though the interval is an hour.
  const purge = startRetentionPurge({
    sql: db.pools.short, retentionSeconds: RETENTION, batchSize: 10, batchesPerRun: 2, pauseMs: 1,
    intervalMs: 3_600_000, firstRunMs: 0, log: log as unknown as Logger,
  })
  try {
    await waitFor(async () => await count(`key like 'backlog-%'`) === 0, () => `the backlog to be purged (runs so far deleted ${deleted.join(', ')})`)
  } finally {
    await purge.stop()
  }
  expect(deleted).toEqual([20, 20, 15])
})

test('the server runs the purge in the background and counts it', async () => {
  const server = await startServer(db.url, { IDEMPOTENCY_TTL_SECONDS: '1', IDEMPOTENCY_RETENTION_SECONDS: '1', PURGE_INTERVAL_MS: '200' })
  try {
    const key = `bg-${crypto.randomUUID()}`
    expect((await postPayment(server.url, payment(), { key })).status).toBe(201)
    // Past the 1 s retention, a purge run (every 200 ms) deletes it: the row going is the signal.
    await waitFor(async () => (await count(`key = '${key}'`)) === 0, `the server's purge to delete key ${key}`)
    expect(await count(`key = '${key}'`)).toBe(0)
    const exposition = await (await fetch(`${server.url}/metrics`)).text()
    const purged = Number(/idempotency_purged_keys_total (\d+)/.exec(exposition)?.[1] ?? 0)
    expect(purged).toBeGreaterThanOrEqual(1)
    // Its heartbeat says it purges: the other processes' purges count it in sharing the quarter.
    const [beat] = await db.sql<{ purges: boolean | null }[]>`select purges from idempotency_processes where hostname <> 'purge-test' and pid = ${server.proc.pid}`
    expect(beat?.purges).toBe(true)
    // Past retention the key is new again: a fresh payment, not a replay.
    const again = await postPayment(server.url, payment({ amount: 99 }), { key })
    expect(again.status).toBe(201)
    expect(again.headers.get('idempotent-replayed')).toBeNull()
  } finally {
    await server.stop()
  }
}, 30_000)

test('two servers take turns: the younger stands by while the older purges, and purges once the older stops', async () => {
  const env = { IDEMPOTENCY_TTL_SECONDS: '1', IDEMPOTENCY_RETENTION_SECONDS: '1', PURGE_INTERVAL_MS: '200' }
  const older = await startServer(db.url, env)
  const younger = await startServer(db.url, env)
  const purged = async (server: { url: string }) => Number(/idempotency_purged_keys_total (\d+)/.exec(await (await fetch(`${server.url}/metrics`)).text())?.[1] ?? 0)
  let olderStopped = false
  try {
    await waitFor(() => younger.output().includes('another process purges; this one stands by'), 'the younger server to stand by')
    const key = `turn-${crypto.randomUUID()}`
    expect((await postPayment(younger.url, payment(), { key })).status).toBe(201)
    await waitFor(async () => (await count(`key = '${key}'`)) === 0, `the older server's purge to delete key ${key}`)
    expect(await purged(older)).toBeGreaterThanOrEqual(1)
    expect(await purged(younger)).toBe(0)
    await older.stop()
    olderStopped = true
    const next = `turn-next-${crypto.randomUUID()}`
    expect((await postPayment(younger.url, payment(), { key: next })).status).toBe(201)
    await waitFor(async () => (await count(`key = '${next}'`)) === 0, `the younger server's purge to delete key ${next}`)
    expect(younger.output()).toContain('this process purges now')
    expect(await purged(younger)).toBeGreaterThanOrEqual(1)
  } finally {
    await Promise.all([olderStopped ? undefined : older.stop(), younger.stop()])
  }
}, 60_000)

test('a server that does not purge shows it: idempotency_purge_overdue_seconds grows with the keys past its retention', async () => {
  await deleteKeys(db.sql)
  // Its purge an hour away, its retention a minute: a key completed ten minutes ago waits nine past it.
  const server = await startServer(db.url, { IDEMPOTENCY_RETENTION_SECONDS: '60', PURGE_INTERVAL_MS: '3600000', METRICS_CACHE_MS: '0' })
  try {
    await seedDone('overdue-', 1, 600)
    const text = await (await fetch(`${server.url}/metrics`)).text()
    const overdue = Number(/\nidempotency_purge_overdue_seconds (\S+)/.exec(text)?.[1])
    expect(overdue).toBeGreaterThanOrEqual(540)
    expect(overdue).toBeLessThan(600)
  } finally {
    await server.stop()
  }
}, 30_000)

test('two servers with different retentions on one database: the shorter one\'s purge keeps what the longer one still replays, also while it is stopped', async () => {
  await deleteKeys(db.sql)
  const env = { IDEMPOTENCY_TTL_SECONDS: '1', PURGE_INTERVAL_MS: '200', METRICS_CACHE_MS: '0' }
  // The older purges (the purges take turns); its retention is 10 s, the younger's 10 minutes.
  const shorter = await startServer(db.url, { ...env, IDEMPOTENCY_RETENTION_SECONDS: '10' })
  const longer = await startServer(db.url, { ...env, IDEMPOTENCY_RETENTION_SECONDS: '600' })
  try {
    await waitFor(() => shorter.output().includes('a process keeps keys for 600 s'), 'the purging server to see the longer retention')
    const kept = `kept-${crypto.randomUUID()}`
    const body = payment()
    const first = await postPayment(longer.url, body, { key: kept })
    expect(first.status).toBe(201)
    const answer = await first.json()
    // Completed a minute ago: past the purging server's retention, within the other's; and one past both.
    await db.sql`update idempotency_keys set completed_at = completed_at - interval '1 minute', created_at = created_at - interval '1 minute' where key = ${kept}`
    await seedDone('gone-', 1, 700)
    await waitFor(async () => (await count(`key like 'gone-%'`)) === 0, 'the purge to delete the key past both retentions')
    expect(await count(`key = '${kept}'`)).toBe(1)
    // What the purging server's gauge says waits is what its purge deletes: nothing.
    const overdue = Number(/\nidempotency_purge_overdue_seconds (\S+)/.exec(await (await fetch(`${shorter.url}/metrics`)).text())?.[1])
    expect(overdue).toBe(0)
    // The client's retry gets the answer it lost, not a second charge.
    const retry = await postPayment(longer.url, body, { key: kept })
    expect(retry.status).toBe(201)
    expect(retry.headers.get('idempotent-replayed')).toBe('true')
    expect(await retry.json()).toEqual(answer)
    expect(await count(`key = '${kept}'`)).toBe(1)
    // The longer-lived server stops (scaled to zero, down for a deploy): its keys stay its own while it is away.
    await longer.stop()
    const overdueSince = Number(/\nidempotency_purge_overdue_seconds (\S+)/.exec(await (await fetch(`${shorter.url}/metrics`)).text())?.[1])
    expect(overdueSince).toBe(0)
    await seedDone('gone-again-', 1, 700)
    await waitFor(async () => (await count(`key like 'gone-again-%'`)) === 0, 'the purge to run after the stop')
    expect(await count(`key = '${kept}'`)).toBe(1)
    // Back up, the client's next retry is still replayed.
    const back = await startServer(db.url, { ...env, IDEMPOTENCY_RETENTION_SECONDS: '600' })
    try {
      const later = await postPayment(back.url, body, { key: kept })
      expect(later.headers.get('idempotent-replayed')).toBe('true')
      expect(await later.json()).toEqual(answer)
    } finally {
      await back.stop()
    }
    const [paid] = await db.sql<{ n: number }[]>`select count(*)::int as n from payments where idempotency_key = ${kept}`
    expect(paid?.n).toBe(1)
  } finally {
    await Promise.all([shorter.stop(), longer.stop()])
  }
}, 60_000)
