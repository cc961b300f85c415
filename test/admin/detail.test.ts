/** One key's page and its confirmation: what an operator sees before clearing a key, and what clearing it does. */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { newLeaseId } from '../../src/core/lease-id'
import { downstreamKey } from '../../src/core/downstream-key'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { api, decode, getPage, keyInProcessing, postForm, signIn, startAdmin, stuckKey, type AdminServer, type Signed } from './support'

let db: TestDatabase
let server: AdminServer
let admin: Signed
beforeAll(async () => {
  db = await createTestDatabase('admin_detail')
  server = startAdmin(db.pools, { ttlSeconds: 30, retentionSeconds: 3600 })
  admin = await signIn(server.url, 'carol')
})
afterAll(async () => {
  await server?.stop()
  await db?.drop()
})

const page = (path: string) => getPage(server.url, path, admin)
const text = (html: string) => decode(html.replace(/<[^>]+>/g, ' ')).replace(/\s+/g, ' ')
const field = (html: string, name: string) => decode(new RegExp(`name="${name}" value="([^"]*)"`).exec(html)?.[1] ?? '')

async function owned(tenant: string, key: string, ageSeconds: number, heartbeatSecondsAgo: number): Promise<string> {
  const lease = await stuckKey(db.sql, tenant, key, ageSeconds)
  const owner = crypto.randomUUID()
  await db.sql`insert into idempotency_processes (id, pid, hostname, heartbeat_at) values (${owner}, 31337, 'web-3', now() - make_interval(secs => ${heartbeatSecondsAgo}))`
  await db.sql`update idempotency_keys set owner = ${owner}, attempts = 2 where tenant = ${tenant} and key = ${key}`
  return lease
}

describe('a key whose worker died', () => {
  test('its page shows lease, attempts, owner gone, deadline passed and the downstream key; confirming releases it and leads to its audit entry', async () => {
    const lease = await owned('acme', 'order-7731', 900, 600)
    const [row] = await db.sql<{ request_id: string }[]>`select request_id::text from idempotency_key_states where tenant = 'acme' and key = 'order-7731'`
    const detail = await page('/admin/keys/acme/order-7731?back=tenant%3Dacme%26stale%3D1')
    expect(detail.response.status).toBe(200)
    const shown = text(detail.html)
    for (const part of ['processing, stale', 'POST /api/payments', `Lease ${lease}`, 'Attempts 2', 'pid 31337 on web-3', 'gone (no heartbeat for 10s)', ': passed, its worker has stopped',
      downstreamKey({ tenant: 'acme', key: 'order-7731', requestId: row!.request_id }), 'A force-expire would release the key now (it is past its deadline)']) expect(shown).toContain(part)

    const confirmHref = decode(/id="force-expire"\s+href="([^"]*)"/.exec(detail.html)![1]!)
    expect(confirmHref).toContain(`lease=${lease}`)
    const confirm = await page(confirmHref)
    expect(text(confirm.html)).toContain('Force-expire this key?')
    expect(text(confirm.html)).toContain('A force-expire would release the key now')
    expect(confirm.html).toContain('>Release the key</button>')
    expect(field(confirm.html, 'back')).toBe('tenant=acme&stale=1')
    expect(await keyInProcessing(db.sql, 'acme', 'order-7731')).toBe(true) // looking is not acting

    const done = await postForm(server.url, '/admin/keys/expire', { csrf: admin.csrf, tenant: 'acme', key: 'order-7731', lease, back: field(confirm.html, 'back') }, { cookie: admin.cookie })
    expect(done.status).toBe(303)
    const after = await page(done.headers.get('location')!)
    expect(text(after.html)).toContain('Expired: the key was released')
    expect(text(after.html)).toContain('released')
    expect(after.html).toContain('href="/admin?tenant=acme&amp;stale=1"') // back to the list the operator came from
    const entryHref = /<a href="(\/admin\/audit\/\d+)">audit entry/.exec(after.html)![1]!
    const entry = text((await page(entryHref)).html)
    for (const part of ['admin:admin (carol)', 'force_expire', 'order-7731', 'expired', `"lease": "${lease}"`]) expect(entry).toContain(part)
  })
})

describe('a key whose worker is alive', () => {
  test('the page and the confirmation say a force-expire would be refused, and it is', async () => {
    const lease = await owned('acme', 'slow-provider', 5, 1)
    const detail = text((await page('/admin/keys/acme/slow-provider')).html)
    expect(detail).toContain('pid 31337 on web-3')
    expect(detail).toContain(': alive')
    expect(detail).toContain('A force-expire would be refused now')
    const confirm = await page(`/admin/confirm/expire?tenant=acme&key=slow-provider&lease=${lease}`)
    expect(confirm.html).toContain('Try anyway (it will be refused)')
    const done = await postForm(server.url, '/admin/keys/expire', { csrf: admin.csrf, tenant: 'acme', key: 'slow-provider', lease }, { cookie: admin.cookie })
    expect(text((await page(done.headers.get('location')!)).html)).toContain('Not expired: a live worker holds this key')
    expect(await keyInProcessing(db.sql, 'acme', 'slow-provider')).toBe(true)
  })

  test('a confirmation for a lease that moved on says so and offers no button', async () => {
    const lease = await stuckKey(db.sql, 'acme', 'moved-on', 600)
    await db.sql`update idempotency_keys set lease = ${newLeaseId()}::bigint where tenant = 'acme' and key = 'moved-on'`
    const confirm = await page(`/admin/confirm/expire?tenant=acme&key=moved-on&lease=${lease}`)
    expect(text(confirm.html)).toContain('The key changed since you looked')
    expect(confirm.html).not.toContain('action="/admin/keys/expire"')
  })
})

describe('a completed payment', () => {
  test('shows the payment (customer, amount, provider charge) and its stored answer, and offers no force-expire; the API says the same', async () => {
    const [payment] = await db.sql<{ id: string }[]>`
      insert into payments (tenant, amount, currency, customer, status, provider_ref, idempotency_key)
      values ('acme', 4200, 'USD', 'cus_<b>9', 'succeeded', 'ch_123', 'paid') returning id::text`
    await db.sql`
      insert into idempotency_keys (tenant, key, method, path, fingerprint, status, completed_at, response_status, response_headers, response_body)
      values ('acme', 'paid', 'POST', '/api/payments', ${'f'.repeat(64)}, 'done', now(), 201, '{}'::jsonb, ${JSON.stringify({ id: payment!.id, customer: 'cus_<b>9' })})`
    const { html } = await page('/admin/keys/acme/paid')
    const shown = text(html)
    for (const part of ['customer cus_<b>9, 4200 USD', 'ch_123', 'Stored answer: 201', 'Nothing to expire: the key is done']) expect(shown).toContain(part)
    expect(html).not.toContain('cus_<b>9')
    expect(html).not.toContain('id="force-expire"')
    const json = await (await api(server.url, '/admin/api/keys/acme/paid')).json()
    expect(json).toMatchObject({ status: 'done', force_expire: 'not_processing', payment: { id: payment!.id, amount: '4200', currency: 'USD', provider_reference: 'ch_123' }, response: { status: 201 } })
  })
})
