/**
 * The admin's URLs, built in one place. Keys are client-chosen: every part
 * goes through encodeURIComponent (or URLSearchParams), and every href is
 * escaped again where it is written into an attribute.
 */
import { filtersQuery, parseKeyFilters, type KeyFilters } from '../operations/filters'
import type { AuditFilters } from '../operations/audit'

/** "." and ".." are path segments a browser resolves away (even as %2e): such keys are addressed by query instead. */
const DOT_SEGMENT = /^\.{1,2}$/

const query = (params: URLSearchParams): string => {
  const text = params.toString()
  return text ? `?${text}` : ''
}

export function listHref(filters: KeyFilters, extra: Record<string, string | undefined> = {}): string {
  const params = filtersQuery(filters)
  for (const [name, value] of Object.entries(extra)) if (value) params.set(name, value)
  return `/admin${query(params)}`
}

/** The key's detail page: /admin/keys/{tenant}/{key}, or /admin/key?tenant=&key= for dot segments. */
export function keyHref(tenant: string, key: string, extra: Record<string, string | undefined> = {}): string {
  const params = new URLSearchParams()
  for (const [name, value] of Object.entries(extra)) if (value) params.set(name, value)
  if (DOT_SEGMENT.test(tenant) || DOT_SEGMENT.test(key)) {
    const all = new URLSearchParams({ tenant, key })
    for (const [name, value] of params) all.set(name, value)
    return `/admin/key${query(all)}`
  }
  return `/admin/keys/${encodeURIComponent(tenant)}/${encodeURIComponent(key)}${query(params)}`
}

/** The API twin of keyHref. */
export function apiKeyHref(tenant: string, key: string): string {
  if (DOT_SEGMENT.test(tenant) || DOT_SEGMENT.test(key)) return `/admin/api/key${query(new URLSearchParams({ tenant, key }))}`
  return `/admin/api/keys/${encodeURIComponent(tenant)}/${encodeURIComponent(key)}`
}

export function confirmExpireHref(tenant: string, key: string, lease: string, back: string | undefined): string {
  const params = new URLSearchParams({ tenant, key, lease })
  if (back) params.set('back', back)
  return `/admin/confirm/expire?${params}`
}

export function confirmExpireStaleHref(tenant: string | undefined): string {
  return `/admin/confirm/expire-stale${tenant ? `?${new URLSearchParams({ tenant })}` : ''}`
}

export const auditEntryHref = (id: string): string => `/admin/audit/${encodeURIComponent(id)}`

export function auditHref(filters: AuditFilters, before?: string): string {
  const params = new URLSearchParams()
  if (filters.actor) params.set('actor', filters.actor)
  if (filters.action) params.set('action', filters.action)
  if (filters.tenant) params.set('tenant', filters.tenant)
  if (filters.key) params.set('key', filters.key)
  if (before) params.set('before', before)
  return `/admin/audit${query(params)}`
}

/**
 * `back`: where the operator came from (the list's filters), carried through
 * detail and confirmation so the result lands on the same list. Only filter
 * fields survive, re-encoded: it can never point anywhere but /admin.
 */
export function backFilters(back: string | undefined): KeyFilters | undefined {
  if (!back) return undefined
  try {
    const params = new URLSearchParams(back)
    return parseKeyFilters({ tenant: params.get('tenant') ?? undefined, route: params.get('route') ?? undefined, key: params.get('key') ?? undefined, stale: params.get('stale') ?? undefined })
  } catch {
    return undefined
  }
}

export const backOf = (filters: KeyFilters): string | undefined => filtersQuery(filters).toString() || undefined
