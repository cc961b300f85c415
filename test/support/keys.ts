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

/** Puts a key directly in any state, as a crashed or finished worker would have left it. */
export async function createKey(sql: postgres.Sql, id: RequestIdentity, state: KeyState): Promise<{ lease: string }> {
  const done = state.status === 'done'
  const completedAt = done ? (state.completedAt ?? new Date()) : null
  const lockedAt = state.lockedAt ?? completedAt ?? new Date()
  const [row] = await sql<{ lease: string }[]>`
    insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at,
                                  completed_at, response_status, response_headers, response_body)
    values (${id.tenant}, ${id.key}, ${id.method}, ${id.path}, ${id.fingerprint}, ${state.status}, ${lockedAt}, ${lockedAt},
            ${completedAt}, ${done ? 201 : null},
            ${done ? sql.json({ 'content-type': 'application/json' }) : null}, ${done ? '{"stored":true}' : null})
    returning lease`
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
  const done = state.status === 'done'
  const completedAt = done ? (state.completedAt ?? new Date()) : null
  const lockedAt = state.lockedAt ?? completedAt ?? new Date()
  await sql`
    insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at,
                                  completed_at, response_status, response_headers, response_body)
    select ${state.tenant ?? 'acme'}, ${state.prefix} || i, 'POST', '/api/payments', ${state.fingerprint ?? fingerprintOf(state.prefix)},
           ${state.status}, ${lockedAt}, ${lockedAt}, ${completedAt}, ${done ? 201 : null},
           ${done ? sql.json({ 'content-type': 'application/json' }) : null}, ${done ? '{"stored":true}' : null}
      from generate_series(1, ${count}) i`
}

export const secondsAfter = (date: Date, seconds: number) => new Date(date.getTime() + seconds * 1000)
export const secondsBefore = (date: Date, seconds: number) => secondsAfter(date, -seconds)
