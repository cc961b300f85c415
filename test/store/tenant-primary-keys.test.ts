/**
 * The primary keys Citus needs, on plain PostgreSQL too (issue 47):
 * payments (tenant, id), built CONCURRENTLY by a @no-transaction step
 * (sql/service/00006), and idempotency_audit (tenant, id), whose entries
 * about no single tenant name '*' (sql/engine/00011). A database of the
 * release before (engine 10, service 5) with rows is upgraded in place while
 * several migrators start at once, and the release before still writes its
 * audit entries without a tenant.
 */
import { afterAll, expect, test } from 'bun:test'
import postgres from 'postgres'
import { ENGINE_MIGRATIONS, knownVersions, migrate, migrateService, SERVICE_MIGRATIONS, statementsOf } from '../../src/store/migrate'
import { releaseBefore } from '../support/release-before'

const base = process.env.DATABASE_URL!
const made: string[] = []
const connections: postgres.Sql[] = []
const { lineUpTo, remove } = releaseBefore()

afterAll(async () => {
  await Promise.all(connections.map((sql) => sql.end({ timeout: 1 })))
  const admin = postgres(base, { max: 2, onnotice: () => undefined })
  await Promise.all(made.map((name) => admin.unsafe(`drop database if exists "${name}" with (force)`)))
  await admin.end()
  remove()
}, 30_000)

async function emptyDatabase(label: string): Promise<{ url: string; sql: postgres.Sql }> {
  const name = `idem_tenant_keys_${label}_${crypto.randomUUID().slice(0, 8)}`
  const admin = postgres(base, { max: 1, onnotice: () => undefined })
  await admin.unsafe(`create database "${name}"`)
  await admin.end()
  made.push(name)
  const url = new URL(base)
  url.pathname = `/${name}`
  const sql = postgres(url.toString(), { max: 2, onnotice: () => undefined })
  connections.push(sql)
  return { url: url.toString(), sql }
}

const primaryKeys = async (sql: postgres.Sql) => Object.fromEntries((await sql<{ table: string; definition: string }[]>`
  select conrelid::regclass::text as table, pg_get_constraintdef(oid) as definition from pg_constraint
   where contype = 'p' and conrelid::regclass::text in ('payments', 'idempotency_audit')`).map((row) => [row.table, row.definition]))

test('a new database has both keys by tenant', async () => {
  const { url, sql } = await emptyDatabase('fresh')
  await migrateService(url)
  expect(await primaryKeys(sql)).toEqual({ payments: 'PRIMARY KEY (tenant, id)', idempotency_audit: 'PRIMARY KEY (tenant, id)' })
  const [nullable] = await sql<{ nullable: string }[]>`select is_nullable as nullable from information_schema.columns where table_name = 'idempotency_audit' and column_name = 'tenant'`
  expect(nullable!.nullable).toBe('NO')
})

test('the release before\'s database, with rows, upgraded by four migrators at once: each key swapped once, no row lost, no deadlock', async () => {
  const { url, sql } = await emptyDatabase('upgrade')
  await migrate(url, { lines: [lineUpTo(ENGINE_MIGRATIONS, 10), lineUpTo(SERVICE_MIGRATIONS, 5)] })
  await sql`
    insert into payments (tenant, amount, currency, customer, status, provider_ref, idempotency_key)
    select 'tenant-' || g % 7, 100, 'EUR', 'c', 'succeeded', 'ref-' || g, 'k-' || g from generate_series(1, 20000) g`
  // The release before writes the manual purge's entry with no tenant.
  await sql`insert into idempotency_audit (actor, action, outcome) values ('cli:op', 'purge_expired', 'done')`

  // Waiting inside pg_advisory_lock() held a snapshot that the index built CONCURRENTLY waited for: 40P01.
  const results = await Promise.all([1, 2, 3, 4].map(() => migrateService(url)))
  // One migrator applies every file after the release before's (engine 10, service 5); the others find none left.
  const known = knownVersions([ENGINE_MIGRATIONS, SERVICE_MIGRATIONS])
  expect(results.map((result) => result.applied).sort()).toEqual([0, 0, 0, known.engine! - 10 + known.service! - 5])
  expect(await primaryKeys(sql)).toEqual({ payments: 'PRIMARY KEY (tenant, id)', idempotency_audit: 'PRIMARY KEY (tenant, id)' })
  const [counts] = await sql<{ payments: number; audit: number; unnamed: number }[]>`
    select (select count(*) from payments)::int as payments, (select count(*) from idempotency_audit)::int as audit,
           (select count(*) from idempotency_audit where tenant is distinct from '*')::int as unnamed`
  expect(counts).toEqual({ payments: 20000, audit: 1, unnamed: 0 })
  // No index left over by the build (it became the primary key), none invalid.
  const indexes = await sql<{ name: string; valid: boolean }[]>`
    select c.relname as name, i.indisvalid as valid from pg_index i join pg_class c on c.oid = i.indexrelid
     where i.indrelid = 'payments'::regclass order by 1`
  expect([...indexes]).toEqual([{ name: 'payments_pkey', valid: true }, { name: 'payments_tenant_customer_created', valid: true }])

  // The release before, still serving, writes its entries without a tenant: they are named, not refused.
  await sql`insert into idempotency_audit (actor, action, outcome) values ('cli:op', 'purge_expired', 'done')`
  expect((await sql`select count(*)::int as n from idempotency_audit where tenant = '*'`)[0]!.n).toBe(2)
}, 60_000)

test('a @no-transaction step is split into its statements: quotes, dollar-quoted bodies and comments kept whole', () => {
  const text = `-- a; comment\ncreate index concurrently if not exists a on t (x);\ndo $$ begin perform 'x;y'; end $$;\nselect 'it''s; fine' /* ; */ ;\n-- trailing; comment only\n`
  expect(statementsOf(text)).toEqual([
    '-- a; comment\ncreate index concurrently if not exists a on t (x)',
    "do $$ begin perform 'x;y'; end $$",
    "select 'it''s; fine' /* ; */",
  ])
})
