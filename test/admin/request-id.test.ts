/**
 * One request id end to end (SPEC: the client's X-Request-Id, or the one the
 * service made, is the id in the logs, on the admin's key page and in the
 * CLI). Before, the page showed the execution's stored id, which no log line
 * carries.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { createLogger } from '../../src/log'
import { startApp, type InProcessService } from '../support/app'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { payment, paymentRequest } from '../support/http'
import { ADMIN_TOKEN } from '../support/server'
import { signIn } from './support'
import { claim } from '../../src/core/claim'
import { identity } from '../support/keys'

let db: TestDatabase
let service: InProcessService
let url: string
const lines: string[] = []
beforeAll(async () => {
  db = await createTestDatabase('request_id_e2e')
  service = await startApp(db, { log: createLogger({ sink: (line) => lines.push(line) }), faults: { failureRate: 1 } })
  url = service.listen()
})
afterAll(async () => {
  await service?.stop()
  await db?.drop()
})

test('the client\'s X-Request-Id is the one in the failure\'s log line, on the key page, in the admin API and in the CLI', async () => {
  const key = `rid-${crypto.randomUUID()}`
  const clientId = `client-${crypto.randomUUID()}`
  const failed = await fetch(paymentRequest(url, payment(), { key, headers: { 'x-request-id': clientId } }))
  expect({ status: failed.status, id: failed.headers.get('x-request-id') }).toEqual({ status: 502, id: clientId })
  const logged = lines.map((line) => JSON.parse(line)).find((line) => line.key === key && line.level !== 'debug')
  expect(logged?.request_id).toBe(clientId)

  const signed = await signIn(url)
  const page = await (await fetch(`${url}/admin/keys/acme/${encodeURIComponent(key)}`, { headers: { cookie: signed.cookie } })).text()
  expect(page).toMatch(new RegExp(`<dt>Request id</dt>\\s*<dd><span class="mono">${clientId}</span>`))
  const api = await (await fetch(`${url}/admin/api/keys/acme/${encodeURIComponent(key)}`, { headers: { authorization: `Bearer ${ADMIN_TOKEN}` } })).json() as { http_request_id: string }
  expect(api.http_request_id).toBe(clientId)

  const cli = Bun.spawn([process.execPath, 'src/cli.ts', '--ttl-seconds', '30', '--retention-seconds', '86400', 'show', 'acme', key], { env: { ...process.env, DATABASE_URL: db.url }, stdout: 'pipe', stderr: 'pipe' })
  const [out, code] = await Promise.all([new Response(cli.stdout).text(), cli.exited])
  expect(code).toBe(0)
  expect(out).toMatch(new RegExp(`request id\\s+${clientId}`))
})

test('without one, the id the service answered with is the one stored', async () => {
  const key = `rid-own-${crypto.randomUUID()}`
  const answer = await fetch(paymentRequest(url, payment(), { key }))
  const own = answer.headers.get('x-request-id')!
  const [row] = await db.sql<{ id: string }[]>`select http_request_id as id from idempotency_key_states where key = ${key}`
  expect(row!.id).toBe(own)
})

// Catches: a completed key that the admin cannot find (the list shows keys in processing only).
test('the list page finds a key in any state by its tenant and key', async () => {
  const key = `find-${crypto.randomUUID()}`
  await db.sql`insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, completed_at, response_status, response_headers, response_body)
    values ('acme', ${key}, 'POST', '/api/payments', ${'e'.repeat(64)}, 'done', now(), now(), now(), 201, '{}'::jsonb, '{}')`
  const signed = await signIn(url)
  const list = await (await fetch(`${url}/admin`, { headers: { cookie: signed.cookie } })).text()
  expect(list).toContain('<form class="filters" method="get" action="/admin/key" id="find-key">')
  expect(list).not.toContain(key)
  const found = await fetch(`${url}/admin/key?${new URLSearchParams({ tenant: 'acme', key })}`, { headers: { cookie: signed.cookie } })
  expect(found.status).toBe(200)
  expect(await found.text()).toContain(key)
})

// Catches: a key whose process is gone listed as "running" (it may be taken over now).
test('the list says "owner gone" for a key in processing whose process no longer beats, "running" for one a live process works on', async () => {
  const gone = crypto.randomUUID()
  const live = crypto.randomUUID()
  await db.sql`insert into idempotency_processes (id, pid, hostname, heartbeat_at) values (${gone}, 1, 'gone', now() - interval '1 minute'), (${live}, 2, 'live', now())`
  const timing = { ttlSeconds: 30, retentionSeconds: 86_400 }
  const orphan = identity({ key: `orphan-${crypto.randomUUID()}` })
  const worked = identity({ key: `worked-${crypto.randomUUID()}` })
  await claim(db.pools.short, orphan, { ...timing, owner: gone })
  await claim(db.pools.short, worked, { ...timing, owner: live })
  const signed = await signIn(url)
  const page = await (await fetch(`${url}/admin?tenant=acme`, { headers: { cookie: signed.cookie } })).text()
  const rowOf = (key: string) => page.split('<tr').find((row) => row.includes(key)) ?? ''
  expect(rowOf(orphan.key)).toContain('owner gone')
  expect(rowOf(worked.key)).toContain('>running<')
})
