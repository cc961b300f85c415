/**
 * /admin/api/...: the admin as JSON, for scripts. Authenticated by
 * `Authorization: Bearer <operator token>` only (never by the browser's
 * cookie), so a foreign page cannot make a browser call it: no CSRF exposure.
 * Wrong tokens are throttled per address like the sign-in form's (auth.ts).
 * The audit actor is the operator the token names (`api:alice`); an
 * X-Admin-Actor header only adds a note (`api:alice (deploy-bot)`). Each
 * route validates its input (schemas.ts), calls one operation and prints its
 * result with src/operations/json.ts, the same JSON the CLI prints.
 */
import type { TenantHeld } from '../http/tenant-refusals'
import { Elysia } from 'elysia'
import { problemResponse } from '../http/problem'
import { ADMIN_PROBLEMS } from './problems'
import type { Operations } from '../operations'
import { parseAuditFilters } from '../operations/audit'
import { parseKeyFilters } from '../operations/filters'
import { auditJson, auditPageJson, countsJson, expireStaleJson, forceExpireJson, keyDetailJson, keyPageJson, purgeJson, releasedPageJson } from '../operations/json'
import { parseReleaseReason } from '../operations/released'
import { requestLogger } from '../http/request-id'
import type { Logger } from '../log'
import type { Sql } from '../core/types'
import type { AdminAuth } from './auth'
import { ApiUnauthorizedError, NotFoundError, ThrottledError } from './errors'
import { ApiCountsQuery, ApiExpireBody, ApiExpireStaleBody, ApiKeysQuery, AuditEntryParams, AuditQuery, KeyParams, KeyQuery, ReleasedQuery } from './schemas'
import { actorOf, validNote } from './session'

export interface AdminDeps {
  readonly ops: Operations
  readonly auth: AdminAuth
  /** The sessions' table (sessions.ts). */
  readonly sql: Sql
  /** Tests move the clock with this. @default the database's now() */
  readonly now: () => Date | undefined
  readonly log: Logger
  /** This API's OpenAPI document (api-docs.ts), when the service describes it. */
  readonly openApiDocument?: () => unknown
  /** Tenants this process refused at their limits within the last minute (http/tenant-refusals.ts). @default none known */
  readonly tenantsHeld?: () => readonly TenantHeld[]
}

/** The operations for one request: its action lines carry the request's id. */
export function actingOps(deps: AdminDeps, request: Request) {
  return deps.ops.withLog(requestLogger(request, { route: new URL(request.url).pathname.startsWith('/admin/api') ? '/admin/api' : '/admin' }, deps.log))
}

/** Scripts may add a note to their operator name for the audit trail (X-Admin-Actor), checked like the sign-in form's. */
function noteOf(request: Request): string | undefined {
  const note = request.headers.get('x-admin-actor')?.trim()
  return note && validNote(note) ? note : undefined
}

const limitOf = (raw: string | undefined): number | undefined => (raw === undefined ? undefined : Number(raw))

export function adminApi(deps: AdminDeps) {
  const { ops, auth, openApiDocument } = deps
  const detail = async (tenant: string, key: string) => {
    const found = await ops.show(tenant, key)
    if (!found) throw new NotFoundError('No key with this tenant and key.')
    return keyDetailJson(found)
  }
  return new Elysia({ prefix: '/admin/api' })
    // Before validation and the handler: without the token nothing else is looked at.
    .derive(({ request }) => {
      const verdict = auth.bearer(request)
      if (verdict.kind === 'throttled') throw new ThrottledError(verdict.retryAfterSeconds)
      if (verdict.kind !== 'ok') throw new ApiUnauthorizedError()
      return { actor: actorOf('api', verdict.operator, noteOf(request)) }
    })
    .get('/keys', async ({ query }) =>
      keyPageJson(await ops.list(parseKeyFilters(query), { cursor: query.cursor || undefined, limit: limitOf(query.limit) })), { query: ApiKeysQuery })
    .get('/counts', async ({ query }) =>
      countsJson(await ops.count(parseKeyFilters(query), { withDone: true }), ops), { query: ApiCountsQuery })
    .get('/keys/:tenant/:key', ({ params }) => detail(params.tenant, params.key), { params: KeyParams })
    // Keys a path segment cannot carry ("." and "..") are asked for by query.
    .get('/key', ({ query }) => detail(query.tenant, query.key), { query: KeyQuery })
    .get('/audit', async ({ query }) =>
      auditPageJson(await ops.audit({ ...parseAuditFilters(query), limit: limitOf(query.limit) })), { query: AuditQuery })
    .get('/audit/:id', async ({ params }) => {
      const entry = await ops.auditEntry(params.id)
      if (!entry) throw new NotFoundError('No audit entry with this id.')
      return auditJson(entry)
    }, { params: AuditEntryParams })
    .post('/keys/expire', async ({ body, actor, request }) => {
      const lease = String(body.lease)
      const result = await actingOps(deps, request).forceExpire({ tenant: body.tenant, key: body.key, lease }, actor)
      const json = forceExpireJson(result, lease)
      if (result.outcome === 'worker_alive') return problemResponse(ADMIN_PROBLEMS.problem('worker-alive', undefined, json))
      if (result.outcome === 'unchanged') return problemResponse(ADMIN_PROBLEMS.problem('key-changed', undefined, json))
      return json
    }, { body: ApiExpireBody })
    .post('/keys/expire-stale', async ({ body, actor, request }) => {
      const asOf = body.as_of === undefined ? undefined : new Date(body.as_of)
      return expireStaleJson(await actingOps(deps, request).expireStale({ asOf, tenant: body.tenant?.trim() || undefined }, actor))
    }, { body: ApiExpireStaleBody })
    .post('/purge', async ({ actor, request }) => purgeJson(await actingOps(deps, request).purge(actor)))
    // Keys released after their deadline (the provider may have charged), or for another reason.
    .get('/released', async ({ query }) => {
      const reason = parseReleaseReason(query.reason)
      const tenant = query.tenant?.trim() || undefined
      const [page, counts] = await Promise.all([
        ops.listReleased({ reason, tenant }, { cursor: query.cursor || undefined, limit: limitOf(query.limit) }),
        ops.countReleased(tenant),
      ])
      return releasedPageJson(page, counts)
    }, { query: ReleasedQuery })
    .get('/openapi.json', () => {
      if (!openApiDocument) throw new NotFoundError('This server does not describe its admin API.')
      return Response.json(openApiDocument())
    }, { detail: { hide: true } })
}
