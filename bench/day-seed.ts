/**
 * The key table of a day of traffic (issue 40), written fast: copies of a
 * real completed key, made by the service itself, not rows typed here.
 *
 * The service's own app first completes a few thousand payments under random
 * UUID keys, 32 at a time (bench/key-bytes.ts's pay): its row is the template
 * of every seeded one, all of its columns as the engine writes them (whatever
 * the engine of this checkout writes: a column added by a migration is copied
 * as it is), and how densely its pages fill in use is what the seeded pages
 * are packed to. Then `generate_series` in chunks copies that row with its own
 * key (a random UUID), fingerprint, lease, request ids and times:
 *
 *  - completed keys within retention, spread from 23 hours ago to a minute ago;
 *  - completed keys past retention (a backlog for the purge), spread over the
 *    two hours before the retention's cut-off: inserted first, oldest first,
 *    as a table in use holds them (created_at follows the heap's order);
 *  - a few processing keys (half of them an hour old: stale), listed in
 *    idempotency_processing by the engine's own trigger.
 *
 * A key of the new form (sql/engine/00020) is copied with its answer, and a
 * processing one with its entry, as the engine writes them.
 *
 * Then VACUUM (ANALYZE), as autovacuum leaves a table in use: statistics, and
 * the visibility map set, nothing frozen yet.
 */
import type postgres from 'postgres'
import { KEY_STATES } from '../src/core/key-states'

export interface DaySeedOptions {
  /** Keys in the table after the seed, the template keys included. */
  readonly keys: number
  /** Share of them past retention (0..1). */
  readonly expiredShare: number
  /** Processing keys among them. */
  readonly processing: number
  readonly retentionSeconds: number
  /** Heap pages are packed to this fillfactor while seeding (then the table's own is put back). */
  readonly fillfactor: number
  /** Rows per INSERT: one transaction each, so the WAL and the checkpoints keep up. */
  readonly chunk?: number
}

export interface DaySeed {
  readonly done: number
  readonly expired: number
  /** Keys past retention in the table after the seed, counted (the purge's backlog). */
  readonly pastRetention: number
  readonly processing: number
  readonly seconds: number
  readonly vacuumSeconds: number
  readonly fillfactor: number
}

const DEFAULT_CHUNK = 250_000

/**
 * The fillfactor at which rows of `avgRow` bytes pack `rowsPerPage` to a page,
 * as the service's own completions left them: each row takes its size and a
 * 4-byte line pointer, after a 24-byte page header.
 */
export function fillfactorFor(rowsPerPage: number, avgRow: number): number {
  const rows = Math.max(1, Math.round(rowsPerPage))
  const bytes = 24 + rows * (Math.ceil(avgRow / 8) * 8 + 4)
  return Math.min(100, Math.max(10, Math.ceil((100 * bytes) / 8192)))
}

/** Seeds the key table up to `options.keys` keys from the newest completed key in it (see above). */
export async function seedDay(sql: postgres.Sql, options: DaySeedOptions, log: (line: string) => void): Promise<DaySeed> {
  const chunk = options.chunk ?? DEFAULT_CHUNK
  const [counted] = await sql<{ existing: number }[]>`select count(*)::int as existing from idempotency_keys`
  const existing = counted?.existing ?? 0
  const total = Math.max(0, options.keys - existing)
  const processing = Math.min(options.processing, total)
  const expired = Math.min(Math.round(options.expiredShare * options.keys), total - processing)
  const done = total - processing
  const columns = (await sql<{ name: string }[]>`
    select column_name as name from information_schema.columns
     where table_schema = 'public' and table_name = 'idempotency_keys' order by ordinal_position`).map((c) => c.name)
  // The newest completed key, of either form (sql/engine/00020): a new-form key is copied with its answer.
  const [template] = await sql<{ tenant: string; key: string; apart: boolean }[]>`
    select k.tenant, k.key, k.apart from ${sql.unsafe(KEY_STATES)} k where k.status = 'done' order by k.completed_at desc limit 1`
  if (!template) throw new Error('no completed key to copy: make payments through the service first')
  const apart = template.apart
  const [table] = await sql<{ reloptions: string[] | null }[]>`select reloptions from pg_class where oid = 'idempotency_keys'::regclass`
  const ownFillfactor = (table?.reloptions ?? []).find((o) => o.startsWith('fillfactor='))?.slice('fillfactor='.length) ?? '100'
  const salt = crypto.randomUUID()
  const retention = options.retentionSeconds

  /** Per column: the copy's own value (SQL over the series' `i` and the row's time `t`), else the template's. */
  const overrides = (status: 'done' | 'processing'): Record<string, string> => ({
    key: `md5('${salt}' || i)::uuid::text`,
    ...(apart
      ? { fingerprint: 'null', digest: 'sha256(int8send(i))', status: 'null', locked_at: 'null', summary: 'null', http_request_id: 'null' }
      : { fingerprint: `encode(sha256(int8send(i)), 'hex')`, status: `'${status}'`, locked_at: 't',
          http_request_id: `case when tpl.http_request_id is null then null else gen_random_uuid()::text end` }),
    lease: `(random() * 9.2e18)::int8`,
    attempts: '1',
    created_at: 't',
    // Time-ordered, as the engine draws them (UUID v7, src/core/claim.ts): the answers' index grows at its right edge.
    request_id: `(lpad(to_hex(floor(extract(epoch from t) * 1000)::int8), 12, '0') || '7' || substr(md5(random()::text), 1, 3)
                  || '8' || substr(md5(random()::text), 1, 15))::uuid`,
    owner: 'null',
    released_at: 'null',
    release_reason: 'null',
    stale_at: 'null',
    ...(status === 'done' && !apart
      ? { completed_at: `t + interval '20 milliseconds'` }
      : { completed_at: 'null', response_status: 'null', response_headers: 'null', response_body: 'null' }),
  })
  // The new form's rest of a key: a completed key's answer (the template's, under the copy's request id), a
  // processing key's entry (the engine writes both in the claim's statement; no trigger does it for this form).
  const rest = (status: 'done' | 'processing') => !apart ? '' : status === 'done'
    ? `, answered as (
        insert into idempotency_answers (tenant, request_id, completed_at, response_status, response_headers, response_body)
        select c.tenant, c.request_id, c.created_at + interval '20 milliseconds', a.response_status, a.response_headers, a.response_body
          from copied c, idempotency_answers a join idempotency_keys tk on tk.tenant = a.tenant and tk.request_id = a.request_id
         where tk.tenant = $1 and tk.key = $2)`
    : `, listed as (
        insert into idempotency_processing (stale_at, tenant, key, locked_at, lease)
        select c.created_at + interval '30 seconds', c.tenant, c.key, c.created_at, c.lease from copied c)`
  const insert = async (status: 'done' | 'processing', from: number, to: number, time: string) => {
    const set = overrides(status)
    const values = columns.map((c) => set[c] ?? `tpl."${c}"`).join(', ')
    await sql.unsafe(`
      with copied as (
        insert into idempotency_keys (${columns.map((c) => `"${c}"`).join(', ')})
        select ${values}
          from (select * from idempotency_keys where tenant = $1 and key = $2) tpl,
               generate_series(${from}::int8, ${to}::int8) i,
               lateral (select ${time} as t) at
        returning tenant, key, request_id, created_at, lease
      )${rest(status)}
      select count(*) from copied`, [template.tenant, template.key])
  }

  const started = performance.now()
  await sql.unsafe(`alter table idempotency_keys set (fillfactor = ${options.fillfactor})`)
  try {
    // i = 1 .. expired: from retention + 2 h ago to a minute past the cut-off, oldest first.
    const expiredTime = `now() - make_interval(secs => ${retention} + 7200 - (i::float8 / ${Math.max(expired, 1)}) * 7140)`
    // i = expired + 1 .. done: from 23 hours (or 23/24 of the retention) ago to a minute ago.
    const span = Math.max(60, Math.min(retention - 3600, (retention * 23) / 24))
    const liveTime = `now() - make_interval(secs => 60 + ${span - 60} * (1 - (i - ${expired})::float8 / ${Math.max(done - expired, 1)}))`
    for (let from = 1; from <= done; from += chunk) {
      const to = Math.min(done, from + chunk - 1)
      if (from <= expired) await insert('done', from, Math.min(to, expired), expiredTime)
      if (to > expired) await insert('done', Math.max(from, expired + 1), to, liveTime)
      const seconds = (performance.now() - started) / 1000
      log(`seeded ${to.toLocaleString('en')} of ${done.toLocaleString('en')} completed keys in ${seconds.toFixed(0)} s (${Math.round(to / seconds).toLocaleString('en')}/s)`)
    }
    if (processing > 0)
      await insert('processing', done + 1, done + processing, `now() - case when i % 2 = 0 then interval '1 hour' else interval '0' end`)
  } finally {
    await sql.unsafe(`alter table idempotency_keys set (fillfactor = ${ownFillfactor})`)
  }
  const seconds = (performance.now() - started) / 1000
  const vacuumStarted = performance.now()
  await sql`vacuum (analyze) idempotency_keys`
  await sql`vacuum (analyze) idempotency_processing`
  await sql`vacuum (analyze) idempotency_answers`
  const vacuumSeconds = (performance.now() - vacuumStarted) / 1000
  const [past] = await sql<{ n: number }[]>`
    select count(*)::int as n from idempotency_keys where created_at <= now() - make_interval(secs => ${retention})`
  return { done, expired, pastRetention: past?.n ?? 0, processing, seconds, vacuumSeconds, fillfactor: options.fillfactor }
}
