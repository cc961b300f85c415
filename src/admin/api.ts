/**
 * /admin/api/...: the admin as JSON, for scripts. Authenticated by
 * `Authorization: Bearer <ADMIN_TOKEN>` only (never by the browser's cookie),
 * so a foreign page cannot make a browser call it: no CSRF exposure. Each
 * route validates its input (schemas.ts), calls one operation and prints its
 * result with src/operations/json.ts, the same JSON the CLI prints.
 */
import { Elysia } from 'elysia'
import { problemResponse } from '../http/problem'
import type { Operations } from '../operations'
import { parseAuditFilters } from '../operations/audit'
import { parseKeyFilters } from '../operations/filters'
import { auditJson, auditPageJson, countsJson, expireStaleJson, forceExpireJson, keyDetailJson, keyPageJson, purgeJson } from '../operations/json'
import { ApiUnauthorizedError, NotFoundError } from './errors'
import { ADMIN_PROBLEMS } from './problems'
import { ApiCountsQuery, ApiExpireBody, ApiExpireStaleBody, ApiKeysQuery, AuditEntryParams, AuditQuery, KeyParams, KeyQuery } from './schemas'
import { validName, type SessionKeys } from './session'

export interface AdminDeps {
  readonly ops: Operations
  readonly keys: SessionKeys
  /** This API's OpenAPI document (api-docs.ts), when the service describes it. */
  readonly openApiDocument?: () => unknown
}

/** Scripts may name themselves for the audit trail (X-Admin-Actor); the name is checked like a sign-in name. */
function actorOf(request: Request): string {
  const name = request.headers.get('x-admin-actor')?.trim()
  return name && validName(name) ? `api:${name}` : 'api'
}

const limitOf = (raw: string | undefined): number | undefined => (raw === undefined ? undefined : Number(raw))

export function adminApi({ ops, keys, openApiDocument }: AdminDeps) {
  const detail = async (tenant: string, key: string) => {
    const found = await ops.show(tenant, key)
    if (!found) throw new NotFoundError('No key with this tenant and key.')
    return keyDetailJson(found)
  }
  return new Elysia({ prefix: '/admin/api' })
    // Before validation and the handler: without the token nothing else is looked at.
    .derive(({ request }) => {
      if (!keys.hasBearer(request)) throw new ApiUnauthorizedError()
      return { actor: actorOf(request) }
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
    .post('/keys/expire', async ({ body, actor }) => {
      const lease = String(body.lease)
      const result = await ops.forceExpire({ tenant: body.tenant, key: body.key, lease }, actor)
      const json = forceExpireJson(result, lease)
      if (result.outcome === 'worker_alive') return problemResponse(ADMIN_PROBLEMS.problem('worker-alive', undefined, json))
      if (result.outcome === 'unchanged') return problemResponse(ADMIN_PROBLEMS.problem('key-changed', undefined, json))
      return json
    }, { body: ApiExpireBody })
    .post('/keys/expire-stale', async ({ body, actor }) => {
      const asOf = body.as_of === undefined ? undefined : new Date(body.as_of)
      return expireStaleJson(await ops.expireStale({ asOf, tenant: body.tenant?.trim() || undefined }, actor))
    }, { body: ApiExpireStaleBody })
    .post('/purge', async ({ actor }) => purgeJson(await ops.purge(actor)))
    .get('/openapi.json', () => {
      if (!openApiDocument) throw new NotFoundError('This server does not describe its admin API.')
      return Response.json(openApiDocument())
    }, { detail: { hide: true } })
}
