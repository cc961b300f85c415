/**
 * The policy's cut-offs at their boundaries, on a moved clock (no sleeps):
 * the fragment every query uses, the text the gauges use, and the TypeScript
 * form the claim uses agree to the microsecond; and no cut-off is written
 * anywhere else in src.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { hold } from '../../src/core/hold'
import { cutoffText, expired, forceExpirable, isExpiredAge, releasedExpired, stale } from '../../src/core/policy'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { createKey, identity, secondsAfter } from '../support/keys'

const T0 = new Date('2026-03-01T00:00:00.000Z')
const TTL = 30
const RETENTION = 600

let db: TestDatabase
beforeAll(async () => {
  db = await createTestDatabase('policy')
})
afterAll(() => db?.drop())

type Judged = 'stale' | 'expired' | 'releasedExpired'

async function judge(name: Judged, tenant: string, key: string, at: Date, seconds: number) {
  const sql = db.pools.short
  const fragment = name === 'stale' ? stale(sql, at) : { expired, releasedExpired }[name](sql, at, seconds)
  const [byFragment] = await sql<{ hit: boolean; age: number }[]>`
    select ${fragment} as hit,
           extract(epoch from (${at}::timestamptz - coalesce(k.completed_at, k.released_at, k.locked_at)))::float8 as age
      from idempotency_key_states k where k.tenant = ${tenant} and k.key = ${key}`
  const [byText] = await sql.unsafe<{ hit: boolean }[]>(
    `select ${cutoffText(name, '$1::timestamptz', '$2::float8')} as hit, $2::float8 as seconds from idempotency_key_states k where k.tenant = $3 and k.key = $4`, [at, seconds, tenant, key])
  expect(byText!.hit).toBe(byFragment!.hit)
  return byFragment!
}

describe('cut-offs at their boundaries', () => {
  test('stale: a processing key is stale from exactly its own deadline (stale_at) on; a done key never', async () => {
    const id = identity({ tenant: 'pol-stale' })
    await createKey(db.sql, id, { status: 'processing', lockedAt: T0 })
    // A hand-written row gets the default TTL (sql/engine/00005's trigger); the engine writes its route's.
    const [row] = await db.sql<{ stale_at: Date }[]>`select stale_at from idempotency_key_states where tenant = ${id.tenant} and key = ${id.key}`
    expect(row!.stale_at).toEqual(secondsAfter(T0, TTL))
    for (const [offset, want] of [[TTL - 0.001, false], [TTL, true], [TTL + 60, true]] as const) {
      const { hit } = await judge('stale', id.tenant, id.key, secondsAfter(T0, offset), TTL)
      expect({ offset, hit }).toEqual({ offset, hit: want })
    }
    // Another TTL on the row is that row's deadline: no setting decides it.
    await db.sql`update idempotency_keys set stale_at = ${secondsAfter(T0, 5)} where tenant = ${id.tenant} and key = ${id.key}`
    expect((await judge('stale', id.tenant, id.key, secondsAfter(T0, 5), TTL)).hit).toBe(true)
    const done = identity({ tenant: 'pol-stale' })
    await createKey(db.sql, done, { status: 'done', lockedAt: T0, completedAt: T0 })
    expect((await judge('stale', done.tenant, done.key, secondsAfter(T0, 10 * TTL), TTL)).hit).toBe(false)
  })

  test('expired: a done key leaves its retention counted from its completion, not its claim', async () => {
    const id = identity({ tenant: 'pol-exp' })
    await createKey(db.sql, id, { status: 'done', lockedAt: secondsAfter(T0, -5000), completedAt: T0 })
    for (const [offset, want] of [[RETENTION - 0.001, false], [RETENTION, true]] as const) {
      const { hit, age } = await judge('expired', id.tenant, id.key, secondsAfter(T0, offset), RETENTION)
      expect({ offset, hit }).toEqual({ offset, hit: want })
      expect(isExpiredAge(age, RETENTION)).toBe(want)
    }
  })

  test('released-expired: a released key counts from its release, and only released keys count', async () => {
    const id = identity({ tenant: 'pol-rel' })
    await db.sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, released_at)
      values (${id.tenant}, ${id.key}, 'POST', '/api/payments', ${id.fingerprint}, 'released', ${secondsAfter(T0, -9000)}, ${secondsAfter(T0, -9000)}, ${T0})`
    expect((await judge('releasedExpired', id.tenant, id.key, secondsAfter(T0, RETENTION - 1), RETENTION)).hit).toBe(false)
    expect((await judge('releasedExpired', id.tenant, id.key, secondsAfter(T0, RETENTION), RETENTION)).hit).toBe(true)
    expect((await judge('expired', id.tenant, id.key, secondsAfter(T0, 10 * RETENTION), RETENTION)).hit).toBe(false)
  })
})

describe('force-expirable', () => {
  async function expirable(lockedAt: Date, heartbeatAt: Date | null | 'missing', at: Date): Promise<boolean> {
    const id = identity({ tenant: 'pol-force' })
    await createKey(db.sql, id, { status: 'processing', lockedAt })
    if (heartbeatAt !== null) {
      const owner = crypto.randomUUID()
      if (heartbeatAt !== 'missing') await db.sql`insert into idempotency_processes (id, pid, hostname, heartbeat_at) values (${owner}, 1, 'test', ${heartbeatAt})`
      await db.sql`update idempotency_keys set owner = ${owner} where tenant = ${id.tenant} and key = ${id.key}`
    }
    const sql = db.pools.short
    const [row] = await sql<{ hit: boolean }[]>`select ${forceExpirable(sql, at)} as hit from idempotency_key_states k where k.tenant = ${id.tenant} and k.key = ${id.key}`
    return row!.hit
  }

  test('within its deadline only when the owner is gone; past it always', async () => {
    const at = secondsAfter(T0, 5)
    expect(await expirable(T0, at, at)).toBe(false) // owner beating, within the TTL
    expect(await expirable(T0, null, at)).toBe(false) // no owner recorded: taken for alive
    expect(await expirable(T0, secondsAfter(T0, -60), at)).toBe(true) // owner silent for a minute
    expect(await expirable(T0, 'missing', at)).toBe(true) // owner row gone
    expect(await expirable(T0, secondsAfter(T0, TTL), secondsAfter(T0, TTL))).toBe(true) // past the deadline, beating or not
  })

  // Catches: a held key (the gateway's unknown outcome) that an operator cannot release before its TTL, or a hold
  // mark that makes a key with an owner expirable while its owner beats.
  test('a held key (no owner, marked held) at once; a key with a beating owner not, whatever its summary says', async () => {
    const at = secondsAfter(T0, 5)
    const held = identity({ tenant: 'pol-held' })
    await createKey(db.sql, held, { status: 'processing', lockedAt: T0 })
    const [{ lease }] = await db.sql<{ lease: string }[]>`select lease::text from idempotency_key_states where tenant = ${held.tenant} and key = ${held.key}` as unknown as [{ lease: string }]
    const sql = db.pools.short
    const judged = async (key: string) =>
      (await sql<{ hit: boolean }[]>`select ${forceExpirable(sql, at)} as hit from idempotency_key_states k where k.tenant = 'pol-held' and k.key = ${key}`)[0]!.hit
    expect(await judged(held.key)).toBe(false) // no owner, not held: taken for alive
    expect(await hold(sql, { tenant: held.tenant, key: held.key, lease }, 'the upstream\'s answer was lost')).toBe(true)
    expect(await judged(held.key)).toBe(true)
    const owned = identity({ tenant: 'pol-held' })
    await createKey(db.sql, owned, { status: 'processing', lockedAt: T0 })
    const owner = crypto.randomUUID()
    await db.sql`insert into idempotency_processes (id, pid, hostname, heartbeat_at) values (${owner}, 1, 'test', ${at})`
    await db.sql`update idempotency_keys set owner = ${owner}, summary = '{"held": "says the client"}' where tenant = ${owned.tenant} and key = ${owned.key}`
    expect(await judged(owned.key)).toBe(false)
  })
})

describe('one home', () => {
  /** Every file under src, with what it is allowed to say about time. */
  const files = [...new Bun.Glob('src/**/*.{ts,tsx}').scanSync('.')]
  const read = (file: string) => readFileSync(file, 'utf8')

  test('no query outside policy.ts writes a stale, expired or released cut-off of its own', () => {
    const offenders: string[] = []
    for (const file of files) {
      if (file === 'src/core/policy.ts') continue
      const text = read(file)
      if (/(locked_at|completed_at|released_at|stale_at)\s*<=/.test(text)) offenders.push(`${file}: a cut-off comparison`)
      // make_interval(secs => ...) is how a cut-off is written; the liveness window (processes.ts, re-exported by the
      // policy), the duplicates gauge's window and the admin sessions' idle and lifetime windows (not key lifecycle rules) are the only others.
      if (/make_interval\(secs/.test(text) && !['src/core/processes.ts', 'src/metrics/read-duplicates.ts', 'src/admin/sessions.ts'].includes(file)) offenders.push(`${file}: make_interval`)
    }
    expect(files.length).toBeGreaterThan(30)
    expect(offenders).toEqual([])
  })

  test('the defaults are defined once: config and the admin take them from the policy', () => {
    const defines = files.filter((file) => /export const DEFAULT_(TTL|RETENTION)_SECONDS\s*=/.test(read(file)))
    expect(defines).toEqual(['src/core/policy.ts'])
    expect(read('src/admin/routes.ts')).not.toMatch(/\?\?\s*(30|86_?400)\b/)
  })
})
