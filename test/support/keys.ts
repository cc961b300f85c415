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

export interface KeyState {
  status: 'processing' | 'done'
  /** When the current lease was taken; an old one makes the key stale. */
  lockedAt?: Date
  completedAt?: Date
}

/** Puts a key directly in any state, as a crashed or finished worker would have left it. */
export async function createKey(sql: postgres.Sql, id: RequestIdentity, state: KeyState): Promise<{ lease: string }> {
  const lockedAt = state.lockedAt ?? new Date()
  const done = state.status === 'done'
  const [row] = await sql<{ lease: string }[]>`
    insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at,
                                  completed_at, response_status, response_headers, response_body)
    values (${id.tenant}, ${id.key}, ${id.method}, ${id.path}, ${id.fingerprint}, ${state.status}, ${lockedAt}, ${lockedAt},
            ${done ? (state.completedAt ?? new Date()) : null}, ${done ? 201 : null},
            ${done ? sql.json({ 'content-type': 'application/json' }) : null}, ${done ? '{"stored":true}' : null})
    returning lease`
  return row!
}

export const secondsAfter = (date: Date, seconds: number) => new Date(date.getTime() + seconds * 1000)
