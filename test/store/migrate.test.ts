/**
 * The migration lines (sql/README.md): the engine's alone for a plugin user,
 * engine then service for the payments service; several migrators at once;
 * a newer schema refused; and a database migrated by the single-line runner
 * of earlier releases (test/store/legacy: its code and files as they were)
 * upgraded in place: same rows, the new lines recorded, the same schema as
 * a fresh one, and the old runner refusing it afterwards.
 */
import { afterAll, expect, test } from 'bun:test'
import { cpSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import postgres from 'postgres'
import { ENGINE_MIGRATIONS, migrate, MIGRATION_LOCK_ID, migrateService, migrationsOf, SERVICE_MIGRATIONS, type MigrationLine } from '../../src/store/migrate'
import { track, waitFor } from '../support/wait'
import { migrate as legacyMigrate, MIGRATIONS_DIR as LEGACY_DIR } from './legacy/migrate'

const base = process.env.DATABASE_URL! // test/support/setup.ts starts an embedded PostgreSQL when unset
const made: string[] = []
const connections: postgres.Sql[] = []

/** A new, empty database (not the migrated template: these tests migrate it themselves). */
async function emptyDatabase(label: string): Promise<{ url: string; sql: postgres.Sql }> {
  const name = `idem_migrate_${label}_${crypto.randomUUID().slice(0, 8)}`
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

afterAll(async () => {
  await Promise.all(connections.map((sql) => sql.end({ timeout: 1 })))
  const admin = postgres(base, { max: 4, onnotice: () => undefined })
  await Promise.all(made.map((name) => admin.unsafe(`drop database if exists "${name}" with (force)`)))
  await admin.end()
}, 30_000)

const BOOKKEEPING = ['migrations', 'idempotency_migrations', 'service_migrations']

const tables = async (sql: postgres.Sql) =>
  (await sql<{ name: string }[]>`select tablename as name from pg_tables where schemaname = 'public' order by 1`).map((row) => row.name)

/** What a schema is made of, as text to compare: columns, constraints, indexes, sequences, functions. */
async function schemaOf(sql: postgres.Sql) {
  const skip = sql(BOOKKEEPING)
  return {
    columns: await sql`
      select table_name, column_name, ordinal_position, data_type, is_nullable, column_default
        from information_schema.columns where table_schema = 'public' and table_name not in ${skip} order by 1, 3`,
    constraints: await sql`
      select conrelid::regclass::text as on, conname, pg_get_constraintdef(oid) as definition
        from pg_constraint where connamespace = 'public'::regnamespace and conrelid::regclass::text not in ${skip} order by 1, 2`,
    indexes: await sql`select tablename, indexname, indexdef from pg_indexes where schemaname = 'public' and tablename not in ${skip} order by 1, 2`,
    sequences: await sql`select sequence_name, data_type, start_value from information_schema.sequences where sequence_schema = 'public' and sequence_name <> 'migrations_migration_id_seq' order by 1`,
    functions: await sql`select proname, pg_get_functiondef(oid) as definition from pg_proc where pronamespace = 'public'::regnamespace order by 1`,
  }
}

const recorded = async (sql: postgres.Sql, line: MigrationLine) =>
  (await sql<{ version: number; name: string }[]>`select version, name from ${sql(line.table)} order by version`).map((row) => `${row.version} ${row.name}`)

/** The schema of a database migrated from nothing by today's runner: what every upgrade must end in. */
let freshSchema: ReturnType<typeof schemaOf> | undefined
const fresh = () => (freshSchema ??= emptyDatabase('fresh').then(async ({ url, sql }) => {
  await migrateService(url)
  return schemaOf(sql)
}))

const ENGINE_TABLES = ['idempotency_answers', 'idempotency_audit', 'idempotency_key_form', 'idempotency_keys', 'idempotency_migrations', 'idempotency_processes', 'idempotency_processing', 'idempotency_secrets', 'idempotency_settings']

test('a plugin user\'s migrate() makes the engine\'s tables only, recorded in idempotency_migrations', async () => {
  const { url, sql } = await emptyDatabase('engine')
  const result = await migrate(url)
  expect(result).toEqual({ applied: migrationsOf(ENGINE_MIGRATIONS).length, versions: { engine: migrationsOf(ENGINE_MIGRATIONS).length }, adopted: false })
  expect(await tables(sql)).toEqual(ENGINE_TABLES)
  expect(await recorded(sql, ENGINE_MIGRATIONS)).toEqual(migrationsOf(ENGINE_MIGRATIONS).map((m) => `${m.version} ${m.name}`))
  // Run again: nothing to do.
  expect((await migrate(url)).applied).toBe(0)
  // The service's line on top adds the service's tables only.
  const service = await migrateService(url)
  expect(service.applied).toBe(migrationsOf(SERVICE_MIGRATIONS).length)
  expect(await tables(sql)).toEqual([...ENGINE_TABLES, 'admin_sessions', 'payments', 'service_migrations'].sort())
})

test('eight migrators at once: each migration applied once, all of them done', async () => {
  const { url, sql } = await emptyDatabase('concurrent')
  const results = await Promise.all(Array.from({ length: 8 }, () => migrateService(url)))
  const total = migrationsOf(ENGINE_MIGRATIONS).length + migrationsOf(SERVICE_MIGRATIONS).length
  expect(results.reduce((sum, result) => sum + result.applied, 0)).toBe(total)
  expect(results.filter((result) => result.applied > 0)).toHaveLength(1)
  expect((await recorded(sql, ENGINE_MIGRATIONS)).length + (await recorded(sql, SERVICE_MIGRATIONS)).length).toBe(total)
})

// Catches: the step's lock_timeout (0.5 s) bounding the wait for another migrator's advisory lock: a
// migrator that waited longer failed with 55P03 (seen under CI load, in the test above, on PostgreSQL 14 and 17).
test('a migrator waits for another one however long its run takes', async () => {
  const { url, sql } = await emptyDatabase('waits')
  const holder = await sql.reserve()
  try {
    await holder`select pg_advisory_lock(${MIGRATION_LOCK_ID})`
    const migrating = track(migrateService(url))
    // Until it has asked for the lock (pg_try_advisory_lock, again and again: a waiter must hold no snapshot,
    // migrate.ts takeMigrationLock) for three times the steps' lock_timeout (0.5 s), as the database itself
    // tells, or the migrator gave up (then the expectation below says how).
    await waitFor(async () => migrating.settled() || (await holder`
      select 1 from pg_stat_activity
      where datname = current_database() and query like '%pg_try_advisory_lock%' and pid <> pg_backend_pid()
        and clock_timestamp() - backend_start >= interval '1.5 seconds'`).length > 0, 'the migrator to wait 1.5 s for the advisory lock')
    expect(migrating.settled() ? await migrating.promise.then(() => 'finished', (error: unknown) => `failed: ${String(error)}`) : 'waiting').toBe('waiting')
    await holder`select pg_advisory_unlock(${MIGRATION_LOCK_ID})`
    expect((await migrating.promise).applied).toBe(migrationsOf(ENGINE_MIGRATIONS).length + migrationsOf(SERVICE_MIGRATIONS).length)
  } finally {
    holder.release()
  }
})

test('a schema newer than this release knows is refused, and nothing is run', async () => {
  const { url, sql } = await emptyDatabase('newer')
  await migrateService(url)
  await sql`insert into service_migrations (version, name) values (99, 'from_the_future')`
  await expect(migrateService(url)).rejects.toThrow(/service schema is at migration 99, newer than this release knows/)
  // The engine's line alone does not look at the service's.
  expect((await migrate(url)).applied).toBe(0)
})

test('on a new database a failing migration leaves it as it was: every pending file runs in one transaction', async () => {
  const { url, sql } = await emptyDatabase('atomic')
  const dir = mkdtempSync(join(tmpdir(), 'idem-line-'))
  try {
    cpSync(ENGINE_MIGRATIONS.dir, dir, { recursive: true })
    writeFileSync(join(dir, `${String(migrationsOf(ENGINE_MIGRATIONS).length + 1).padStart(5, '0')}_broken.sql`), 'create table half_done (id int);\nselect no_such_function();\n')
    await expect(migrate(url, { lines: [{ ...ENGINE_MIGRATIONS, dir }] })).rejects.toThrow(/no_such_function/)
    expect(await tables(sql)).toEqual([])
    // A gap in the numbering is refused before anything runs.
    writeFileSync(join(dir, '00042_far_ahead.sql'), 'select 1;\n')
    expect(() => migrationsOf({ ...ENGINE_MIGRATIONS, dir })).toThrow(/without gaps/)
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
})

test('another tool\'s `migrations` table is not taken for ours, nor touched', async () => {
  const { url, sql } = await emptyDatabase('foreign')
  await sql`create table migrations (migration_id serial primary key, created_at timestamptz not null default now(), name text)`
  await sql`insert into migrations (name) values ('create_users.sql'), ('payments.sql')`
  const result = await migrate(url)
  expect(result.adopted).toBe(false)
  expect([...await sql`select migration_id, name from migrations order by 1`]).toEqual([{ migration_id: 1, name: 'create_users.sql' }, { migration_id: 2, name: 'payments.sql' }])
  expect(await tables(sql)).toEqual([...ENGINE_TABLES, 'migrations'].sort())
})

/** Rows in every table of the old schema, in every state the engine knows. */
async function seedLegacy(sql: postgres.Sql, version: number) {
  await sql`insert into idempotency_keys (tenant, key, method, path, fingerprint, status) values
    ('acme', 'k-processing', 'POST', '/api/payments', ${'a'.repeat(64)}, 'processing')`
  await sql`insert into idempotency_keys (tenant, key, method, path, fingerprint, status, completed_at, response_status, response_headers, response_body) values
    ('acme', 'k-done', 'POST', '/api/payments', ${'b'.repeat(64)}, 'done', now(), 201, ${sql.json({ location: '/api/payments/1' })}, '{"id":"1"}')`
  if (version >= 2)
    await sql`insert into payments (tenant, amount, currency, customer, description, status, provider_ref, idempotency_key) values
      ('acme', 1250, 'EUR', 'cus_1', null, 'succeeded', 'ch_1', 'k-done')`
  if (version >= 3)
    await sql`insert into idempotency_audit (actor, action, tenant, key, outcome, detail) values ('cli:alice', 'force_expire', 'acme', 'k-old', 'expired', ${sql.json({ lease: '7' })})`
  if (version >= 4) {
    await sql`update idempotency_keys set status = 'released', released_at = now(), owner = null where key = 'k-processing'`
    // A process of that release long gone (a live one would hold back the contract steps: see below).
    await sql`insert into idempotency_processes (id, pid, hostname, heartbeat_at) values (${crypto.randomUUID()}, 4242, 'old-host', now() - interval '1 hour')`
    await sql`insert into idempotency_settings (ttl_seconds, retention_seconds) values (30, 86400)`
  }
}

/** Every row of every non-bookkeeping table, in a stable order. */
async function rowsOf(sql: postgres.Sql) {
  const rows: Record<string, Record<string, unknown>[]> = {}
  for (const table of (await tables(sql)).filter((name) => !BOOKKEEPING.includes(name)))
    rows[table] = (await sql.unsafe(`select to_jsonb(t) as row from "${table}" t order by to_jsonb(t)::text`)).map((row) => row.row)
  return rows
}

/** Each row of `before` is in `after`, its values unchanged (later versions may add columns). */
function expectKept(before: Record<string, Record<string, unknown>[]>, after: Record<string, Record<string, unknown>[]>) {
  for (const [table, rows] of Object.entries(before)) {
    expect(after[table]?.length, table).toBe(rows.length)
    rows.forEach((row, index) => expect(after[table]![index], table).toMatchObject(row))
  }
}

for (const version of [4, 3, 2, 1]) {
  test(`a database at version ${version} of the old single-line layout is upgraded in place: same rows, the new lines recorded, the fresh schema`, async () => {
    const { url, sql } = await emptyDatabase(`legacy${version}`)
    const dir = mkdtempSync(join(tmpdir(), 'idem-legacy-'))
    try {
      for (const file of ['00001_idempotency_keys.sql', '00002_payments.sql', '00003_admin_audit.sql', '00004_atomic_phases.sql'].slice(0, version))
        cpSync(join(LEGACY_DIR, file), join(dir, file))
      expect(await legacyMigrate(url, dir)).toEqual({ applied: version, version })
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
    await seedLegacy(sql, version)
    const before = await rowsOf(sql)

    const result = await migrateService(url)
    expect(result.adopted).toBe(true)
    expect(result.versions).toEqual({ engine: migrationsOf(ENGINE_MIGRATIONS).length, service: migrationsOf(SERVICE_MIGRATIONS).length })
    // What the old versions held is recorded, not run again; only what they lacked was applied.
    const held = { 4: [3, 2], 3: [2, 1], 2: [1, 1], 1: [1, 0] }[version]!
    expect(result.applied).toBe(migrationsOf(ENGINE_MIGRATIONS).length - held[0]! + migrationsOf(SERVICE_MIGRATIONS).length - held[1]!)
    expect(await recorded(sql, ENGINE_MIGRATIONS)).toEqual(migrationsOf(ENGINE_MIGRATIONS).map((m) => `${m.version} ${m.name}`))
    expect(await recorded(sql, SERVICE_MIGRATIONS)).toEqual(migrationsOf(SERVICE_MIGRATIONS).map((m) => `${m.version} ${m.name}`))

    expectKept(before, await rowsOf(sql))
    expect(await schemaOf(sql)).toEqual(await fresh())

    // Once upgraded: a second run does nothing, and the old runner refuses the database instead of running on it.
    expect(await migrateService(url)).toEqual({ applied: 0, versions: result.versions, adopted: false })
    await expect(legacyMigrate(url)).rejects.toThrow(/newer than this release knows/)
  })
}

test('a plugin user\'s database from the old layout: the engine\'s migrate() adopts it, the service\'s tables it had are recorded as such', async () => {
  const { url, sql } = await emptyDatabase('legacy_plugin')
  await legacyMigrate(url)
  await seedLegacy(sql, 4)
  const before = await rowsOf(sql)
  const result = await migrate(url)
  // The old layout held the engine's first three; what came after runs now.
  expect(result).toEqual({ applied: migrationsOf(ENGINE_MIGRATIONS).length - 3, versions: { engine: migrationsOf(ENGINE_MIGRATIONS).length }, adopted: true })
  expect(await recorded(sql, SERVICE_MIGRATIONS)).toHaveLength(2)
  expect(await rowsOf(sql)).toMatchObject(before) // every row kept; later migrations may add columns
  // Two upgrades at once: one adopts, the other finds it done.
  const again = await emptyDatabase('legacy_race')
  await legacyMigrate(again.url)
  const results = await Promise.all([migrateService(again.url), migrateService(again.url), migrate(again.url)])
  expect(results.filter((r) => r.adopted)).toHaveLength(1)
  expect(await recorded(again.sql, ENGINE_MIGRATIONS)).toHaveLength(migrationsOf(ENGINE_MIGRATIONS).length)
})

/** Writes a migration line of `files` (name → SQL) into a temporary folder, for the runner's directives. */
function lineOf(name: string, files: Record<string, string>): { line: MigrationLine; dir: string } {
  const dir = mkdtempSync(join(tmpdir(), `idem-line-${name}-`))
  for (const [file, text] of Object.entries(files)) writeFileSync(join(dir, file), text)
  return { line: { name, table: `${name}_migrations`, dir }, dir }
}

// Catches: a contract step run while a process of the release before it serves (it would break that process),
// or one that never runs once they are gone.
test('a contract step waits while a live process does not know what it requires, and runs once none is left', async () => {
  const { url, sql } = await emptyDatabase('contract')
  await migrate(url) // the engine's line: the processes table and its schema_known
  const { line, dir } = lineOf('shop', {
    '00001_orders.sql': 'create table shop_orders (id int primary key, note text);',
    '00002_order_notes_required.sql': '-- @contract requires shop 1\nupdate shop_orders set note = \'\' where note is null;\nalter table shop_orders alter column note set not null;',
    '00003_after.sql': 'create table shop_after (id int);',
  })
  try {
    const old = crypto.randomUUID()
    await sql`insert into idempotency_processes (id, pid, hostname) values (${old}, 1, 'old-release')` // live, says nothing
    const aware = crypto.randomUUID()
    await sql`insert into idempotency_processes (id, pid, hostname, schema_known) values (${aware}, 2, 'new-release', ${sql.json({ shop: 2 })})`
    const first = await migrate(url, { lines: [line] })
    expect(first).toMatchObject({ applied: 1, versions: { shop: 1 }, pending: [{ line: 'shop', version: 2, name: 'order_notes_required', waitingFor: 1, requires: { shop: 1 } }] })
    expect((await sql`select to_regclass('shop_after') as t`)[0]!.t).toBeNull() // the rest of the line waits behind it
    // A process that knows too little counts too; one that knows nothing of the line does not use it.
    await sql`update idempotency_processes set schema_known = ${sql.json({ shop: 0 })} where id = ${old}`
    expect((await migrate(url, { lines: [line] })).pending?.[0]?.waitingFor).toBe(1)
    await sql`update idempotency_processes set schema_known = ${sql.json({ engine: 7 })} where id = ${old}`
    expect(await migrate(url, { lines: [line] })).toEqual({ applied: 2, versions: { shop: 3 }, adopted: false })
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
})

// Catches: a release that refuses to start beside the next one (it migrated online steps this one does not know),
// or one that starts on steps it cannot run on.
test('a database ahead of this release by online steps is served as is; by any other step it is refused', async () => {
  const { url } = await emptyDatabase('ahead')
  const next = lineOf('shop', {
    '00001_orders.sql': 'create table shop_orders (id int primary key);',
    '00002_order_notes.sql': '-- @online\nalter table shop_orders add column note text;',
  })
  const current = lineOf('shop', { '00001_orders.sql': 'create table shop_orders (id int primary key);' })
  try {
    await migrate(url, { lines: [next.line] })
    expect(await migrate(url, { lines: [current.line] })).toEqual({ applied: 0, versions: { shop: 2 }, adopted: false, ahead: { shop: 2 } })
    writeFileSync(join(next.dir, '00003_orders_renamed.sql'), 'alter table shop_orders rename to shop_orders_v2;')
    await migrate(url, { lines: [next.line] })
    await expect(migrate(url, { lines: [current.line] })).rejects.toThrow(/newer than this release knows \(1\), with changes this release cannot run on/)
  } finally {
    rmSync(next.dir, { recursive: true, force: true })
    rmSync(current.dir, { recursive: true, force: true })
  }
})

// Catches: a run on a serving database that holds an online step's lock while the next step waits (the release
// serving beside it answered 503s in the rolling-upgrade test), or one that records a file it did not apply.
test('on a database in use each file runs in a transaction of its own: a failure keeps the files before it, recorded', async () => {
  const { url, sql } = await emptyDatabase('per_file')
  const { line, dir } = lineOf('shop', { '00001_orders.sql': 'create table shop_orders (id int primary key);' })
  try {
    await migrate(url, { lines: [line] })
    writeFileSync(join(dir, '00002_notes.sql'), '-- @online\nalter table shop_orders add column note text;')
    writeFileSync(join(dir, '00003_broken.sql'), 'create table shop_half (id int);\nselect no_such_function();')
    await expect(migrate(url, { lines: [line] })).rejects.toThrow(/no_such_function/)
    expect((await sql`select version, online from shop_migrations order by version`).map((row) => [row.version, row.online])).toEqual([[1, false], [2, true]])
    expect((await sql`select to_regclass('shop_half') as t`)[0]!.t).toBeNull()
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
})
