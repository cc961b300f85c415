/** Talking to /admin like a browser (form posts, session cookie) and like a script (Bearer). */
import type postgres from 'postgres'
import { ADMIN_TOKEN } from '../support/server'

export interface Signed {
  readonly cookie: string
  readonly csrf: string
}

const FORM = 'application/x-www-form-urlencoded'

/** Signs in through the form and reads this session's CSRF token from the page. */
export async function signIn(baseUrl: string, name = 'alice'): Promise<Signed> {
  const response = await fetch(`${baseUrl}/admin/login`, {
    method: 'POST',
    headers: { 'content-type': FORM, origin: baseUrl },
    body: new URLSearchParams({ token: ADMIN_TOKEN, name }).toString(),
    redirect: 'manual',
  })
  if (response.status !== 303) throw new Error(`sign-in answered ${response.status}`)
  const cookie = response.headers.get('set-cookie')!.split(';')[0]!
  const page = await (await fetch(`${baseUrl}/admin`, { headers: { cookie } })).text()
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

export function api(baseUrl: string, path: string, init: { method?: string; body?: unknown; token?: string | null } = {}): Promise<Response> {
  const headers: Record<string, string> = {}
  const token = init.token === undefined ? ADMIN_TOKEN : init.token
  if (token !== null) headers.authorization = `Bearer ${token}`
  if (init.body !== undefined) headers['content-type'] = 'application/json'
  return fetch(`${baseUrl}${path}`, { method: init.method ?? 'GET', headers, ...(init.body !== undefined ? { body: JSON.stringify(init.body) } : {}) })
}

/** Inserts a processing key as a dead worker leaves it: no lock held, locked `ageSeconds` ago. */
export async function stuckKey(sql: postgres.Sql, tenant: string, key: string, ageSeconds = 3600, path = '/api/payments'): Promise<string> {
  const [row] = await sql<{ lease: string }[]>`
    insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at)
    values (${tenant}, ${key}, 'POST', ${path}, ${'a'.repeat(64)}, 'processing',
            now() - make_interval(secs => ${ageSeconds}), now() - make_interval(secs => ${ageSeconds}))
    returning lease`
  return row!.lease
}

/** Whether the key is still claimed (in processing): an expired one is released, and its retry runs. */
export async function keyInProcessing(sql: postgres.Sql, tenant: string, key: string): Promise<boolean> {
  const [row] = await sql<{ n: number }[]>`select count(*)::int as n from idempotency_keys where tenant = ${tenant} and key = ${key} and status = 'processing'`
  return row!.n === 1
}
