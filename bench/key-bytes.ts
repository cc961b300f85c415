/**
 * Bytes per live key (issue 40): N fresh payments, C at a time, through the
 * service in this process (the app of src/server.ts on a fresh database,
 * charging a provider simulator of its own: the real claim, the real
 * completion through the lane, the real stored answer), then what the key
 * tables take per completed key: pg_total_relation_size of idempotency_keys
 * and idempotency_processing, and the answers of the new form
 * (sql/engine/00020), heap, TOAST, indexes, free-space and
 * visibility maps, over the keys in `done`, split by part, with the average
 * row and the share of completions that were heap-only updates.
 *
 *   bun bench/key-bytes.ts [--payments 4000] [--concurrency 32] [--layout "sql; sql"] [--label name] [--keep]
 *
 * `--layout`: statements run on the freshly migrated database before the
 * load, to measure a candidate layout without a migration (e.g.
 * `alter table idempotency_keys set (fillfactor = 60)`; the layout before
 * sql/engine/00010: `alter table idempotency_processing set (fillfactor = 10);
 * alter table idempotency_keys set (fillfactor = 30)`). `--keep` leaves the
 * database for a look (pageinspect). Needs DATABASE_URL. The keys are random
 * UUIDs (what clients are told to send): the primary key's worst case, about
 * 90 B an entry in leaves split at random.
 */
import { parseArgs } from 'node:util'
import postgres from 'postgres'
import { migrateService } from '../src/store/migrate'
import { openPools } from '../src/store/db'
import { startApp, type InProcessService } from '../test/support/app'
import type { TestDatabase } from '../test/support/db'

export interface KeyBytes {
  readonly done: number
  readonly keys: number
  /** pg_total_relation_size of the two key tables over the keys in done. */
  readonly perKey: number
  readonly heap: number
  readonly toast: number
  /** The key table's indexes. */
  readonly indexes: number
  /** FSM and visibility map forks of both tables. */
  readonly maps: number
  /** The processing list: its heap, maps and index. */
  readonly processing: number
  /** The answers of keys of the new form (sql/engine/00020): heap, TOAST, maps, indexes. */
  readonly answers: number
  /** Answers inserted (the new form's completions: the old form's are `upd`). */
  readonly answered: number
  readonly avgRow: number
  readonly rowsPerPage: number
  readonly upd: number
  readonly hot: number
}

/** What the key tables take now, per completed key (pg_total_relation_size, as issue 40 counts it). */
export async function keyBytes(sql: postgres.Sql): Promise<KeyBytes> {
  const [row] = await sql<KeyBytes[]>`
    with t as (
      select c.oid, c.reltoastrelid, c.relname from pg_class c
       where c.relname in ('idempotency_keys', 'idempotency_processing', 'idempotency_answers') and c.relnamespace = 'public'::regnamespace
    )
    select ((select count(*) from idempotency_keys where status = 'done') + (select count(*) from idempotency_answers))::int as done,
           (select count(*) from idempotency_keys)::int as keys,
           (select sum(pg_total_relation_size(oid)) from t)::float8 as total,
           (select pg_relation_size(oid) from t where relname = 'idempotency_keys')::float8 as heap,
           (select coalesce(sum(pg_total_relation_size(nullif(reltoastrelid, 0))), 0) from t)::float8 as toast,
           (select pg_indexes_size(oid) from t where relname = 'idempotency_keys')::float8 as indexes,
           (select sum(pg_relation_size(oid, 'fsm') + pg_relation_size(oid, 'vm')) from t)::float8 as maps,
           (select pg_total_relation_size(oid) from t where relname = 'idempotency_processing')::float8 as processing,
           coalesce((select pg_total_relation_size(oid) from t where relname = 'idempotency_answers'), 0)::float8 as answers,
           coalesce((select n_tup_ins from pg_stat_user_tables where relname = 'idempotency_answers'), 0)::int as answered,
           (select avg(pg_column_size(k.*)) from idempotency_keys k)::float8 as "avgRow",
           (select count(*)::float8 / greatest(pg_relation_size('idempotency_keys') / 8192, 1) from idempotency_keys) as "rowsPerPage",
           (select n_tup_upd from pg_stat_user_tables where relname = 'idempotency_keys')::int as upd,
           (select n_tup_hot_upd from pg_stat_user_tables where relname = 'idempotency_keys')::int as hot`
  const r = row as unknown as KeyBytes & { total: number }
  return { ...r, perKey: r.total / Math.max(r.done, 1) }
}

/** keyBytes once the statistics show `updates` completions, of either form (backends report their counters as they exit). */
export async function settledKeyBytes(sql: postgres.Sql, updates: number): Promise<KeyBytes> {
  let figures = await keyBytes(sql)
  for (let i = 0; i < 100 && figures.upd + figures.answered < updates; i++) {
    await Bun.sleep(100)
    figures = await keyBytes(sql)
  }
  return figures
}

/**
 * `payments` fresh payments through the service's app, `concurrency` at a
 * time, each under a new random UUID key (what clients are told to send), for
 * 500 customers: every one answered 201.
 */
export async function pay(app: InProcessService, payments: number, concurrency: number): Promise<void> {
  let next = 0
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (next < payments) {
      const n = next++
      const response = await app.fetch('/api/payments', {
        method: 'POST',
        headers: { authorization: 'Bearer acme-key', 'content-type': 'application/json', 'idempotency-key': crypto.randomUUID() },
        body: JSON.stringify({ amount: 1000 + (n % 9000), currency: 'EUR', customer: `cus_${n % 500}` }),
      })
      if (response.status !== 201) throw new Error(`payment ${n}: ${response.status} ${await response.text()}`)
      await response.arrayBuffer()
    }
  }))
}

export interface KeyBytesOptions {
  readonly payments: number
  readonly concurrency: number
  /** Statements run on the migrated database before the load. */
  readonly layout?: string
  /** Leave the database for a look (its name is printed). */
  readonly keep?: boolean
}

/** A fresh database, migrated (and changed by `layout`), N payments through the app, C at a time; its figures; the database dropped. */
export async function measureKeyBytes(options: KeyBytesOptions): Promise<KeyBytes> {
  const base = process.env.DATABASE_URL
  if (!base) throw new Error('DATABASE_URL is not set')
  const name = `idem_key_bytes_${crypto.randomUUID().slice(0, 8)}`
  const admin = postgres(base, { max: 1, onnotice: () => undefined })
  await admin.unsafe(`create database "${name}"`)
  const url = Object.assign(new URL(base), { pathname: `/${name}` }).toString()
  const sql = postgres(url, { max: 2, onnotice: () => undefined })
  try {
    await migrateService(url)
    if (options.layout) await sql.unsafe(options.layout)
    const pools = openPools(url, { applicationName: 'key-bytes', shortMax: 8, workMax: 8 })
    const db: TestDatabase = { url, pools, sql, drop: async () => undefined }
    const app = await startApp(db)
    try {
      await pay(app, options.payments, options.concurrency)
    } finally {
      await app.stop()
      await pools.close(1) // the backends report their counters as they exit
    }
    return await settledKeyBytes(sql, options.payments)
  } finally {
    await sql.end({ timeout: 1 })
    if (options.keep) console.log(`kept: ${url}`)
    else await admin.unsafe(`drop database if exists "${name}" with (force)`)
    await admin.end()
  }
}

export function formatKeyBytes(label: string, f: KeyBytes): string {
  const per = (bytes: number) => (bytes / Math.max(f.done, 1)).toFixed(0)
  return `| ${label} | ${f.perKey.toFixed(0)} | ${per(f.heap)} | ${per(f.toast)} | ${per(f.indexes)} | ${per(f.maps)} | ${per(f.processing)} | ${per(f.answers)} | ${f.avgRow.toFixed(0)} | ${f.rowsPerPage.toFixed(1)} | ${(100 * f.hot / Math.max(f.upd, 1)).toFixed(1)} % (${f.hot}/${f.upd}) | ${f.done} |`
}

export const KEY_BYTES_HEADER = '| layout | B per key | heap | TOAST | indexes | FSM+VM (both) | processing list (all forks, index) | answers (all forks, indexes) | avg key row | rows/page | HOT | done keys |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |'

if (import.meta.main) {
  const { values } = parseArgs({
    options: {
      payments: { type: 'string', default: '4000' },
      concurrency: { type: 'string', default: '32' },
      layout: { type: 'string' },
      label: { type: 'string' },
      keep: { type: 'boolean', default: false },
    },
  })
  const figures = await measureKeyBytes({ payments: Number(values.payments), concurrency: Number(values.concurrency), keep: values.keep, ...(values.layout ? { layout: values.layout } : {}) })
  console.log(KEY_BYTES_HEADER)
  console.log(formatKeyBytes(values.label ?? values.layout ?? 'as migrated', figures))
}
