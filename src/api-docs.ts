/**
 * The service's OpenAPI 3.1 documents: the public API at GET /openapi.json
 * (browsable at /docs), and the admin JSON API's at
 * GET /admin/api/openapi.json, behind the admin's own credentials (an API
 * client has no use for it, and it need not tell the world what an operator
 * can do).
 *
 * Every operation comes from its route's `detail`, built from the schemas
 * and the problem catalogues the route checks and answers with
 * (payments/schema.ts, http/problem.ts, http/operation.ts), read by Elysia's
 * own generator (`toOpenAPISchema`): the documents cannot drift from the
 * code. Here they get what a generated client needs on top: named component
 * schemas (Payment, NewPayment, PaymentPage, Problem) instead of anonymous
 * copies, and operationIds that are identifiers. test/http/openapi.test.ts
 * validates both and checks real answers against them.
 */
import { toOpenAPISchema } from '@elysiajs/openapi'
import { Elysia, type AnyElysia } from 'elysia'
import pkg from '../package.json' with { type: 'json' }
import { ADMIN_PROBLEMS } from './admin/problems'
import { detail, duration, problemAnswer, problemAnswers, type ResponseDoc } from './http/operation'
import { PLUGIN_PROBLEMS, ProblemDetails } from './http/problem'
import { NewPayment, Payment, PaymentPage } from './payments/schema'

/** The project's licence (LICENSE), in both documents: generated clients and API catalogues read it from there. */
const LICENSE = { name: 'MIT', identifier: 'MIT' } as const

export { detail, problemAnswer, problemAnswers }

export const OPENAPI_PATH = '/openapi.json'
export const DOCS_PATH = '/docs'
/** Inside the admin JSON API, so it is answered only with its credentials. */
export const ADMIN_OPENAPI_PATH = '/admin/api/openapi.json'
export const DOCS_ROUTES = [OPENAPI_PATH, DOCS_PATH] as const

type Document = Record<string, any>

/** What the document publishes of the running configuration. */
export interface DocsOptions {
  readonly ttlSeconds: number
  readonly retentionSeconds: number
}

const description = ({ ttlSeconds, retentionSeconds }: DocsOptions) => `Payments, created once per \`Idempotency-Key\` however often a client retries.

Every request to \`/api\` carries \`Authorization: Bearer <api key>\`; the key decides the tenant, and
idempotency keys are scoped by tenant. Every error answer is RFC 9457 \`application/problem+json\`
with a stable \`code\` (its \`type\` is \`urn:idempotent-post:problem:<code>\`); the codes are listed in docs/reference/http-api.md.

**Key expiry:** this server keeps a finished request's answer, and replays it to a retry under the same key,
for ${duration(retentionSeconds)}; after that the key is forgotten and a request under it is new. A request
still processing after ${duration(ttlSeconds)} may be taken over by a retry. Both are in \`x-idempotency\`
(here and on each Idempotency-Key parameter).`

/** `{ status }` of /healthz and /readyz. */
export function health(status: string): ResponseDoc {
  return {
    description: `\`{"status": "${status}"}\``,
    content: { 'application/json': { schema: { type: 'object', properties: { status: { const: status } }, required: ['status'] } } },
  }
}

/** Schemas every client should know by name: the answers and bodies of the payments API, and any problem. */
const COMPONENTS: Readonly<Record<string, object>> = { NewPayment, Payment, PaymentPage, Problem: ProblemDetails }

/**
 * `value` with every copy of a named schema replaced by a `$ref` to its
 * component. A copy is recognised by its `title` and its content (Elysia's
 * generator and TypeBox may clone a schema, so identity cannot be relied
 * on); a different schema that happens to carry the title is left as it is.
 */
function referenced(value: unknown, components: Readonly<Record<string, object>>, self?: string): unknown {
  if (Array.isArray(value)) return value.map((item) => referenced(item, components))
  if (value === null || typeof value !== 'object') return value
  const title = (value as { title?: unknown }).title
  if (typeof title === 'string' && title !== self && Object.hasOwn(components, title) && JSON.stringify(value) === JSON.stringify(components[title]))
    return { $ref: `#/components/schemas/${title}` }
  return Object.fromEntries(Object.entries(value).map(([key, item]) => [key, referenced(item, components)]))
}

/** `getAdminApiKeysExpire-stale` → `getAdminApiKeysExpireStale`: an identifier in every client language. */
const identifier = (operationId: string): string => operationId.replace(/[^A-Za-z0-9]+([A-Za-z0-9])/g, (_, next: string) => next.toUpperCase()).replace(/[^A-Za-z0-9]/g, '')

/** The paths of a generated document, with components referenced and operationIds made identifiers. */
function finish(paths: Record<string, Record<string, Document>>, components: Readonly<Record<string, object>>): Record<string, unknown> {
  const finished: Record<string, Record<string, Document>> = {}
  for (const [path, item] of Object.entries(paths)) {
    finished[path] = {}
    for (const [method, operation] of Object.entries(item)) {
      const done = referenced(operation, components) as Document
      if (typeof done.operationId === 'string') done.operationId = identifier(done.operationId)
      finished[path][method] = done
    }
  }
  return finished
}

const schemas = (components: Readonly<Record<string, object>>) =>
  Object.fromEntries(Object.entries(components).map(([name, schema]) => [name, referenced(schema, components, name)]))

/**
 * The public document: every route of the app the plugin is mounted in
 * (`app`: its instance, whose global routes are the app's), less the admin
 * (its own document), the docs themselves and the bench-only route.
 */
export function publicDocument(app: AnyElysia, options: DocsOptions): Document {
  const { paths } = toOpenAPISchema(app, { paths: [/^\/admin(\/|$)/, /^\/bench\//] }) as unknown as { paths: Record<string, Record<string, Document>> }
  return {
    openapi: '3.1.1',
    info: { title: 'idempotent-post: payments API', version: pkg.version, description: description(options), license: LICENSE },
    'x-idempotency': { retentionSeconds: options.retentionSeconds, ttlSeconds: options.ttlSeconds, scope: 'tenant' },
    tags: [
      { name: 'payments', description: 'The reference service built on the idempotency plugin.' },
      { name: 'operations', description: 'Health and metrics, for orchestrators and Prometheus.' },
    ],
    // Relative: the origin the document was fetched from (generated clients need a base URL; one fixed here would be wrong behind any proxy).
    servers: [{ url: '/', description: 'This service: the origin that served this document' }],
    security: [{ apiKey: [] }],
    paths: finish(paths, COMPONENTS),
    components: {
      schemas: schemas(COMPONENTS),
      securitySchemes: {
        apiKey: { type: 'http', scheme: 'bearer', description: 'An API key from API_KEYS (`demo-key` in development); it decides the tenant.' },
      },
    },
  }
}

const ADMIN_API = '/admin/api/'
/** The admin's operations by name: what a script calls them, not what the path generator spells. */
const ADMIN_OPERATIONS: Readonly<Record<string, { operationId: string; summary: string }>> = {
  'get /admin/api/keys': { operationId: 'listProcessingKeys', summary: 'Keys in processing, stale first (filters: tenant, route, key, stale)' },
  'get /admin/api/counts': { operationId: 'countKeys', summary: 'How many keys are processing, stale, expired and done' },
  'get /admin/api/keys/{tenant}/{key}': { operationId: 'getKey', summary: 'One key, whatever its status' },
  'get /admin/api/key': { operationId: 'getKeyByQuery', summary: 'One key, addressed by query (for keys a path segment cannot carry)' },
  'get /admin/api/audit': { operationId: 'listAuditEntries', summary: 'The audit trail of operator actions, newest first' },
  'get /admin/api/audit/{id}': { operationId: 'getAuditEntry', summary: 'One audit entry' },
  'post /admin/api/keys/expire': { operationId: 'forceExpireKey', summary: 'Force-expire one processing key, under the lease you saw' },
  'post /admin/api/keys/expire-stale': { operationId: 'expireStaleKeys', summary: 'Force-expire every stale processing key' },
  'post /admin/api/purge': { operationId: 'purgeExpiredKeys', summary: 'Delete completed and released keys past their retention' },
  'get /admin/api/released': { operationId: 'listReleasedKeys', summary: 'Keys released for one reason (default: after their deadline, the provider may have charged), with their downstream keys' },
}

const adminAnswer = problemAnswers(PLUGIN_PROBLEMS.with(ADMIN_PROBLEMS))

/**
 * The admin JSON API's operations, generated by Elysia's own generator from
 * the admin app's routes and their TypeBox schemas (the admin is an app of
 * its own, which the service hands /admin requests to, so the service's
 * routes do not include its routes). Its answers are added here: any JSON
 * object on success, and the problems the admin answers with.
 */
export function adminApiPaths(admin: AnyElysia): Record<string, Record<string, Document>> {
  const { paths } = toOpenAPISchema(admin) as unknown as { paths: Record<string, Record<string, Document>> }
  // The admin reads bodies with a parser of its own (a byte-bounded reader), so the generator
  // cannot tell their media type: the body schemas are taken from the routes, as JSON.
  const bodies = new Map(admin.routes.filter((route) => route.hooks?.body).map((route) =>
    [`${route.method.toLowerCase()} ${route.path.replace(/:([^/]+)/g, '{$1}')}`, route.hooks.body as unknown]))
  const documented: Record<string, Record<string, Document>> = {}
  for (const [path, item] of Object.entries(paths)) {
    if (!path.startsWith(ADMIN_API)) continue
    documented[path] = {}
    for (const [method, operation] of Object.entries(item)) {
      const post = method === 'post'
      const parameters: unknown[] = operation.parameters ?? []
      const responses: Record<string, ResponseDoc> = {
        200: { description: 'The result, as JSON (the same JSON `npm run idem` prints).', content: { 'application/json': { schema: { type: 'object' } } } },
        ...(parameters.length || post ? { 400: adminAnswer(['invalid-query', 'invalid-json'], 'A parameter or the body is malformed.') } : {}),
        401: adminAnswer(['unauthorized'], 'No or wrong ADMIN_TOKEN.'),
        ...(path.includes('{') || path.endsWith('/key') ? { 404: adminAnswer(['not-found']) } : {}),
        ...(path.endsWith('/keys/expire') ? { 409: adminAnswer(['worker-alive', 'key-changed'], 'Nothing was done: a live worker holds the key, or it moved on; the body has the `outcome` and the `audit_id`.') } : {}),
        ...(post ? { 413: adminAnswer(['body-too-large']), 415: adminAnswer(['unsupported-media-type']) } : {}),
        500: adminAnswer(['internal']),
        503: adminAnswer(['database-unavailable']),
      }
      const body = bodies.get(`${method} ${path}`)
      const { requestBody: _generated, ...generated } = operation
      documented[path][method] = {
        ...generated,
        ...ADMIN_OPERATIONS[`${method} ${path}`],
        tags: ['admin'],
        security: [{ adminToken: [] }],
        ...(body ? { requestBody: { required: true, content: { 'application/json': { schema: body } } } } : {}),
        responses,
      }
    }
  }
  return documented
}

/** The admin JSON API's document, served behind its credentials. */
export function adminDocument(admin: AnyElysia): Document {
  const components = { Problem: ProblemDetails }
  return {
    openapi: '3.1.1',
    info: {
      title: 'idempotent-post: admin API',
      version: pkg.version,
      license: LICENSE,
      description: 'What operators can do, as JSON for scripts: the same operations as the /admin page and `npm run idem`, recorded in the same audit trail. Every call carries `Authorization: Bearer <ADMIN_TOKEN>`.',
    },
    tags: [{ name: 'admin', description: 'Processing keys, force-expiring, purging and the audit trail.' }],
    servers: [{ url: '/', description: 'This service: the origin that served this document' }],
    security: [{ adminToken: [] }],
    paths: finish(adminApiPaths(admin), components),
    components: {
      schemas: schemas(components),
      securitySchemes: { adminToken: { type: 'http', scheme: 'bearer', description: 'ADMIN_TOKEN, printed at start when unset.' } },
    },
  }
}

/** Made once, on first use: every route is added by then. */
function once<T>(make: () => T): () => T {
  let made: { value: T } | undefined
  return () => (made ??= { value: make() }).value
}

/** GET /openapi.json, the public document; /docs (the page that browses it) is served from an installed package (docs-ui.ts). */
export function apiDocs(options: DocsOptions) {
  const plugin = new Elysia({ name: 'api-docs' })
  // The plugin's global routes are those of the app it is mounted in.
  const document = once(() => publicDocument(plugin, options))
  return plugin.get(OPENAPI_PATH, () => Response.json(document()), { detail: { hide: true } })
}
