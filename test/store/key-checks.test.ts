/**
 * sql/engine/00014: the key table's fingerprint and method checks, rewritten
 * without a counted repeat (a regex DFA built anew for every row), accept
 * exactly the values the old ones did, and are validated on a database of the
 * release before that has rows, while that release goes on claiming.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import postgres from 'postgres'
import { ENGINE_MIGRATIONS, migrate } from '../../src/store/migrate'
import { releaseBefore } from '../support/release-before'

const base = process.env.DATABASE_URL!
const name = `idem_key_checks_${crypto.randomUUID().slice(0, 8)}`
const url = Object.assign(new URL(base), { pathname: `/${name}` }).toString()
const engine13 = releaseBefore()
let sql: postgres.Sql

beforeAll(async () => {
  const admin = postgres(base, { max: 1, onnotice: () => undefined })
  await admin.unsafe(`create database "${name}"`)
  await admin.end()
  sql = postgres(url, { max: 2, onnotice: () => undefined })
  await migrate(url, { lines: [engine13.lineUpTo(ENGINE_MIGRATIONS, 13)] })
})

afterAll(async () => {
  await sql.end({ timeout: 1 })
  const admin = postgres(base, { max: 1, onnotice: () => undefined })
  await admin.unsafe(`drop database if exists "${name}" with (force)`)
  await admin.end()
  engine13.remove()
})

const HEX64 = 'a'.repeat(64)
/** Values at the edges of each old pattern, and the old pattern itself as the oracle. */
const FINGERPRINTS = [HEX64, '0123456789abcdef'.repeat(4), 'a'.repeat(63), 'a'.repeat(65), 'A'.repeat(64), `${'a'.repeat(63)}g`, `${'a'.repeat(63)}\n`, `\n${'a'.repeat(63)}`, `${'a'.repeat(64)}\n`, '', `${'a'.repeat(63)}٣`]
const METHODS = ['POST', 'A', 'A'.repeat(16), 'A'.repeat(17), '', 'post', 'POST\n', 'PÖST', 'PO ST', 'POST1']

async function claimWith(method: string, fingerprint: string): Promise<boolean> {
  try {
    await sql`insert into idempotency_keys (tenant, key, method, path, fingerprint, status, stale_at)
              values ('t', ${`k-${crypto.randomUUID()}`}, ${method}, '/p', ${fingerprint}, 'processing', now() + interval '1 minute')`
    return true
  } catch (error) {
    if ((error as { code?: string }).code !== '23514') throw error
    return false
  }
}

async function oldPatternAccepts(method: string, fingerprint: string): Promise<boolean> {
  const [row] = await sql<{ ok: boolean }[]>`select ${fingerprint}::text ~ '^[0-9a-f]{64}$' and ${method}::text ~ '^[A-Z]{1,16}$' as ok`
  return row!.ok
}

const accepted = async () => ({
  fingerprints: await Promise.all(FINGERPRINTS.map((fingerprint) => claimWith('POST', fingerprint))),
  methods: await Promise.all(METHODS.map((method) => claimWith(method, HEX64))),
})

test('applied to the release before\'s rows while it claims: validated, and the same values accepted as before', async () => {
  await sql`
    insert into idempotency_keys (tenant, key, method, path, fingerprint, status, stale_at)
    select 't', 'old-' || g, 'POST', '/p', encode(sha256(g::text::bytea), 'hex'), 'processing', now() + interval '1 minute'
      from generate_series(1, 5000) g`
  const before = await accepted()
  expect(before.fingerprints).toEqual(await Promise.all(FINGERPRINTS.map((fingerprint) => oldPatternAccepts('POST', fingerprint))))
  expect(before.methods).toEqual(await Promise.all(METHODS.map((method) => oldPatternAccepts(method, HEX64))))

  // The release before keeps inserting while the step runs.
  let claiming = true
  let claims = 0
  const writer = (async () => {
    while (claiming) if (await claimWith('POST', HEX64)) claims++
  })()
  try {
    expect((await migrate(url, { lines: [engine13.lineUpTo(ENGINE_MIGRATIONS, 14)] })).applied).toBe(1)
  } finally {
    claiming = false
    await writer
  }
  expect(claims).toBeGreaterThan(0)

  const checks = await sql<{ name: string; valid: boolean; definition: string }[]>`
    select conname as name, convalidated as valid, pg_get_constraintdef(oid) as definition from pg_constraint
     where conrelid = 'idempotency_keys'::regclass and contype = 'c' and pg_get_constraintdef(oid) ~ '(fingerprint|method) ~' order by 1`
  expect(checks.map(({ name, valid }) => ({ name, valid }))).toEqual([
    { name: 'idempotency_keys_fingerprint_hex', valid: true },
    { name: 'idempotency_keys_method_letters', valid: true },
  ])
  // Without the counted repeats.
  for (const check of checks) expect(check.definition).not.toMatch(/\{\d/)
  expect(await accepted()).toEqual(before)
}, 60_000)
