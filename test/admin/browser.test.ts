/**
 * A real browser (Debian's chromium, driven by playwright-core) signs in,
 * finds a stuck key, force-expires it, and sees it gone. Keeps screenshots
 * under test-artifacts/.
 */
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { mkdirSync } from 'node:fs'
import { chromium, type Browser } from 'playwright-core'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { ADMIN_TOKEN, startServer, type ServerProcess } from '../support/server'
import { keyInProcessing, stuckKey } from './support'

const ARTIFACTS = 'test-artifacts'
const CHROMIUM_ARGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync']

let db: TestDatabase
let server: ServerProcess
let browser: Browser
beforeAll(async () => {
  mkdirSync(ARTIFACTS, { recursive: true })
  db = await createTestDatabase('admin_browser')
  server = await startServer(db.url)
  browser = await chromium.launch({ executablePath: process.env.CHROMIUM_PATH ?? '/usr/bin/chromium', args: CHROMIUM_ARGS })
}, 60_000)
afterAll(async () => {
  await browser?.close()
  await server?.stop()
  await db?.drop()
})

test('an operator signs in, sees a stuck key, expires it, and sees it gone', async () => {
  const stuck = 'order-7731-retry'
  const hostile = '<script>alert(1)</script>'
  await stuckKey(db.sql, 'acme', stuck, 5400)
  await stuckKey(db.sql, 'globex', hostile, 2400)
  await stuckKey(db.sql, 'acme', 'order-7790', 4)
  const page = await browser.newPage({ viewport: { width: 1280, height: 800 } })
  const dialogs: string[] = []
  page.on('dialog', (dialog) => { dialogs.push(dialog.message()); void dialog.dismiss() })

  await page.goto(`${server.url}/admin`)
  expect(new URL(page.url()).pathname).toBe('/admin/login')
  expect(await page.content()).not.toContain(stuck)
  await page.fill('input[name=token]', ADMIN_TOKEN)
  await page.fill('input[name=name]', 'alice')
  await page.click('button[type=submit]')
  await page.waitForURL(`${server.url}/admin`)

  const row = page.locator('tr', { has: page.locator('td.key', { hasText: stuck }) })
  await expect(row.count()).resolves.toBe(1)
  expect(await row.locator('.tag').innerText()).toBe('stale')
  // The hostile key is text on the page, not markup: no alert, and the cell shows it verbatim.
  expect(await page.locator('td.key', { hasText: 'alert(1)' }).innerText()).toBe(hostile)
  expect(dialogs).toEqual([])
  await page.screenshot({ path: `${ARTIFACTS}/admin-keys.png`, fullPage: true })

  await row.locator('button', { hasText: 'Force-expire' }).click()
  await page.waitForURL(/\/admin\?result=\d+$/)
  expect(await page.locator('.notice').innerText()).toContain('Expired: the key was deleted')
  expect(await page.locator('td.key', { hasText: stuck }).count()).toBe(1) // only in the audit trail now
  expect(await page.locator('table').first().locator('td.key', { hasText: stuck }).count()).toBe(0)
  expect(await keyInProcessing(db.sql, 'acme', stuck)).toBe(false)
  await page.screenshot({ path: `${ARTIFACTS}/admin-after-expire.png`, fullPage: true })

  // "Expire all stale" goes through a confirmation page first.
  await page.click('text=Expire all stale…')
  expect(await page.locator('h2').innerText()).toBe('Expire all stale keys?')
  await page.screenshot({ path: `${ARTIFACTS}/admin-confirm.png`, fullPage: true })
  await page.click('button.danger')
  await page.waitForURL(/\/admin\?result=\d+$/)
  expect(await page.locator('.notice').innerText()).toContain('1 key(s) expired')
  expect(await keyInProcessing(db.sql, 'globex', hostile)).toBe(false)
  expect(await keyInProcessing(db.sql, 'acme', 'order-7790')).toBe(true) // fresh: not stale, untouched
  expect(dialogs).toEqual([])
  await page.close()
}, 60_000)
