/**
 * The one place where the bench writes the engine's tables directly; every
 * other figure goes through HTTP, the wire or PostgreSQL's own counters. When
 * the engine's schema changes (a claims table, a per-row deadline...), update
 * these functions and nothing else: the 1M keys for the gauges and the purge
 * (a million requests through HTTP would take most of an hour here), and the
 * one key in flight behind the 409s (a request held at a provider would run
 * into its deadline and release the key in the middle of the storm).
 */
import type postgres from 'postgres'
import { fingerprint } from '../src/core/fingerprint'

/** Processing keys among the seeded ones: in-flight and stranded keys are few; half of these are stale. */
const SEEDED_PROCESSING = 1_000

/**
 * Fills idempotency_keys with `count` keys in one generate_series INSERT:
 * completed keys spread evenly over the last 23 hours (all within the 24 h
 * retention), over 10 tenants, each with its own request fingerprint and a
 * stored answer of realistic size; plus SEEDED_PROCESSING processing keys,
 * half of them older than any TTL. Then ANALYZE, as autovacuum would.
 */
export async function seedKeys(sql: postgres.Sql, count: number): Promise<void> {
  const done = count - SEEDED_PROCESSING
  // Completed rows inserted whole would fill each page to the table's fillfactor (30 %: room for
  // claims to grow into their completed size, sql/engine/00005), three times the pages the same keys
  // take when claimed and completed in place. Inserted at 100 %, the table looks as it does in use.
  await sql`alter table idempotency_keys set (fillfactor = 100)`
  await sql`
    insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, completed_at,
                                  response_status, response_headers, response_body)
    select 'seed-' || (i % 10), 'seed-' || i, 'POST', '/api/payments', encode(sha256(int8send(i)), 'hex'), 'done', t, t, t,
           201, '{"content-type":"application/json","location":"/api/payments/00000000-0000-0000-0000-000000000000"}'::jsonb,
           '{"id":"00000000-0000-0000-0000-000000000000","amount":1250,"currency":"EUR","customer":"cus_1","description":null,"status":"succeeded","provider_reference":"ch_0123456789abcdef0123456789abcdef","created_at":"2026-01-01T00:00:00.000Z"}'
      from generate_series(1, ${done}::int8) i, lateral (select now() - (i * 82800.0 / ${done}) * interval '1 second' as t) at`
  await sql`
    insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at)
    select 'seed-' || (i % 10), 'seed-p-' || i, 'POST', '/api/payments', encode(sha256(int8send(i)), 'hex'), 'processing', t, t
      from generate_series(1, ${SEEDED_PROCESSING}::int8) i,
           lateral (select now() - case when i % 2 = 0 then interval '1 hour' else interval '0' end as t) at`
  await sql`alter table idempotency_keys set (fillfactor = 30)`
  await sql`analyze idempotency_keys`
}

/**
 * A key in flight, as a live worker leaves it while it waits on the provider:
 * a `processing` row, young, and no lock (atomic phases: nothing is held
 * across the foreign call). Its retries with `body` are answered 409.
 */
export async function insertInFlightKey(sql: postgres.Sql, tenant: string, key: string, path: string, body: unknown): Promise<void> {
  await sql`
    insert into idempotency_keys (tenant, key, method, path, fingerprint, status)
    values (${tenant}, ${key}, 'POST', ${path}, ${fingerprint('POST', path, body)}, 'processing')`
}

/** Keeps the in-flight key young, so it never turns stale (reclaimable) on a slow machine. */
export async function keepInFlightKeyYoung(sql: postgres.Sql, tenant: string, key: string): Promise<void> {
  await sql`update idempotency_keys set locked_at = now() where tenant = ${tenant} and key = ${key}`
}
