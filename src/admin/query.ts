/** Reading the admin page's query parameters and cursors: all of it is untrusted input. */
import type { ProcessingCursor } from '../core/list-processing'

export interface Filters {
  readonly tenant?: string | undefined
  /** As typed: "POST /api/payments" or just "/api/payments". */
  readonly route?: string | undefined
  readonly method?: string | undefined
  readonly path?: string | undefined
  readonly staleOnly: boolean
}

export type Parsed<T> = { ok: true; value: T } | { ok: false; error: string }

const TIMESTAMP = /^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{1,6})?[+-]\d{2}(:\d{2})?$/

export function parseFilters(query: URLSearchParams): Parsed<Filters> {
  const tenant = query.get('tenant')?.trim() || undefined
  if (tenant !== undefined && (tenant.length > 64 || /[\u0000-\u001f]/.test(tenant))) return { ok: false, error: 'tenant must be 1 to 64 printable characters' }
  const route = query.get('route')?.trim() || undefined
  let method: string | undefined
  let path: string | undefined
  if (route !== undefined) {
    const match = /^(?:([A-Za-z]{1,16})\s+)?(\/\S{0,2047})$/.exec(route)
    if (!match) return { ok: false, error: 'route must look like "POST /api/payments" or "/api/payments"' }
    method = match[1]?.toUpperCase()
    path = match[2]
  }
  const stale = query.get('stale')
  return { ok: true, value: { tenant, route, method, path, staleOnly: stale === '1' || stale === 'true' || stale === 'on' } }
}

/** A cursor is opaque to clients: base64url of [locked_at, tenant, key]. */
export function encodeCursor(cursor: ProcessingCursor): string {
  return Buffer.from(JSON.stringify([cursor.lockedAt, cursor.tenant, cursor.key])).toString('base64url')
}

export function decodeCursor(text: string): ProcessingCursor | undefined {
  if (text.length > 1024) return undefined
  try {
    const value: unknown = JSON.parse(Buffer.from(text, 'base64url').toString())
    if (!Array.isArray(value) || value.length !== 3 || !value.every((part) => typeof part === 'string')) return undefined
    const [lockedAt, tenant, key] = value as [string, string, string]
    if (!TIMESTAMP.test(lockedAt) || tenant.length < 1 || tenant.length > 64 || key.length < 1 || key.length > 255) return undefined
    if (/\u0000/.test(tenant + key)) return undefined
    return { lockedAt, tenant, key }
  } catch {
    return undefined
  }
}

/** A lease is a positive bigint in decimal. */
export function validLease(text: string | null | undefined): text is string {
  return typeof text === 'string' && /^[1-9]\d{0,18}$/.test(text)
}

/** Limits for the JSON API: 50 by default, MAX_PAGE_SIZE at most. */
export function parseLimit(raw: string | null, fallback: number, max: number): number | undefined {
  if (raw === null) return fallback
  if (!/^\d{1,4}$/.test(raw)) return undefined
  const limit = Number(raw)
  return limit >= 1 && limit <= max ? limit : undefined
}
