/**
 * /docs and /admin load nothing from another origin: /docs is Swagger UI
 * from the installed swagger-ui-dist package, served by us under a CSP that
 * names no other origin. Checked on the page's own text (every script and
 * style URL is ours and answers 200), then in a real Chromium whose every
 * request to another origin fails (no network beyond the service): the docs
 * render every operation, and no request left the origin, no CSP violation.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { type Browser, type Page } from 'playwright-core'
import { launchChromium } from '../support/browser'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { ADMIN_TOKEN, startServer, type ServerProcess } from '../support/server'


let db: TestDatabase
let server: ServerProcess
let browser: Browser
beforeAll(async () => {
  db = await createTestDatabase('security_docs')
  server = await startServer(db.url)
  browser = await launchChromium()
}, 60_000)
afterAll(async () => {
  await browser?.close()
  await server?.stop()
  await db?.drop()
})

/** The CSP's directives as a map. */
function directives(csp: string | null): Map<string, string[]> {
  return new Map((csp ?? '').split(';').map((part) => part.trim().split(/\s+/)).filter((words) => words[0]).map(([name, ...values]) => [name!, values]))
}

/** No source in a CSP names another origin (or any scheme-wide or wildcard source). */
function onlyOurOrigin(csp: string | null): void {
  const policy = directives(csp)
  expect(policy.get('default-src')).toEqual(["'none'"])
  for (const [name, values] of policy) {
    for (const value of values) expect({ name, value }).toEqual({ name, value: expect.stringMatching(/^('self'|'none'|'sha256-[A-Za-z0-9+/=]+'|data:)$/) })
  }
}

describe('/docs', () => {
  test('every script, style and icon of the page is ours, answers 200, and the CSP allows no other origin', async () => {
    const page = await fetch(`${server.url}/docs`)
    expect(page.status).toBe(200)
    onlyOurOrigin(page.headers.get('content-security-policy'))
    expect(directives(page.headers.get('content-security-policy')).get('script-src')).toEqual(["'self'"])
    const html = await page.text()
    const urls = [...html.matchAll(/(?:src|href)="([^"]+)"/g)].map(([, url]) => url!)
    expect(urls.length).toBeGreaterThanOrEqual(3)
    expect(html).not.toMatch(/<script>(?!<\/script>)/) // no inline script
    for (const url of urls) {
      const resolved = new URL(url, server.url)
      expect({ url, origin: resolved.origin }).toEqual({ url, origin: server.url })
      const asset = await fetch(resolved)
      expect({ url, status: asset.status }).toEqual({ url, status: 200 })
      expect(asset.headers.get('x-content-type-options')).toBe('nosniff')
    }
    // The bundle is sent compressed to browsers that take it.
    const bundle = urls.find((url) => url.endsWith('swagger-ui-bundle.js'))!
    const gzipped = await fetch(new URL(bundle, server.url), { headers: { 'accept-encoding': 'gzip' }, decompress: false } as RequestInit)
    expect(gzipped.headers.get('content-encoding')).toBe('gzip')
    expect((await gzipped.arrayBuffer()).byteLength).toBeLessThan(700_000)
  })

  test('in Chromium with no network beyond the service, the docs render every operation; nothing leaves the origin, nothing violates the CSP', async () => {
    const { page, foreign, violations } = await isolatedPage()
    await page.goto(`${server.url}/docs`)
    await page.waitForSelector('.opblock', { timeout: 30_000 })
    const document = await (await fetch(`${server.url}/openapi.json`)).json() as { paths: Record<string, Record<string, unknown>> }
    const operations = Object.values(document.paths).reduce((n, item) => n + Object.keys(item).length, 0)
    expect(await page.locator('.opblock').count()).toBe(operations)
    // Opened, an operation renders its parameters, schemas and examples (three are enough to see; all would take ~30 s here).
    for (const summary of (await page.locator('.opblock-summary-control').all()).slice(0, 3)) await summary.click()
    expect(await page.locator('.opblock-body').count()).toBe(3)
    expect(await page.locator('.opblock-body >> text=Idempotency-Key').count()).toBeGreaterThan(0)
    expect(foreign).toEqual([])
    expect(await violations()).toEqual([])
    await page.close()
  }, 60_000)
})

describe('/admin', () => {
  test('the sign-in page and the signed-in list load nothing from another origin, under a CSP that allows none', async () => {
    for (const path of ['/admin/login']) onlyOurOrigin((await fetch(`${server.url}${path}`)).headers.get('content-security-policy'))
    const { page, foreign, violations, requested } = await isolatedPage()
    await page.goto(`${server.url}/admin/login`)
    await page.fill('input[name=token]', ADMIN_TOKEN)
    await page.click('button[type=submit]')
    await page.waitForURL(`${server.url}/admin`)
    for (const path of ['/admin', '/admin/sessions', '/admin/audit']) {
      const response = await page.goto(`${server.url}${path}`)
      expect(response!.status()).toBe(200)
      onlyOurOrigin(response!.headers()['content-security-policy'] ?? null)
    }
    expect(foreign).toEqual([])
    expect(await violations()).toEqual([])
    expect(requested.every((url) => new URL(url).origin === server.url)).toBe(true)
    await page.close()
  }, 60_000)
})

/** A page that cannot reach any origin but the service's, recording what it tried and what the CSP refused. */
async function isolatedPage(): Promise<{ page: Page; foreign: string[]; requested: string[]; violations(): Promise<string[]> }> {
  const page = await browser.newPage()
  const foreign: string[] = []
  const requested: string[] = []
  const seen: string[] = []
  await page.route('**/*', (route) => {
    const url = route.request().url()
    requested.push(url)
    if (new URL(url).origin === server.url) return route.continue()
    foreign.push(url)
    return route.abort('internetdisconnected')
  })
  await page.exposeFunction('reportViolation', (text: string) => { seen.push(text) })
  await page.addInitScript(() => {
    document.addEventListener('securitypolicyviolation', (event) => {
      void (window as unknown as { reportViolation(text: string): void }).reportViolation(`${event.violatedDirective} ${event.blockedURI}`)
    })
  })
  return { page, foreign, requested, violations: async () => seen }
}
