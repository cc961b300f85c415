/** The filters of the key list and its counts, as every caller (page, JSON API, CLI) states them. */
import type { Fragment } from '../core/policy'
import type { Sql } from '../core/types'
import { OperationInputError } from './context'

export interface KeyFilters {
  readonly tenant?: string | undefined
  /** As typed: "POST /api/payments" or just "/api/payments". */
  readonly route?: string | undefined
  readonly method?: string | undefined
  readonly path?: string | undefined
  /** Part of the key: a key copied from a log, whole or in part. */
  readonly key?: string | undefined
  readonly staleOnly: boolean
}

/** What callers pass: strings as typed (blank means no filter). */
export interface RawKeyFilters {
  readonly tenant?: string | undefined
  readonly route?: string | undefined
  readonly key?: string | undefined
  readonly stale?: boolean | string | undefined
}

const ROUTE = /^(?:([A-Za-z]{1,16})\s+)?(\/\S{0,2047})$/
const CONTROL = /[\u0000-\u001f\u007f]/

/** Validates and normalises filters; throws OperationInputError naming the bad one. */
export function parseKeyFilters(raw: RawKeyFilters): KeyFilters {
  const tenant = raw.tenant?.trim() || undefined
  if (tenant !== undefined && (tenant.length > 64 || CONTROL.test(tenant))) throw new OperationInputError('tenant must be 1 to 64 printable characters')
  const key = raw.key?.trim() || undefined
  if (key !== undefined && (key.length > 255 || CONTROL.test(key))) throw new OperationInputError('key must be 1 to 255 printable characters')
  const route = raw.route?.trim() || undefined
  let method: string | undefined
  let path: string | undefined
  if (route !== undefined) {
    const match = ROUTE.exec(route)
    if (!match) throw new OperationInputError('route must look like "POST /api/payments" or "/api/payments"')
    method = match[1]?.toUpperCase()
    path = match[2]
  }
  const stale = raw.stale
  const staleOnly = stale === true || stale === '1' || stale === 'true' || stale === 'on'
  return { tenant, route, method, path, key, staleOnly }
}

/** The filters as a query string (without "?"), in one order: links, auto-refresh and cursors agree on it. */
export function filtersQuery(filters: KeyFilters): URLSearchParams {
  const params = new URLSearchParams()
  if (filters.tenant) params.set('tenant', filters.tenant)
  if (filters.route) params.set('route', filters.route)
  if (filters.key) params.set('key', filters.key)
  if (filters.staleOnly) params.set('stale', '1')
  return params
}

export const hasFilters = (filters: KeyFilters): boolean => Boolean(filters.tenant || filters.route || filters.key || filters.staleOnly)

/**
 * `and ...` conditions on key row `k` for tenant, route and key; the stale
 * filter is the caller's (a list filters by it, the counts count by it).
 * The key search is a substring (strpos, so `%` and `_` in keys are plain
 * characters); over processing keys it reads only their partial index's rows.
 */
export function filterConditions(sql: Sql, filters: KeyFilters): Fragment {
  return sql`
    ${filters.tenant ? sql`and k.tenant = ${filters.tenant}` : sql``}
    ${filters.method ? sql`and k.method = ${filters.method}` : sql``}
    ${filters.path ? sql`and k.path = ${filters.path}` : sql``}
    ${filters.key ? sql`and strpos(k.key, ${filters.key}) > 0` : sql``}` as Fragment
}
