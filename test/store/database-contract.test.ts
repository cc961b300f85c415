/**
 * SPEC invariant 13: no database setting turns a request into a 5xx or a
 * charge without a payment.
 *
 * - A SQL_ASCII database counts bytes in the payments length checks: a valid
 *   customer of 64 emoji failed the completion after the provider charged,
 *   and every retry charged again. The service refuses such a database at
 *   start, before it migrates anything.
 * - `ALTER DATABASE ... SET default_transaction_isolation = 'serializable'`
 *   turned concurrent same-key requests into 500s (40001). The service pins
 *   READ COMMITTED in its startup parameters, as it does the timeouts.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import postgres from 'postgres'
import { openPools, SESSION_SETTINGS, sessionSettingsSql } from '../../src/store/db'
import { migrateService } from '../../src/store/migrate'
import { startApp } from '../support/app'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, paymentRequest } from '../support/http'
import { captureOutput, waitForListening } from '../support/process'
import { ADMIN_TOKEN, API_KEYS } from '../support/server'

const serverUrl = () => process.env.DATABASE_URL!
const withDatabase = (database: string) => Object.assign(new URL(serverUrl()), { pathname: `/${database}` }).toString()

describe('a database whose server_encoding is not UTF8', () => {
  const name = `idem_sql_ascii_${crypto.randomUUID().slice(0, 8)}`
  const admin = postgres(serverUrl(), { max: 1, onnotice: () => undefined })
  beforeAll(async () => {
    await admin.unsafe(`create database "${name}" encoding 'SQL_ASCII' lc_collate 'C' lc_ctype 'C' template template0`)
  })
  afterAll(async () => {
    await admin.unsafe(`drop database if exists "${name}" with (force)`)
    await admin.end()
  })

  test('is refused by the migration, which leaves nothing behind', async () => {
    await expect(migrateService(withDatabase(name))).rejects.toThrow(/server_encoding is SQL_ASCII.*UTF8/)
    const probe = postgres(withDatabase(name), { max: 1, onnotice: () => undefined })
    try {
      const [row] = await probe<{ keys: string | null }[]>`select to_regclass('idempotency_keys')::text as keys`
      expect(row!.keys).toBeNull()
    } finally {
      await probe.end()
    }
  })

  test('the service exits at start naming server_encoding, and serves nothing', async () => {
    const proc = Bun.spawn(['bun', 'src/main.ts'], {
      env: { ...process.env, DATABASE_URL: withDatabase(name), API_KEYS, ADMIN_TOKEN, NODE_ENV: 'test', PORT: '0', TEST_ALLOW_PORT_0: '1', PAYMENT_PROVIDER_URL: 'http://127.0.0.1:9' },
      stdout: 'pipe', stderr: 'pipe',
    })
    const output = captureOutput(proc)
    // Bounded: a service that does start is stopped, and the test fails on what it printed.
    const started = waitForListening(proc, output, 30_000)
    await Promise.race([proc.exited, started])
    if (proc.exitCode === null) proc.kill('SIGKILL')
    const code = await proc.exited
    expect(output()).not.toContain('listening on')
    expect(code).toBe(1)
    expect(output()).toContain('server_encoding is SQL_ASCII')
  })
})

describe('a database whose default isolation is serializable', () => {
  let db: TestDatabase
  beforeAll(async () => {
    db = await createTestDatabase('serializable')
    // Before any pooled connection opens: they all start under the new default.
    await db.sql.unsafe(`alter database "${new URL(db.url).pathname.slice(1)}" set default_transaction_isolation = 'serializable'`)
  })
  afterAll(() => db?.drop())

  test('the premise: a plain session there runs serializable', async () => {
    const plain = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      const [row] = await plain<{ level: string }[]>`select current_setting('transaction_isolation') as level`
      expect(row!.level).toBe('serializable')
    } finally {
      await plain.end()
    }
  })

  test('both pools run READ COMMITTED, in and out of a transaction', async () => {
    const pools = openPools(db.url, { applicationName: 'test:isolation' })
    try {
      const [short] = await pools.short<{ level: string }[]>`select current_setting('transaction_isolation') as level`
      const inside = await pools.work.begin((tx) => tx<{ level: string }[]>`select current_setting('transaction_isolation') as level`)
      expect([short!.level, inside[0]!.level]).toEqual(['read committed', 'read committed'])
    } finally {
      await pools.close(1)
    }
  })

  test('a retry storm on shared keys gets no 5xx: one payment per key', async () => {
    const app = await startApp(db, { faults: { delayMs: 5 } })
    const url = app.listen()
    try {
      // Each key by 4 clients at once, each retrying its 409s until it has the answer: claims, replays and completions of one key overlap.
      const keys = Array.from({ length: 100 }, (_, i) => `serializable-${i}-${crypto.randomUUID()}`)
      const statuses: number[] = []
      await Promise.all(keys.flatMap((key) => Array.from({ length: 8 }, async () => {
        for (let attempt = 0; attempt < 50; attempt++) {
          const response = await fetch(paymentRequest(url, payment({ customer: key }), { key }))
          await response.arrayBuffer()
          statuses.push(response.status)
          if (response.status !== 409) return
          await Bun.sleep(2)
        }
      })))
      const tally: Record<number, number> = {}
      for (const status of statuses) tally[status] = (tally[status] ?? 0) + 1
      expect(statuses.filter((status) => status >= 500), JSON.stringify(tally)).toEqual([])
      const [row] = await db.sql<{ payments: number }[]>`select count(*)::int as payments from payments`
      expect(row!.payments).toBe(keys.length)
    } finally {
      await app.stop()
    }
  })
})

test('behind PgBouncer the isolation is set on the role too, quoted', () => {
  expect(SESSION_SETTINGS).toHaveProperty('default_transaction_isolation', 'read committed')
  expect(sessionSettingsSql('svc', 'db')).toContain(`alter role "svc" in database "db" set default_transaction_isolation = 'read committed';`)
})

// Where the server can compile (its LLVM package installed, as Debian's is).
const jitAvailable = await (async () => {
  const probe = postgres(serverUrl(), { max: 1, onnotice: () => undefined })
  try {
    return (await probe<{ available: boolean }[]>`select pg_jit_available() as available`)[0]!.available
  } finally {
    await probe.end()
  }
})()

describe.if(jitAvailable)('a database that JIT-compiles every statement', () => {
  let db: TestDatabase
  const jitOf = async (sql: Pick<postgres.Sql<any>, 'unsafe'>) => {
    const [row] = await sql.unsafe<{ 'QUERY PLAN': { JIT?: unknown }[] }[]>(`explain (analyze, format json) select count(*) from idempotency_keys where created_at < now()`)
    return row!['QUERY PLAN'][0]!.JIT !== undefined
  }
  beforeAll(async () => {
    db = await createTestDatabase('jit')
    const name = new URL(db.url).pathname.slice(1)
    for (const setting of ['jit_above_cost', 'jit_inline_above_cost', 'jit_optimize_above_cost'])
      await db.sql.unsafe(`alter database "${name}" set ${setting} = 0`)
  })
  afterAll(() => db?.drop())

  test('the premise: a plain session there compiles a key-table read', async () => {
    const plain = postgres(db.url, { max: 1, onnotice: () => undefined })
    try {
      expect(await jitOf(plain)).toBe(true)
    } finally {
      await plain.end()
    }
  })

  // The purge's batch at 10 M keys spent 559 of its 566 ms compiling (BENCHMARKS.md): the engine's sessions never do.
  test('the engine\'s pools compile nothing, in and out of a transaction', async () => {
    const pools = openPools(db.url, { applicationName: 'test:jit' })
    try {
      expect([await jitOf(pools.short), await pools.work.begin((tx) => jitOf(tx))]).toEqual([false, false])
    } finally {
      await pools.close(1)
    }
  })
})
