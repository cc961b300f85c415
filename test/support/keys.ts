/**
 * The one key factory: puts idempotency keys directly in any state, as a
 * crashed, finished or released worker would have left them (STYLE 8).
 */
import type postgres from 'postgres'
import { fingerprint } from '../../src/core/fingerprint'
import type { RequestIdentity } from '../../src/core/types'

/** A request identity for engine tests. */
export function identity(overrides: Partial<RequestIdentity> & { body?: unknown } = {}): RequestIdentity {
  const { body = { amount: 1 }, ...rest } = overrides
  const method = rest.method ?? 'POST'
  const path = rest.path ?? '/api/payments'
  return {
    tenant: 'acme',
    key: crypto.randomUUID(),
    method,
    path,
    fingerprint: fingerprint(method, path, body),
    ...rest,
  }
}

/** Any valid fingerprint (64 hex characters), the same for the same label: "the same request" without building one. */
export function fingerprintOf(label: string): string {
  return new Bun.CryptoHasher('sha256').update(label).digest('hex')
}

export interface KeyState {
  status: 'processing' | 'done'
  /** When the current lease was taken; an old one makes the key stale. @default completedAt for a done key, else now */
  lockedAt?: Date
  /** When a done key completed. @default now */
  completedAt?: Date
}

/**
 * Whether the database claims keys in the new form (sql/engine/00020: the
 * answer apart, the lease on the processing entry): the keys made here take
 * the form a claim there would, so a test of a key in some state tests the
 * form the database runs (TEST_KEY_FORM, test/support/db.ts).
 */
async function claimsApart(sql: postgres.Sql): Promise<boolean> {
  const [row] = await sql<{ apart: boolean }[]>`
    select to_regclass('idempotency_key_form') is not null
           and coalesce((select form = 'new' from idempotency_key_form where id = 1), false) as apart`
  return row!.apart
}

/** Keys `rows` (a relation of tenant, key, fingerprint as hex), all in `state`, in the database's form; their leases. */
async function insertKeys(sql: postgres.Sql, rows: postgres.PendingQuery<postgres.Row[]>, state: KeyState): Promise<{ lease: string }[]> {
  const done = state.status === 'done'
  const completedAt = done ? (state.completedAt ?? new Date()) : null
  const lockedAt = state.lockedAt ?? completedAt ?? new Date()
  if (!await claimsApart(sql)) {
    return sql<{ lease: string }[]>`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at,
                                    completed_at, response_status, response_headers, response_body)
      select r.tenant, r.key, r.method, r.path, r.fingerprint, ${state.status}, ${lockedAt}, ${lockedAt}, ${completedAt}, ${done ? 201 : null},
             ${done ? sql.json({ 'content-type': 'application/json' }) : null}, ${done ? '{"stored":true}' : null}
        from ${rows} r
      returning lease::text`
  }
  // The new form: the row as its claim wrote it, with its answer (done) or its entry (processing, its
  // deadline the settings' TTL after its lease's time, as the old form's trigger dates it).
  return sql<{ lease: string }[]>`
    with k as (
      insert into idempotency_keys (tenant, key, method, path, digest, created_at, locked_at)
      select r.tenant, r.key, r.method, r.path, decode(r.fingerprint, 'hex'), ${lockedAt}, null from ${rows} r
      returning tenant, key, lease, request_id
    ),
    answered as (
      insert into idempotency_answers (tenant, request_id, completed_at, response_status, response_headers, response_body)
      select k.tenant, k.request_id, ${completedAt}, 201, '{}', '{"stored":true}' from k where ${done}
    ),
    listed as (
      insert into idempotency_processing (stale_at, tenant, key, locked_at, lease)
      select ${lockedAt}::timestamptz + make_interval(secs => coalesce((select ttl_seconds from idempotency_settings), 30)), k.tenant, k.key, ${lockedAt}, k.lease
        from k where not ${done}
    )
    select lease::text from k`
}

/** Puts a key directly in any state, as a crashed or finished worker would have left it. */
export async function createKey(sql: postgres.Sql, id: RequestIdentity, state: KeyState): Promise<{ lease: string }> {
  const [row] = await insertKeys(sql, sql`(select ${id.tenant}::text as tenant, ${id.key}::text as key, ${id.method}::text as method,
    ${id.path}::text as path, ${id.fingerprint}::text as fingerprint)`, state)
  return row!
}

export interface ManyKeys extends KeyState {
  /** Keys are `${prefix}1` to `${prefix}${count}`. */
  prefix: string
  /** @default 'acme' */
  tenant?: string
  /** @default a fingerprint of the prefix (all keys are then the same request) */
  fingerprint?: string
}

/** `count` keys in one state, in one statement: for tables that must look busy. */
export async function createKeys(sql: postgres.Sql, count: number, state: ManyKeys): Promise<void> {
  await insertKeys(sql, sql`(select ${state.tenant ?? 'acme'}::text as tenant, ${state.prefix} || i as key, 'POST' as method,
    '/api/payments' as path, ${state.fingerprint ?? fingerprintOf(state.prefix)}::text as fingerprint from generate_series(1, ${count}) i)`, state)
}

export const secondsAfter = (date: Date, seconds: number) => new Date(date.getTime() + seconds * 1000)
export const secondsBefore = (date: Date, seconds: number) => secondsAfter(date, -seconds)

/**
 * Deletes every key (or those of `keyPrefix`) in either form: its row, its
 * processing entry and its answer. In the old form a trigger deletes a
 * processing key's entry with its row; a key of the new form keeps its entry
 * and answer apart (sql/engine/00020), and only the engine's statements
 * delete them together.
 */
export async function deleteKeys(sql: postgres.Sql, keyPrefix?: string): Promise<void> {
  const like = `${(keyPrefix ?? '').replace(/[\\%_]/g, (c) => `\\${c}`)}%`
  await sql.begin(async (tx) => {
    await tx`delete from idempotency_answers a using idempotency_keys k
              where k.digest is not null and a.tenant = k.tenant and a.request_id = k.request_id and k.key like ${like}`
    await tx`delete from idempotency_processing where key like ${like}`
    await tx`delete from idempotency_keys where key like ${like}`
  })
}

/**
 * Moves key `key` (of any tenant) `seconds` into the past, as if it had been
 * claimed and completed that much earlier: its row's times, and in the new
 * form (sql/engine/00020) its answer's completion time.
 */
export async function backdateKey(sql: postgres.Sql, key: string, seconds: number): Promise<void> {
  await sql.begin(async (tx) => {
    await tx`update idempotency_answers a set completed_at = a.completed_at - make_interval(secs => ${seconds})
               from idempotency_keys k where k.key = ${key} and k.digest is not null and a.tenant = k.tenant and a.request_id = k.request_id`
    await tx`update idempotency_keys set created_at = created_at - make_interval(secs => ${seconds}),
               completed_at = completed_at - make_interval(secs => ${seconds}) where key = ${key}`
  })
}
