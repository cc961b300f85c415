import { KEY_STATES } from './key-states'
import type { Lease, Sql, StoredResponse } from './types'

/**
 * Where a completion whose answer was lost left its key, read before it is
 * sent again (recovery.ts): `done` under our lease (it committed; here is the
 * answer it stored), `processing` under our lease (it did not: send it
 * again), or `lost` (the lease moved on: reclaimed, force-expired, purged).
 */
export type CompletionState = { readonly kind: 'done'; readonly response: StoredResponse } | { readonly kind: 'processing' } | { readonly kind: 'lost' }

export async function completionState(sql: Sql, lease: Pick<Lease, 'tenant' | 'key' | 'lease'>): Promise<CompletionState> {
  const [row] = await sql<{ status: string; lease: string; response_status: number | null; response_headers: Record<string, string> | null; response_body: string | null }[]>`
    select k.status, k.lease, k.response_status, k.response_headers, k.response_body from ${sql.unsafe(KEY_STATES)} k
     where k.tenant = ${lease.tenant} and k.key = ${lease.key}`
  if (!row || row.lease !== lease.lease) return { kind: 'lost' }
  if (row.status === 'processing') return { kind: 'processing' }
  if (row.status === 'done') return { kind: 'done', response: { status: row.response_status!, headers: row.response_headers ?? {}, body: row.response_body! } }
  return { kind: 'lost' }
}
