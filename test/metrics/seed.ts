import type postgres from 'postgres'

/**
 * Fills idempotency_keys like a busy service after a day: `done` completed
 * keys spread over the 24 hours before `now`, a few repeating a request (as a
 * client with a new key per retry would), and `processing` keys, stuck-i
 * locked i * 10 s before `now`, some of them stale.
 * @param now @default the database's now()
 */
export async function seedKeys(sql: postgres.Sql, done: number, processing: number, now?: Date): Promise<void> {
  const at = now ?? null
  await sql`
    insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at,
                                  completed_at, response_status, response_headers, response_body)
    select case when r % 10 = 0 then 'globex' else 'acme' end, 'seed-' || i, 'POST', '/api/payments',
           md5(r::text) || md5(r::text), 'done', t, t, t, 201, '{"content-type":"application/json"}'::jsonb, '{"id":"x"}'
      from generate_series(1, ${done}) i,
           -- request r: every 1000th request is repeated under the next key
           lateral (select i - (i % 1000 = 1)::int) as req(r),
           lateral (select coalesce(${at}::timestamptz, now()) - make_interval(secs => (i::float8 / ${done}) * 86400)) as at(t)`
  await sql`
    insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at)
    select 'acme', 'stuck-' || i, 'POST', '/api/payments', md5(i::text) || md5('p' || i), 'processing',
           coalesce(${at}::timestamptz, now()) - make_interval(secs => i * 10), coalesce(${at}::timestamptz, now()) - make_interval(secs => i * 10)
      from generate_series(1, ${processing}) i`
  await sql`analyze idempotency_keys`
}
