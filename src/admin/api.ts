/**
 * /admin/api/...: the admin as JSON, for scripts. Authenticated by
 * `Authorization: Bearer <ADMIN_TOKEN>` only (never by the browser's cookie),
 * so a foreign page cannot make a browser call it: no CSRF exposure.
 */
import { listAudit } from '../core/audit'
import { countKeys } from '../core/counts'
import { listProcessing, MAX_PAGE_SIZE, type ProcessingKey } from '../core/list-processing'
import { problemResponse, type Problem } from '../http/problem'
import { expireStaleAction, forceExpireAction, purgeAction } from './actions'
import type { PageContext } from './page'
import { decodeCursor, encodeCursor, parseFilters, parseLimit, validLease } from './query'
import { validName } from './session'

const MAX_JSON_BYTES = 8 * 1024

const badRequest = (detail: string): Response => problemResponse({ code: 'bad-request', status: 400, title: 'Bad request', detail })

function actorOf(request: Request): string {
  // Scripts may name themselves for the audit trail; the name is checked like a sign-in name.
  const name = request.headers.get('x-admin-actor')?.trim()
  return name && validName(name) ? `api:${name}` : 'api'
}

async function readJson(request: Request): Promise<Record<string, unknown> | undefined> {
  if (!/^application\/json\s*(;|$)/i.test(request.headers.get('content-type') ?? '')) return undefined
  const text = await request.text()
  if (text.length > MAX_JSON_BYTES) return undefined
  try {
    const value: unknown = text.trim() === '' ? {} : JSON.parse(text)
    return value !== null && typeof value === 'object' && !Array.isArray(value) ? (value as Record<string, unknown>) : undefined
  } catch {
    return undefined
  }
}

function keyJson(key: ProcessingKey) {
  return {
    tenant: key.tenant,
    key: key.key,
    method: key.method,
    path: key.path,
    lease: key.lease,
    attempts: key.attempts,
    created_at: key.createdAt.toISOString(),
    locked_at: key.lockedAt.toISOString(),
    age_seconds: Math.floor(key.ageSeconds),
    stale: key.stale,
  }
}

const EXPIRE_PROBLEMS: Record<string, Problem> = {
  worker_alive: { code: 'worker-alive', status: 409, title: 'Worker alive', detail: 'A live worker holds this key and is still processing it; nothing was done.' },
  unchanged: { code: 'key-changed', status: 409, title: 'Key changed', detail: 'The key is no longer in processing under this lease (completed, released or taken over); nothing was done.' },
}

export async function handleApi(context: PageContext, request: Request, url: URL, path: string): Promise<Response> {
  if (!context.keys.hasBearer(request))
    return problemResponse({ code: 'unauthorized', status: 401, title: 'Admin token required', detail: 'Send Authorization: Bearer <ADMIN_TOKEN>.' }, { 'www-authenticate': 'Bearer realm="admin"', 'cache-control': 'no-store' })
  const method = request.method.toUpperCase()
  const now = context.now?.()

  if (method === 'GET' && path === '/admin/api/keys') {
    const filters = parseFilters(url.searchParams)
    if (!filters.ok) return badRequest(filters.error)
    const limit = parseLimit(url.searchParams.get('limit'), 50, MAX_PAGE_SIZE)
    if (limit === undefined) return badRequest(`limit must be a whole number from 1 to ${MAX_PAGE_SIZE}`)
    const rawCursor = url.searchParams.get('cursor')
    const after = rawCursor ? decodeCursor(rawCursor) : undefined
    if (rawCursor && !after) return badRequest('cursor is not one this API gave out')
    const page = await listProcessing(context.sql, { ttlSeconds: context.ttlSeconds, tenant: filters.value.tenant, method: filters.value.method, path: filters.value.path, staleOnly: filters.value.staleOnly, after, limit, now })
    return Response.json({ data: page.keys.map(keyJson), next_cursor: page.next ? encodeCursor(page.next) : null })
  }
  if (method === 'GET' && path === '/admin/api/counts') {
    const counts = await countKeys(context.sql, { ttlSeconds: context.ttlSeconds, retentionSeconds: context.retentionSeconds, now, withDone: true })
    return Response.json({
      processing: counts.processing,
      stale: counts.stale,
      oldest_processing_age_seconds: counts.oldestProcessingAgeSeconds,
      done: counts.done,
      expired: counts.expired,
      ttl_seconds: context.ttlSeconds,
      retention_seconds: context.retentionSeconds,
    })
  }
  if (method === 'GET' && path === '/admin/api/audit') {
    const before = url.searchParams.get('before')
    if (before !== null && !/^\d{1,18}$/.test(before)) return badRequest('before must be an audit id')
    const limit = parseLimit(url.searchParams.get('limit'), 50, 500)
    if (limit === undefined) return badRequest('limit must be a whole number from 1 to 500')
    const entries = await listAudit(context.sql, { before: before ?? undefined, limit })
    return Response.json({
      data: entries.map((entry) => ({ ...entry, at: entry.at.toISOString() })),
      next_before: entries.length === limit ? entries.at(-1)!.id : null,
    })
  }
  if (method === 'POST' && path === '/admin/api/keys/expire') {
    const body = await readJson(request)
    const { tenant, key, lease } = body ?? {}
    if (typeof tenant !== 'string' || typeof key !== 'string' || !tenant || !key || tenant.length > 64 || key.length > 255 || !validLease(typeof lease === 'number' ? String(lease) : (lease as string)))
      return badRequest('send JSON {"tenant": ..., "key": ..., "lease": "<the lease you saw>"}')
    const result = await forceExpireAction(context, { tenant, key, lease: String(lease) }, actorOf(request))
    const problem = EXPIRE_PROBLEMS[result.outcome]
    if (problem) return problemResponse({ ...problem, outcome: result.outcome, audit_id: result.auditId })
    return Response.json({ outcome: result.outcome, audit_id: result.auditId })
  }
  if (method === 'POST' && path === '/admin/api/keys/expire-stale') {
    const body = await readJson(request)
    if (!body) return badRequest('send a JSON object: {"as_of"?: ISO time, "tenant"?: string}')
    const asOf = body.as_of === undefined ? undefined : new Date(String(body.as_of))
    if (asOf && Number.isNaN(asOf.getTime())) return badRequest('as_of must be an ISO 8601 time')
    const tenant = typeof body.tenant === 'string' && body.tenant ? body.tenant : undefined
    const result = await expireStaleAction(context, { asOf, tenant }, actorOf(request))
    return Response.json({
      expired: result.expired,
      worker_alive: result.workerAlive,
      expired_keys: result.expiredKeys,
      worker_alive_keys: result.aliveKeys,
      audit_id: result.auditId,
    })
  }
  if (method === 'POST' && path === '/admin/api/purge') {
    const result = await purgeAction(context, actorOf(request))
    return Response.json({ purged: result.purged, audit_id: result.auditId })
  }
  return problemResponse({ code: 'not-found', status: 404, title: 'Not found', detail: 'No such admin API endpoint.' })
}
