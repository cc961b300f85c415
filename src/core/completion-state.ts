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
    select status, lease, response_status, response_headers, response_body from idempotency_keys
     where tenant = ${lease.tenant} and key = ${lease.key}`
  if (!row || row.lease !== lease.lease) return { kind: 'lost' }
  if (row.status === 'processing') return { kind: 'processing' }
  if (row.status === 'done') return { kind: 'done', response: { status: row.response_status!, headers: row.response_headers ?? {}, body: row.response_body! } }
  return { kind: 'lost' }
}
