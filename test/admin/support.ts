/** Talking to /admin like a browser (form posts, session cookie) and like a script (Bearer); an in-process admin on a real socket. */
import { Elysia } from 'elysia'
import type postgres from 'postgres'
import { adminRoutes, type AdminOptions } from '../../src/admin/routes'
import { clientMeta, rememberMeta } from '../../src/http/client'
import type { Pools } from '../../src/store/db'
import { ADMIN_TOKEN } from '../support/server'

export interface Signed {
  readonly cookie: string
  readonly csrf: string
}

const FORM = 'application/x-www-form-urlencoded'

export interface AdminServer {
  readonly url: string
  stop(): Promise<void>
}

/**
 * The admin alone, mounted as the service mounts it (adminRoutes), served by
 * Bun on a free port of this process: real HTTP (sockets, cookies, redirects,
 * Content-Length) without spawning a service. Bun's body cap is the service's
 * (1 GiB), so an oversize body reaches the admin as it would in production.
 * The client address is found as the service finds it (http/client.ts), with
 * `trustProxy` as TRUST_PROXY.
 */
export function startAdmin(pools: Pools, options: Partial<AdminOptions> & { trustProxy?: number } = {}): AdminServer {
  const { trustProxy = 0, ...admin } = options
  const app = new Elysia().use(adminRoutes({ pools, adminToken: ADMIN_TOKEN, ttlSeconds: 30, retentionSeconds: 3600, ...admin }))
  const server = Bun.serve({
    hostname: '127.0.0.1',
    port: 0,
    maxRequestBodySize: 1024 * 1024 * 1024,
    fetch: (request, server) => {
      rememberMeta(request, clientMeta(request, server.requestIP(request)?.address, trustProxy))
      return app.handle(request)
    },
  })
  return { url: `http://127.0.0.1:${server.port}`, stop: () => server.stop(true) }
}

/** Signs in through the form (with `token`, ADMIN_TOKEN's by default) and reads this session's CSRF token from a page. */
export async function signIn(baseUrl: string, note = '', token = ADMIN_TOKEN, headers: Record<string, string> = {}): Promise<Signed> {
  const response = await fetch(`${baseUrl}/admin/login`, {
    method: 'POST',
    headers: { 'content-type': FORM, origin: baseUrl, ...headers },
    body: new URLSearchParams({ token, note }).toString(),
    redirect: 'manual',
  })
  if (response.status !== 303) throw new Error(`sign-in answered ${response.status}`)
  const cookie = response.headers.get('set-cookie')!.split(';')[0]!
  const page = await (await fetch(`${baseUrl}/admin`, { headers: { cookie, ...headers } })).text()
  const csrf = /name="csrf" value="([^"]+)"/.exec(page)?.[1]
  if (!csrf) throw new Error('no CSRF token on the page')
  return { cookie, csrf }
}

/** Posts an admin form; `origin` undefined sends our own origin, null sends none. */
export function postForm(baseUrl: string, path: string, fields: Record<string, string>, options: { cookie?: string; origin?: string | null; headers?: Record<string, string> } = {}): Promise<Response> {
  const headers: Record<string, string> = { 'content-type': FORM, ...options.headers }
  if (options.cookie) headers.cookie = options.cookie
  if (options.origin !== null) headers.origin = options.origin ?? baseUrl
  return fetch(`${baseUrl}${path}`, { method: 'POST', headers, body: new URLSearchParams(fields).toString(), redirect: 'manual' })
}

export function api(baseUrl: string, path: string, init: { method?: string; body?: unknown; token?: string | null; headers?: Record<string, string> } = {}): Promise<Response> {
  const headers: Record<string, string> = { ...init.headers }
  const token = init.token === undefined ? ADMIN_TOKEN : init.token
  if (token !== null) headers.authorization = `Bearer ${token}`
  if (init.body !== undefined) headers['content-type'] = 'application/json'
  return fetch(`${baseUrl}${path}`, { method: init.method ?? 'GET', headers, ...(init.body !== undefined ? { body: JSON.stringify(init.body) } : {}) })
}

/** GETs an admin page with a session; the body as text. */
export async function getPage(baseUrl: string, path: string, signed: Signed): Promise<{ response: Response; html: string }> {
  const response = await fetch(`${baseUrl}${path}`, { headers: { cookie: signed.cookie }, redirect: 'manual' })
  return { response, html: await response.text() }
}

/** Inserts a processing key as a dead worker leaves it: no owner, locked `ageSeconds` ago. */
export async function stuckKey(sql: postgres.Sql, tenant: string, key: string, ageSeconds = 3600, path = '/api/payments', fingerprint = 'a'.repeat(64)): Promise<string> {
  const [row] = await sql<{ lease: string }[]>`
    insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at)
    values (${tenant}, ${key}, 'POST', ${path}, ${fingerprint}, 'processing',
            now() - make_interval(secs => ${ageSeconds}), now() - make_interval(secs => ${ageSeconds}))
    returning lease`
  return row!.lease
}

/** Whether the key is still claimed (in processing): an expired one is released, and its retry runs. */
export async function keyInProcessing(sql: postgres.Sql, tenant: string, key: string): Promise<boolean> {
  const [row] = await sql<{ n: number }[]>`select count(*)::int as n from idempotency_key_states where tenant = ${tenant} and key = ${key} and status = 'processing'`
  return row!.n === 1
}

/** The text of HTML as a browser decodes it (the entities our escaping writes). */
export function decode(text: string): string {
  return text.replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&quot;|&#34;/g, '"').replace(/&#39;|&#x27;/g, "'").replace(/&amp;/g, '&')
}
