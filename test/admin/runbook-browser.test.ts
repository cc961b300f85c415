/**
 * From the page to the runbook in a real browser (Debian's chromium, driven
 * by playwright-core), against the service as users run it: the readiness
 * alert's runbook_url, as dashboards/prometheus-rules.yml builds it → the
 * runbook page the service serves, with no sign-in (escaped, nothing loaded from another
 * origin) → the runbook index → every alert's page opens; then the list of
 * keys released after their deadline, with the downstream key to ask the
 * provider with. Kept apart from browser.test.ts (the stale-key walk).
 *
 * Screenshots go to test-artifacts/.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { mkdirSync, readFileSync } from 'node:fs'
import { type Browser } from 'playwright-core'
import { launchChromium } from '../support/browser'
import { downstreamKey } from '../../src/core/downstream-key'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { ADMIN_TOKEN, startServer, type ServerProcess } from '../support/server'

const SHOTS = 'test-artifacts'
const HOSTILE_CUSTOMER = '<img src=x onerror=alert(1)>'

let db: TestDatabase
let server: ServerProcess
let browser: Browser
beforeAll(async () => {
  mkdirSync(SHOTS, { recursive: true })
  db = await createTestDatabase('admin_runbook_browser')
  server = await startServer(db.url)
  browser = await launchChromium()
}, 60_000)
afterAll(async () => {
  await browser?.close()
  await server?.stop()
  await db?.drop()
})

type Rule = { alert?: string; annotations?: Record<string, string> }
const rules = () => (Bun.YAML.parse(readFileSync('dashboards/prometheus-rules.yml', 'utf8')) as { groups: { rules: Rule[] }[] }).groups.flatMap((group) => group.rules)

test('the alert\'s runbook link → the runbook page, no sign-in, served escaped and same-origin; every alert\'s runbook opens', async () => {
  const rule = rules().find((candidate) => candidate.alert === 'IdempotencyNotReady')!
  // As Alertmanager would have it, for a service whose external URL is this server's.
  const runbookUrl = rule.annotations!.runbook_url!.replace('http://127.0.0.1:3000', server.url)
  expect(runbookUrl).toBe(`${server.url}/admin/runbooks/IdempotencyNotReady`)

  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } })
  const origins = new Set<string>()
  page.on('request', (request) => { if (!request.url().startsWith('data:')) origins.add(new URL(request.url()).origin) })
  const dialogs: string[] = []
  page.on('dialog', (dialog) => { dialogs.push(dialog.message()); void dialog.dismiss() })
  await page.setContent(`<!doctype html><meta charset="utf-8"><p>[FIRING:1] IdempotencyNotReady</p><a id="runbook-link" href="${runbookUrl}">Runbook</a>`)
  origins.clear()
  await page.click('#runbook-link')

  // Public: no sign-in on the way (sessions live in the database, which may be the outage that paged).
  await page.waitForURL(runbookUrl)
  expect(await page.locator('#runbook-title').innerText()).toBe('Runbook: IdempotencyNotReady')
  const text = await page.locator('#runbook').innerText()
  for (const part of ['What it means', 'What to check', 'What to click', 'Expected detection time']) expect(text).toContain(part)
  // Every link on the page stays on this origin.
  for (const href of await page.locator('a').evaluateAll((links) => links.map((link) => (link as HTMLAnchorElement).href)))
    expect({ href, origin: new URL(href).origin }).toEqual({ href, origin: server.url })
  await page.screenshot({ path: `${SHOTS}/admin-runbook.png`, fullPage: true })

  // The index, from the page's own link (signed out, the header has no menu), lists every alert of the rule file, and each page opens.
  await page.click('a:text-is("← All runbooks")')
  await page.waitForURL(`${server.url}/admin/runbooks`)
  const listed = await page.locator('#runbooks a').allInnerTexts()
  expect(listed.sort()).toEqual(rules().map((each) => each.alert!).sort())
  for (const alert of listed) {
    const response = await page.goto(`${server.url}/admin/runbooks/${alert}`)
    expect({ alert, status: response?.status() }).toEqual({ alert, status: 200 })
    expect(await page.locator('#runbook-title').innerText()).toBe(`Runbook: ${alert}`)
  }
  expect((await page.goto(`${server.url}/admin/runbooks/NoSuchAlert`))?.status()).toBe(404)
  expect([...origins]).toEqual([server.url])
  expect(dialogs).toEqual([])
  await page.close()
}, 60_000)

test('released after their deadline: the list shows each key with its summary and the downstream key to ask the provider with', async () => {
  const key = 'order-9001-timeout'
  const [row] = await db.sql<{ request_id: string }[]>`
    insert into idempotency_keys (tenant, key, method, path, fingerprint, status, created_at, locked_at, released_at, release_reason, summary)
    values ('acme', ${key}, 'POST', '/api/payments', ${'d'.repeat(64)}, 'released', now() - interval '2 minutes', now() - interval '2 minutes',
            now() - interval '90 seconds', 'deadline', ${db.sql.json({ customer: HOSTILE_CUSTOMER, amount: 4200, currency: 'EUR' })})
    returning request_id::text`
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } })
  const dialogs: string[] = []
  page.on('dialog', (dialog) => { dialogs.push(dialog.message()); void dialog.dismiss() })
  await page.goto(`${server.url}/admin/login?next=${encodeURIComponent('/admin')}`)
  await page.fill('input[name=token]', ADMIN_TOKEN)
  await page.click('button[type=submit]')
  await page.waitForURL(`${server.url}/admin`)
  await page.click('header a:text-is("Released after deadline")')
  await page.waitForURL((url) => url.pathname === '/admin/released')
  const row1 = await page.locator('#released tbody tr').first().innerText()
  expect(row1).toContain(key)
  // jsonb keeps its own key order; the text is text, never markup
  expect(row1).toContain(`amount 4200, currency EUR, customer ${HOSTILE_CUSTOMER}`)
  expect(row1).toContain(downstreamKey({ tenant: 'acme', key, requestId: row!.request_id }))
  expect(await page.locator('#released-counts').innerText()).toContain('1\ndeadline')
  await page.screenshot({ path: `${SHOTS}/admin-released-deadline.png`, fullPage: true })

  // The key's page names the reason and the summary stored at claim.
  await page.click(`#released a:text-is("${key}")`)
  await page.waitForURL((url) => url.pathname === `/admin/keys/acme/${key}`)
  const facts = await page.locator('#key-facts').innerText()
  expect(facts).toContain('after its deadline: the provider may have charged')
  expect(await page.locator('#request-summary').innerText()).toBe(`amount 4200, currency EUR, customer ${HOSTILE_CUSTOMER}`)
  expect(dialogs).toEqual([])
  await page.close()
}, 60_000)
