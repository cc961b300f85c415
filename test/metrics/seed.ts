import type postgres from 'postgres'

/**
 * Fills idempotency_keys like a busy service after a day: `done` completed
 * keys spread over the 24 hours before `now`, a few repeating a request (as a
 * client with a new key per retry would), and `processing` keys, stuck-i
 * locked i * 10 s before `now`, some of them stale. In the database's key
 * form (sql/engine/00020): in the new one each completed key's answer is a
 * row of idempotency_answers and each processing key's lease its entry.
 * @param now @default the database's now()
 */
export async function seedKeys(sql: postgres.Sql, done: number, processing: number, now?: Date): Promise<void> {
  const at = now ?? null
  const [{ apart }] = await sql<{ apart: boolean }[]>`
    select coalesce((select form = 'new' from idempotency_key_form where id = 1), false) as apart` as unknown as [{ apart: boolean }]
  const completed = sql`
    select case when r % 10 = 0 then 'globex' else 'acme' end as tenant, 'seed-' || i as key, md5(r::text) || md5(r::text) as fingerprint, t
      from generate_series(1, ${done}) i,
           -- request r: every 1000th request is repeated under the next key
           lateral (select i - (i % 1000 = 1)::int) as req(r),
           lateral (select coalesce(${at}::timestamptz, now()) - make_interval(secs => (i::float8 / ${done}) * 86400)) as at(t)`
  const stuck = sql`
    select 'acme' as tenant, 'stuck-' || i as key, md5(i::text) || md5('p' || i) as fingerprint, coalesce(${at}::timestamptz, now()) - make_interval(secs => i * 10) as t
      from generate_series(1, ${processing}) i`
  if (!apart) {
    await sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at,
                                    completed_at, response_status, response_headers, response_body)
      select c.tenant, c.key, 'POST', '/api/payments', c.fingerprint, 'done', c.t, c.t, c.t, 201, '{"content-type":"application/json"}'::jsonb, '{"id":"x"}'
        from (${completed}) c`
    await sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at)
      select s.tenant, s.key, 'POST', '/api/payments', s.fingerprint, 'processing', s.t, s.t from (${stuck}) s`
    await sql`analyze idempotency_keys`
    return
  }
  await sql`
    with k as (
      insert into idempotency_keys (tenant, key, method, path, digest, created_at, locked_at)
      select c.tenant, c.key, 'POST', '/api/payments', decode(c.fingerprint, 'hex'), c.t, null from (${completed}) c
      returning tenant, request_id, created_at
    )
    insert into idempotency_answers (tenant, request_id, completed_at, response_status, response_headers, response_body)
    select k.tenant, k.request_id, k.created_at, 201, '{}', '{"id":"x"}' from k`
  await sql`
    with k as (
      insert into idempotency_keys (tenant, key, method, path, digest, created_at, locked_at)
      select s.tenant, s.key, 'POST', '/api/payments', decode(s.fingerprint, 'hex'), s.t, null from (${stuck}) s
      returning tenant, key, lease, created_at
    )
    insert into idempotency_processing (stale_at, tenant, key, locked_at, lease)
    select k.created_at + interval '30 seconds', k.tenant, k.key, k.created_at, k.lease from k`
  await sql`analyze idempotency_keys, idempotency_answers, idempotency_processing`
}
