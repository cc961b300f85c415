import { readdirSync, readFileSync, statSync } from 'node:fs'
import { join } from 'node:path'
import postgres from 'postgres'
import { migrate, migrateService, SQL_DIR } from '../../src/store/migrate'
import { openPools, type Pools } from '../../src/store/db'
import type { ClusterNodes } from './citus'
import { waitFor } from './wait'

export interface TestDatabase {
  readonly url: string
  readonly pools: Pools
  /** One connection for assertions and for putting rows in any state. */
  readonly sql: postgres.Sql
  drop(): Promise<void>
}

/** Rows a file needs before its first test, expensive to make (e.g. 200k keys for the planner): made once, kept in a template. */
export interface Seed {
  /**
   * Names the rows: a different key makes another template. Put in it
   * whatever decides them (counts, the clock, the fill's source): a stale
   * key would hand out stale rows.
   */
  readonly key: string
  fill(sql: postgres.Sql): Promise<void>
}

function baseUrl(): string {
  const url = process.env.DATABASE_URL
  if (!url) throw new Error('DATABASE_URL is not set (test/support/setup.ts should have set it)')
  return url
}

function urlOf(database: string): string {
  const url = new URL(baseUrl())
  url.pathname = `/${database}`
  return url.toString()
}

const connect = (url = baseUrl()) => postgres(url, { max: 1, onnotice: () => undefined })

const sha = (text: string) => new Bun.CryptoHasher('sha256').update(text).digest('hex').slice(0, 16)

/**
 * A fresh, migrated database for one test file: files never see each other's
 * rows. It is a copy of a migrated template (`create database ... template`,
 * about 60 ms, where creating and migrating one took about 300 ms), seeded
 * with `seed`'s rows if given. `engineOnly`: the engine's line alone, as an app
 * on the plugin's database has it (no payments table, none of the service's
 * settings of the engine's tables).
 */
export async function createTestDatabase(label = 'test', options: { seed?: Seed; engineOnly?: boolean } = {}): Promise<TestDatabase> {
  if (process.env.TEST_CITUS_URL) return createCitusTestDatabase(process.env.TEST_CITUS_URL, label, options)
  const template = options.seed ? await seededTemplate(options.seed) : options.engineOnly ? await engineTemplate() : await migratedTemplate()
  const name = `idem_${label.replace(/\W/g, '_').slice(0, 30)}_${crypto.randomUUID().slice(0, 8)}`
  const admin = connect()
  try {
    await admin.unsafe(`create database "${name}" template "${template}"`)
  } finally {
    await admin.end()
  }
  const url = urlOf(name)
  if (process.env.TEST_KEY_FORM) await setKeyForm(url, process.env.TEST_KEY_FORM)
  const pools = openPools(url, { applicationName: `test:${label}`, shortMax: 10, workMax: 20 })
  const sql = postgres(url, { max: 4, onnotice: () => undefined })
  return {
    url,
    pools,
    sql,
    async drop() {
      await pools.close(1)
      await sql.end({ timeout: 1 })
      const cleanup = connect()
      await cleanup.unsafe(`drop database if exists "${name}" with (force)`)
      await cleanup.end()
    },
  }
}

/**
 * With TEST_CITUS_URL (the `postgres` database of a running Citus
 * coordinator, test/citus/suites.test.ts), the same database on that cluster:
 * citus on every node, migrated, so distributed (sql/engine/00011,
 * sql/service/00006). No template: a copy of a coordinator's database would
 * not copy the shards on the workers. It is checked to be distributed, so a
 * file that passes there passed on the distributed schema.
 */
async function createCitusTestDatabase(coordinatorUrl: string, label: string, options: { seed?: Seed; engineOnly?: boolean }): Promise<TestDatabase> {
  // Imported here: a plain run loads nothing of the Citus harness.
  const { clusterAt, createClusterDatabase } = await import('./citus')
  citusNodes ??= clusterAt(coordinatorUrl)
  const made = await createClusterDatabase(await citusNodes, label, { shardCount: CITUS_SHARD_COUNT })
  try {
    await (options.engineOnly ? migrate(made.url) : migrateService(made.url))
    const check = connect(made.url)
    try {
      // pg_dist_partition exists only with citus: asked only then (as core/citus-form.ts does).
      const [citus] = await check<{ installed: boolean }[]>`select exists (select 1 from pg_extension where extname = 'citus') as installed`
      const [keys] = citus?.installed ? await check<{ distributed: boolean }[]>`
        select exists (select 1 from pg_dist_partition where logicalrelid = 'idempotency_keys'::regclass and partmethod = 'h') as distributed` : []
      if (!keys?.distributed) throw new Error(`${made.name}: idempotency_keys is not distributed by Citus after migrating (TEST_CITUS_URL)`)
      if (process.env.TEST_KEY_FORM) await setKeyForm(made.url, process.env.TEST_KEY_FORM)
      if (options.seed) await options.seed.fill(check)
    } finally {
      await check.end()
    }
  } catch (error) {
    await made.drop()
    throw error
  }
  const pools = openPools(made.url, { applicationName: `test:${label}`, shortMax: 10, workMax: 20 })
  const sql = postgres(made.url, { max: 4, onnotice: () => undefined })
  return {
    url: made.url,
    pools,
    sql,
    async drop() {
      await pools.close(1)
      await sql.end({ timeout: 1 })
      await made.drop()
    },
  }
}

let citusNodes: Promise<ClusterNodes> | undefined
/** Shards per distributed table in a test database: fewer than Citus's 32 make migrating faster, still several per worker. */
const CITUS_SHARD_COUNT = 8

/*
 * Templates are named after what they hold: a hash of the migrations and of
 * their runner (and of the seed's key), so a run after a migration changed
 * gets a template of its own and never a stale one, and an unchanged one is
 * not built again by the next run. Several runs at once (people sharing a
 * server) are safe: a template is built under another name, under an
 * advisory lock, and renamed when complete; it then refuses connections
 * (ALLOW_CONNECTIONS false), because a copy fails while anyone is connected
 * to its template. Templates of older schemas stay until dropped by hand
 * (`alter database idem_template_... is_template false`, then `drop database`);
 * the migrated one takes 8 MB, gauge-plans' seeded one 77 MB.
 */
const built = new Map<string, Promise<string>>()

/** The name of a database migrated to this checkout's schema, made at most once (per `bun test` process, by the first file that asks). */
export function migratedTemplate(): Promise<string> {
  return once(`idem_template_${schemaHash()}`, (name) => buildTemplate(name, async (url) => { await migrateService(url) }))
}

/** migratedTemplate with the engine's line alone. */
function engineTemplate(): Promise<string> {
  return once(`idem_template_engine_${schemaHash()}`, (name) => buildTemplate(name, async (url) => { await migrate(url) }))
}

async function seededTemplate(seed: Seed): Promise<string> {
  const from = await migratedTemplate()
  return once(`${from}_${sha(seed.key)}`, (name) => buildTemplate(name, async (url) => {
    const sql = connect(url)
    try {
      await seed.fill(sql)
    } finally {
      await sql.end()
    }
  }, from))
}

function once(name: string, build: (name: string) => Promise<string>): Promise<string> {
  let made = built.get(name)
  if (!made) {
    made = build(name).catch((error: unknown) => {
      built.delete(name)
      throw error
    })
    built.set(name, made)
  }
  return made
}

/** Every file under sql/ (each line's folder), by its path, and the runner. */
function schemaHash(): string {
  const files = (dir: string): string[] => readdirSync(dir).sort().flatMap((name) => {
    const path = join(dir, name)
    return statSync(path).isDirectory() ? files(path) : [path]
  })
  const parts = files(SQL_DIR).map((path) => `${path.slice(SQL_DIR.length)}\u0000${readFileSync(path, 'utf8')}`)
  parts.push(readFileSync(join(import.meta.dir, '..', '..', 'src', 'store', 'migrate.ts'), 'utf8'))
  return sha(parts.join('\u0000'))
}

/** SQLSTATE: "database ... is being accessed by other users". */
const OBJECT_IN_USE = '55006'
/** Any fixed number, distinct from the migration runner's own lock. */
const TEMPLATE_LOCK_ID = 7_246_013_918

/** Makes template `name` (a copy of `from`, else empty), filled by `fill`, unless it exists. */
async function buildTemplate(name: string, fill: (url: string) => Promise<void>, from?: string): Promise<string> {
  const sql = connect()
  const exists = async () => (await sql`select 1 from pg_database where datname = ${name} and datistemplate`).length > 0
  try {
    if (await exists()) return name
    await sql`select pg_advisory_lock(${TEMPLATE_LOCK_ID})`
    try {
      if (await exists()) return name
      const building = `${name}_building`
      await sql.unsafe(`drop database if exists "${building}" with (force)`) // left by a run killed while building
      await sql.unsafe(`create database "${building}"${from ? ` template "${from}"` : ''}`)
      await fill(urlOf(building))
      // The filler's connection may still be closing on the server side: renaming waits for it to be gone.
      await waitFor(() => sql.unsafe(`alter database "${building}" rename to "${name}"`).then(() => true, (error: { code?: string }) => {
        if (error.code === OBJECT_IN_USE) return false
        throw error
      }), `the template ${building} to have no connection left`)
      await sql.unsafe(`alter database "${name}" with is_template true allow_connections false`)
      return name
    } finally {
      await sql`select pg_advisory_unlock(${TEMPLATE_LOCK_ID})`
    }
  } finally {
    await sql.end()
  }
}

/**
 * The form new claims take in database `url` (sql/engine/00020): 'new' (the
 * answer apart, since sql/engine/00023 a migrated database's) or 'old' (as on
 * a database whose switch waits for an older release's processes, the key
 * table filled to the payments' 35 % again). TEST_KEY_FORM gives every test
 * database one.
 */
export async function setKeyForm(url: string, form: string): Promise<void> {
  if (form !== 'old' && form !== 'new') throw new Error(`TEST_KEY_FORM: old or new, not ${JSON.stringify(form)}`)
  const sql = connect(url)
  try {
    await sql`update idempotency_key_form set form = ${form} where id = 1`
    await sql.unsafe(`alter table idempotency_keys set (fillfactor = ${form === 'old' ? 35 : 100})`)
  } finally {
    await sql.end()
  }
}

/**
 * Moves the lease of `key` (a processing key, of either form) `seconds` into
 * the past: the row's locked_at in the old form, its processing entry's in the
 * new, where a key of that form keeps its lease (sql/engine/00020).
 */
export async function backdateLease(sql: postgres.Sql<any>, key: string, seconds: number): Promise<void> {
  await sql`update idempotency_keys set locked_at = now() - make_interval(secs => ${seconds}) where key = ${key} and digest is null`
  // The deadline moves with it, as the old form's trigger (sql/engine/00005) moves the row's.
  await sql`update idempotency_processing set locked_at = now() - make_interval(secs => ${seconds}), stale_at = now() - make_interval(secs => ${seconds}) + (stale_at - locked_at)
             where key = ${key} and lease is not null`
}

/**
 * Locks FOR UPDATE, in `sql`'s transaction, what the completion of processing
 * `key` writes: its row in the old form, its processing entry in the new
 * (sql/engine/00020), so that the completion waits on the lock in either.
 */
export async function lockCompletionTarget(sql: postgres.Sql<any> | postgres.TransactionSql<any> | postgres.ReservedSql<any>, key: string, tenant?: string): Promise<void> {
  const tag = sql as postgres.Sql<any>
  const ofTenant = tenant === undefined ? tag`` : tag`and tenant = ${tenant}`
  await tag`select 1 from idempotency_keys where key = ${key} and digest is null ${ofTenant} for update`
  await tag`select 1 from idempotency_processing where key = ${key} and lease is not null ${ofTenant} for update`
}
