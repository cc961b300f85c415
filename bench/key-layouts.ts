/**
 * Bytes per key of candidate key-table layouts (issue 40), measured on the
 * tables themselves: the engine's claim and completion shapes replayed at the
 * table level, with a payment's real column values, `concurrency` requests in
 * flight, so a layout can be judged before any engine code is written for it.
 *
 *   bun bench/key-layouts.ts [--keys 4000] [--concurrency 1,4,32] [--vacuum-every 0] [--layout <name>]
 *
 * Each step is one statement, as the lane sends them: it claims up to
 * ceil(concurrency / 2) new keys (one multi-row INSERT ... ON CONFLICT into
 * the key table and the processing list) and completes the keys the step
 * before claimed. A completion's shape is the layout's:
 *
 *  - `as migrated`: the landed schema, the completion an UPDATE of the key's
 *    row (status, times, answer) and a DELETE of its processing entry, as
 *    src/core/completion-sql.ts writes it.
 *  - `as migrated, smaller row`: the same, on a row that carries less (the
 *    fingerprint as bytes, the headers as text, the summary dropped at
 *    completion): what trimming the row alone buys while a completion still
 *    updates it.
 *  - `answers apart`: the key row is written once, at claim (fillfactor 100),
 *    and never updated by a completion. The lease lives in the processing
 *    entry, so a completion is a DELETE of that entry under its lease (the
 *    fence) and an INSERT of the answer into a table of its own, keyed like
 *    the key table. Status is then where the row is: listed (processing), an
 *    answer (done), neither (released).
 *  - `answers apart, trimmed`: the same with the answer keyed by the key's
 *    request id (a uuid, not the key's text), the fingerprint as bytes, the
 *    headers as text and the summary kept only in the processing entry.
 *  - `answers apart, lean`: trimmed, with the lease, its owner and time and
 *    the HTTP request's id kept only in the processing entry too, the
 *    headers without the route's constant content-type, a block-range (BRIN)
 *    index of the answers by completion time (the purge's), and the list
 *    filled to 100 %.
 *
 * `--vacuum-every N`: a plain VACUUM of the layout's tables after every N
 * claims, as autovacuum would pass in a service that runs for days (it
 * records the space pruning freed, which claims then reuse).
 *
 * Counted per completed key: pg_total_relation_size of every table of the
 * layout (heap, TOAST, indexes, maps), as bench/key-bytes.ts counts the
 * service's; the `as migrated` row is checked against that tool (the service
 * itself, same keys and concurrency) in docs/explanation/scaling.md.
 */
import { parseArgs } from 'node:util'
import postgres from 'postgres'
import { migrateService } from '../src/store/migrate'

/** A payment's stored answer and claim as the service writes them (copied from a key of bench/key-bytes.ts). */
const answer = (id: string, at: string) => ({
  headers: { location: `/api/payments/${id}`, 'content-type': 'application/json' },
  body: JSON.stringify({ id, amount: 1000, currency: 'EUR', customer: 'cus_0', description: null, status: 'succeeded', provider_reference: `ch_${crypto.randomUUID().replaceAll('-', '').slice(0, 24)}`, created_at: at }),
})

interface Layout {
  readonly name: string
  /** Tables beside the migrated schema (none for `as migrated`). */
  readonly ddl: string
  readonly tables: readonly string[]
  /** One step: $1 the keys to claim, $2 the keys to complete with their answers (jsonb arrays). */
  readonly step: string
}

const claimInput = `jsonb_to_recordset($1::text::jsonb) as i(key text, fingerprint text, lease bigint, summary jsonb, http_request_id text)`
const completeInput = `jsonb_to_recordset($2::text::jsonb) as c(key text, lease bigint, headers jsonb, body text)`

/**
 * The landed statements (an UPDATE of the key's row at completion), with what
 * the claim writes as the fingerprint and what the completion sets besides.
 */
const updatedRowStep = (fingerprint: string, completed: string) => `
      with claimed as (
        insert into idempotency_keys as k (tenant, key, method, path, fingerprint, status, lease, summary, http_request_id, created_at, locked_at, stale_at)
        select 'acme', i.key, 'POST', '/api/payments', ${fingerprint}, 'processing', i.lease, i.summary, i.http_request_id, now(), now(), now() + interval '30 s'
          from ${claimInput}
        on conflict (tenant, key) do nothing
        returning k.tenant, k.key, k.stale_at, k.locked_at
      ), listed as (
        insert into idempotency_processing (stale_at, tenant, key, locked_at) select stale_at, tenant, key, locked_at from claimed
      ), input as (select * from ${completeInput}),
      before as (select k.key, k.stale_at from input c join idempotency_keys k on k.tenant = 'acme' and k.key = c.key),
      done as (
        update idempotency_keys k
           set status = 'done', completed_at = clock_timestamp(), owner = null, stale_at = null,
               response_status = 201, response_body = c.body, ${completed}
          from input c
         where k.tenant = 'acme' and k.key = c.key and k.lease = c.lease and k.status = 'processing'
        returning k.key
      )
      delete from idempotency_processing pr using done d join before b on b.key = d.key
       where pr.stale_at = b.stale_at and pr.tenant = 'acme' and pr.key = d.key`

/**
 * The completion of the layouts whose answer is keyed by the key's request id:
 * the entry deleted under its lease (the fence), the answer inserted for the
 * entries deleted, with `headers` (a jsonb expression of the input `c`) as text.
 */
const answerByRequestId = (headers: string) => `input as (select * from ${completeInput}),
      done as (
        delete from layout_processing pr using input c
         where pr.tenant = 'acme' and pr.key = c.key and pr.lease = c.lease
        returning pr.key
      )
      insert into layout_answers (request_id, completed_at, response_status, response_headers, response_body)
      select k.request_id, clock_timestamp(), 201, (${headers})::text, c.body
        from input c join done d on d.key = c.key join layout_keys k on k.tenant = 'acme' and k.key = c.key`

const LAYOUTS: readonly Layout[] = [
  {
    name: 'as migrated',
    ddl: '',
    tables: ['idempotency_keys', 'idempotency_processing'],
    step: updatedRowStep('i.fingerprint', 'response_headers = c.headers'),
  },
  {
    name: 'as migrated, smaller row',
    // The same statements on a row that carries less: the fingerprint as 32 bytes, the headers as text,
    // the summary dropped at completion (an operator's view of a request in flight, the answer has it then).
    ddl: `
      alter table idempotency_keys drop constraint idempotency_keys_fingerprint_hex;
      alter table idempotency_keys alter fingerprint type bytea using decode(fingerprint, 'hex');
      alter table idempotency_keys alter response_headers type text;`,
    tables: ['idempotency_keys', 'idempotency_processing'],
    step: updatedRowStep(`decode(i.fingerprint, 'hex')`, 'response_headers = c.headers::text, summary = null'),
  },
  {
    name: 'answers apart',
    ddl: `
      create table layout_keys (
        tenant text not null, key text not null, method text not null, path text not null, fingerprint text not null,
        lease bigint not null, attempts integer not null default 1,
        created_at timestamptz not null default now(), locked_at timestamptz not null default now(),
        request_id uuid not null default gen_random_uuid(), owner uuid, released_at timestamptz, release_reason text,
        summary jsonb, http_request_id text,
        primary key (tenant, key)
      );
      create index on layout_keys (created_at);
      create table layout_processing (
        stale_at timestamptz not null, tenant text not null, key text not null, lease bigint not null, locked_at timestamptz not null,
        primary key (stale_at, tenant, key)
      ) with (fillfactor = 25);
      create table layout_answers (
        tenant text not null, key text not null, completed_at timestamptz not null,
        response_status smallint not null, response_headers jsonb, response_body text not null,
        primary key (tenant, key)
      );`,
    tables: ['layout_keys', 'layout_processing', 'layout_answers'],
    step: `
      with claimed as (
        insert into layout_keys as k (tenant, key, method, path, fingerprint, lease, summary, http_request_id)
        select 'acme', i.key, 'POST', '/api/payments', i.fingerprint, i.lease, i.summary, i.http_request_id
          from ${claimInput}
        on conflict (tenant, key) do nothing
        returning k.tenant, k.key, k.lease, k.locked_at
      ), listed as (
        insert into layout_processing (stale_at, tenant, key, lease, locked_at)
        select locked_at + interval '30 s', tenant, key, lease, locked_at from claimed
      ), input as (select * from ${completeInput}),
      done as (
        delete from layout_processing pr using input c
         where pr.tenant = 'acme' and pr.key = c.key and pr.lease = c.lease
        returning pr.key
      )
      insert into layout_answers (tenant, key, completed_at, response_status, response_headers, response_body)
      select 'acme', c.key, clock_timestamp(), 201, c.headers, c.body from input c join done d on d.key = c.key`,
  },
  {
    name: 'answers apart, trimmed',
    ddl: `
      create table layout_keys (
        tenant text not null, key text not null, method text not null, path text not null, fingerprint bytea not null,
        lease bigint not null, attempts integer not null default 1,
        created_at timestamptz not null default now(), locked_at timestamptz not null default now(),
        request_id uuid not null default gen_random_uuid(), owner uuid, released_at timestamptz, release_reason text,
        http_request_id text,
        primary key (tenant, key)
      );
      create index on layout_keys (created_at);
      create table layout_processing (
        stale_at timestamptz not null, tenant text not null, key text not null, lease bigint not null, locked_at timestamptz not null,
        summary jsonb,
        primary key (stale_at, tenant, key)
      ) with (fillfactor = 25);
      create table layout_answers (
        request_id uuid primary key, completed_at timestamptz not null,
        response_status smallint not null, response_headers text, response_body text not null
      );`,
    tables: ['layout_keys', 'layout_processing', 'layout_answers'],
    step: `
      with claimed as (
        insert into layout_keys as k (tenant, key, method, path, fingerprint, lease, http_request_id)
        select 'acme', i.key, 'POST', '/api/payments', decode(i.fingerprint, 'hex'), i.lease, i.http_request_id
          from ${claimInput}
        on conflict (tenant, key) do nothing
        returning k.tenant, k.key, k.lease, k.locked_at
      ), listed as (
        insert into layout_processing (stale_at, tenant, key, lease, locked_at, summary)
        select c.locked_at + interval '30 s', c.tenant, c.key, c.lease, c.locked_at, i.summary
          from claimed c join ${claimInput} on i.key = c.key
      ), ${answerByRequestId('c.headers')}`,
  },
  {
    name: 'answers apart, lean',
    // The trimmed layout with all that belongs to the key's time in flight (its lease, owner, lease time,
    // summary and HTTP request's id) in its processing entry alone, the answer's headers without the
    // route's constant content-type (the route would add it back), and the answers' completion time indexed
    // by block range (BRIN: answers are written in completion order, so the purge's oldest are the first blocks).
    // The list full (fillfactor 100): an entry is inserted and deleted, never updated by a completion, and a
    // page's deleted entries are pruned for the next inserts (the engine's own list since sql/engine/00018).
    ddl: `
      create table layout_keys (
        tenant text not null, key text not null, method text not null, path text not null, fingerprint bytea not null,
        attempts integer not null default 1, created_at timestamptz not null default now(),
        request_id uuid not null default gen_random_uuid(), released_at timestamptz, release_reason text,
        primary key (tenant, key)
      );
      create table layout_processing (
        stale_at timestamptz not null, tenant text not null, key text not null, lease bigint not null, locked_at timestamptz not null,
        owner uuid, summary jsonb, http_request_id text,
        primary key (stale_at, tenant, key)
      ) with (fillfactor = 100);
      create table layout_answers (
        request_id uuid primary key, completed_at timestamptz not null,
        response_status smallint not null, response_headers text, response_body text not null
      );
      create index on layout_answers using brin (completed_at);`,
    tables: ['layout_keys', 'layout_processing', 'layout_answers'],
    step: `
      with claimed as (
        insert into layout_keys as k (tenant, key, method, path, fingerprint)
        select 'acme', i.key, 'POST', '/api/payments', decode(i.fingerprint, 'hex')
          from ${claimInput}
        on conflict (tenant, key) do nothing
        returning k.tenant, k.key, k.created_at
      ), listed as (
        insert into layout_processing (stale_at, tenant, key, lease, locked_at, owner, summary, http_request_id)
        select c.created_at + interval '30 s', c.tenant, c.key, i.lease, c.created_at, gen_random_uuid(), i.summary, i.http_request_id
          from claimed c join ${claimInput} on i.key = c.key
      ), ${answerByRequestId(`c.headers - 'content-type'`)}`,
  },
  {
    name: 'answers apart, in the engine tables',
    // The lean layout as a release of the engine would reach it: new-form key rows in the key table as it
    // is (its other columns null, the fingerprint still hex), the processing entry grown by the lease and
    // what else a request in flight carries, found by (tenant, key), and the answers by (tenant, request id):
    // on Citus every table is distributed by tenant.
    ddl: `
      alter table idempotency_keys drop constraint idempotency_keys_status_check, drop constraint done_has_response,
        alter lease drop not null, alter lease drop default, alter locked_at drop not null, set (fillfactor = 100);
      alter table idempotency_processing add column lease bigint, add column owner uuid, add column summary jsonb, add column http_request_id text;
      create unique index on idempotency_processing (tenant, key);
      create table idempotency_answers (
        tenant text not null, request_id uuid not null, completed_at timestamptz not null,
        response_status smallint not null, response_headers text, response_body text not null,
        primary key (tenant, request_id)
      );
      create index on idempotency_answers using brin (completed_at);`,
    tables: ['idempotency_keys', 'idempotency_processing', 'idempotency_answers'],
    step: `
      with claimed as (
        insert into idempotency_keys as k (tenant, key, method, path, fingerprint, status, lease, locked_at)
        select 'acme', i.key, 'POST', '/api/payments', i.fingerprint, 'claimed', null, null
          from ${claimInput}
        on conflict (tenant, key) do nothing
        returning k.tenant, k.key, k.created_at
      ), listed as (
        insert into idempotency_processing (stale_at, tenant, key, lease, locked_at, owner, summary, http_request_id)
        select c.created_at + interval '30 s', c.tenant, c.key, i.lease, c.created_at, gen_random_uuid(), i.summary, i.http_request_id
          from claimed c join ${claimInput} on i.key = c.key
      ), input as (select * from ${completeInput}),
      done as (
        delete from idempotency_processing pr using input c
         where pr.tenant = 'acme' and pr.key = c.key and pr.lease = c.lease
        returning pr.key
      )
      insert into idempotency_answers (tenant, request_id, completed_at, response_status, response_headers, response_body)
      select 'acme', k.request_id, clock_timestamp(), 201, (c.headers - 'content-type')::text, c.body
        from input c join done d on d.key = c.key join idempotency_keys k on k.tenant = 'acme' and k.key = c.key`,
  },
]

export interface LayoutBytes {
  readonly layout: string
  readonly concurrency: number
  readonly keys: number
  readonly perKey: number
  readonly heap: number
  readonly indexes: number
  readonly toast: number
  readonly maps: number
  readonly rowsPerPage: number
  readonly hot: number
  readonly updates: number
  /** pg_total_relation_size of each table, per key. */
  readonly byTable: Readonly<Record<string, number>>
}

async function measure(sql: postgres.Sql, layout: Layout, keys: number, concurrency: number, vacuumEvery: number): Promise<LayoutBytes> {
  const batch = Math.max(1, Math.ceil(concurrency / 2))
  let pending: { key: string; lease: string }[] = []
  let vacuumed = 0
  for (let claimed = 0; claimed < keys || pending.length > 0;) {
    if (vacuumEvery > 0 && claimed - vacuumed >= vacuumEvery) {
      await sql.unsafe(`vacuum ${layout.tables.join(', ')}`)
      vacuumed = claimed
    }
    const claims = Array.from({ length: Math.min(batch, keys - claimed) }, () => ({
      key: crypto.randomUUID(),
      fingerprint: new Bun.CryptoHasher('sha256').update(crypto.randomUUID()).digest('hex'),
      lease: String(Math.floor(Math.random() * 2 ** 53)),
      summary: { amount: 1000, currency: 'EUR', customer: 'cus_0' },
      http_request_id: crypto.randomUUID(),
    }))
    const at = new Date().toISOString()
    const completions = pending.map(({ key, lease }) => ({ key, lease, ...answer(crypto.randomUUID(), at) }))
    await sql.unsafe(layout.step, [JSON.stringify(claims), JSON.stringify(completions)])
    claimed += claims.length
    pending = claims.map(({ key, lease }) => ({ key, lease }))
  }
  const main = layout.tables[0]!
  for (let i = 0; i < 100; i++) { // the backend reports its counters at the end of its transaction, the collector a moment later
    const [counted] = await sql<{ n: number }[]>`select n_tup_upd::int as n from pg_stat_user_tables where relname = ${main}`
    if (main !== 'idempotency_keys' || (counted?.n ?? 0) >= keys) break
    await Bun.sleep(50)
  }
  const [row] = await sql<LayoutBytes[]>`
    with t as (select oid, reltoastrelid from pg_class where relname = any(${layout.tables as string[]}) and relnamespace = 'public'::regnamespace)
    select (select sum(pg_total_relation_size(oid)) from t)::float8 / ${keys} as "perKey",
           (select sum(pg_relation_size(oid)) from t)::float8 / ${keys} as heap,
           (select sum(pg_indexes_size(oid)) from t)::float8 / ${keys} as indexes,
           (select coalesce(sum(pg_total_relation_size(nullif(reltoastrelid, 0))), 0) from t)::float8 / ${keys} as toast,
           (select sum(pg_relation_size(oid, 'fsm') + pg_relation_size(oid, 'vm')) from t)::float8 / ${keys} as maps,
           ${keys}::float8 / greatest(pg_relation_size(${main}) / 8192, 1) as "rowsPerPage",
           (select n_tup_hot_upd from pg_stat_user_tables where relname = ${main})::int as hot,
           (select n_tup_upd from pg_stat_user_tables where relname = ${main})::int as updates`
  const tables = await sql<{ name: string; bytes: number }[]>`
    select relname as name, pg_total_relation_size(oid)::float8 / ${keys} as bytes
      from pg_class where relname = any(${layout.tables as string[]}) and relnamespace = 'public'::regnamespace`
  const byTable = Object.fromEntries(layout.tables.map((t) => [t, tables.find((r) => r.name === t)?.bytes ?? 0]))
  return { ...row!, layout: layout.name, concurrency, keys, byTable }
}

/** Every layout at every concurrency, each on a fresh database of its own. */
export async function measureLayouts(keys: number, concurrencies: readonly number[], vacuumEvery = 0, only?: string): Promise<LayoutBytes[]> {
  const base = process.env.DATABASE_URL
  if (!base) throw new Error('DATABASE_URL is not set')
  const admin = postgres(base, { max: 1, onnotice: () => undefined })
  const results: LayoutBytes[] = []
  try {
    for (const layout of LAYOUTS.filter((l) => only === undefined || l.name === only)) {
      for (const concurrency of concurrencies) {
        const name = `idem_key_layouts_${crypto.randomUUID().slice(0, 8)}`
        await admin.unsafe(`create database "${name}"`)
        const url = Object.assign(new URL(base), { pathname: `/${name}` }).toString()
        const sql = postgres(url, { max: 1, onnotice: () => undefined })
        try {
          await migrateService(url)
          if (layout.ddl) await sql.unsafe(layout.ddl)
          results.push(await measure(sql, layout, keys, concurrency, vacuumEvery))
        } finally {
          await sql.end({ timeout: 1 })
          await admin.unsafe(`drop database if exists "${name}" with (force)`)
        }
      }
    }
  } finally {
    await admin.end()
  }
  return results
}

if (import.meta.main) {
  const { values } = parseArgs({ options: { keys: { type: 'string', default: '4000' }, concurrency: { type: 'string', default: '1,4,32' }, 'vacuum-every': { type: 'string', default: '0' }, layout: { type: 'string' } } })
  if (values.layout !== undefined && !LAYOUTS.some((l) => l.name === values.layout))
    throw new Error(`--layout: no layout named ${JSON.stringify(values.layout)}; the layouts: ${LAYOUTS.map((l) => JSON.stringify(l.name)).join(', ')}`)
  const results = await measureLayouts(Number(values.keys), values.concurrency.split(',').map(Number), Number(values['vacuum-every']), values.layout)
  console.log('| layout | in flight | B per key | heap | indexes | TOAST | FSM+VM | by table | rows/page (first table) | HOT |')
  console.log('| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |')
  for (const r of results) {
    const hot = r.updates > 0 ? `${(100 * r.hot / r.updates).toFixed(1)} % (${r.hot}/${r.updates})` : 'no updates'
    console.log(`| ${r.layout} | ${r.concurrency} | ${r.perKey.toFixed(0)} | ${r.heap.toFixed(0)} | ${r.indexes.toFixed(0)} | ${r.toast.toFixed(0)} | ${r.maps.toFixed(0)} | ${Object.entries(r.byTable).map(([t, b]) => `${t} ${b.toFixed(0)}`).join(', ')} | ${r.rowsPerPage.toFixed(1)} | ${hot} |`)
  }
}
