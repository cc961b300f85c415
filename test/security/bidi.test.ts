/**
 * Bidi controls in client-chosen text never reach an operator's screen raw
 * (issue 27: "U+202E and other bidi controls pass into the admin and CLI"):
 * a customer `cus_\u202Egnp.exe` shows as another text. Keys and tenants are
 * printable ASCII (a CHECK); a payment's customer and description, and the
 * request summary of a stuck or released key, are not. Over real HTTP and the
 * real CLI process: every place that shows them writes the controls out.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { writeServerSettings } from '../../src/core/settings'
import { getPage, signIn, type Signed } from '../admin/support'
import { startApp, type InProcessService } from '../support/app'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { runIdem } from '../support/cli'

const BIDI = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/
const CUSTOMER = 'cus_\u202Egnp.exe'
const DESCRIPTION = 'refund \u2066for\u2069 \u200forder'

let db: TestDatabase
let service: InProcessService
let url: string
let admin: Signed
beforeAll(async () => {
  db = await createTestDatabase('security_bidi')
  service = await startApp(db)
  url = service.listen()
  admin = await signIn(url)
  await writeServerSettings(db.sql, { ttlSeconds: 30, retentionSeconds: 86_400 })
})
afterAll(async () => {
  await service?.stop()
  await db?.drop()
})

const idem = (args: string[]) => runIdem(db.url, args)

test('a completed payment\'s customer and description: written out on the key page (summary, payment, stored answer) and in idem show', async () => {
  const created = await fetch(`${url}/api/payments`, {
    method: 'POST',
    headers: { authorization: 'Bearer acme-key', 'content-type': 'application/json', 'idempotency-key': 'bidi-paid' },
    body: JSON.stringify({ amount: 4200, currency: 'EUR', customer: CUSTOMER, description: DESCRIPTION }),
  })
  expect(created.status).toBe(201)
  const { response, html } = await getPage(url, '/admin/keys/acme/bidi-paid', admin)
  expect(response.status).toBe(200)
  expect(html).toContain('cus_\\u202egnp.exe') // written out by the one rule (characters.ts), as the CLI does
  expect(html).not.toMatch(BIDI)
  const shown = await idem(['show', 'acme', 'bidi-paid'])
  expect(shown.code).toBe(0)
  expect(shown.stdout).toContain('cus_\\u202egnp.exe')
  expect(shown.stdout).not.toMatch(BIDI)
})

test('a released key\'s summary: written out on the released page and in idem released', async () => {
  await db.sql`
    insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, released_at, release_reason, summary)
    values ('acme', 'bidi-released', 'POST', '/api/payments', ${'d'.repeat(64)}, 'released', now() - interval '2 minutes', now() - interval '2 minutes',
            now() - interval '90 seconds', 'deadline', ${db.sql.json({ customer: CUSTOMER, amount: 4200, currency: 'EUR' })})`
  const { html } = await getPage(url, '/admin/released?reason=deadline', admin)
  expect(html).toContain('bidi-released')
  expect(html).not.toMatch(BIDI)
  const listed = await idem(['released'])
  expect(listed.stdout).toContain('bidi-released')
  expect(listed.stdout).not.toMatch(BIDI)
})
