/**
 * URLs are printed by their shape, never with a secret (issue 41, ASVS 7.1.1):
 * scheme, host, port and path kept; userinfo, every query value and the
 * fragment masked, parameter names kept; a token-shaped path segment masked
 * (store/masked-url.ts). Then the canary: a real service process given a
 * canary in every part of every setting that can carry a URL, and a scan of
 * everything it prints (banner, log lines at debug, a failed charge's lines,
 * the stop), of its `--help`, and of a refused start.
 */
import postgres from 'postgres'
import { afterAll, beforeAll, expect, test } from 'bun:test'
import { looksLikeToken, maskedUrl } from '../../src/store/masked-url'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { spawnService } from '../support/process'
import { startProvider, type ProviderHandle } from '../support/server'

test('the issue\'s provider URL: every value, the fragment and the userinfo masked, names, host, port and path kept', () => {
  expect(maskedUrl('https://provider.example:443/v1?client_secret=cs_1&x-amz-signature=abc&api_key=k&sig=s&sk=sk_1#token=t'))
    .toBe('https://provider.example:443/v1?client_secret=***&x-amz-signature=***&api_key=***&sig=***&sk=***#***')
  expect(maskedUrl('https://key_live_1:@provider.example/v1/sk_live_4eC39HqLyjWDarjtT1zdp7dc/charges?flag'))
    .toBe('https://***@provider.example/v1/***/charges?flag=***')
  expect(maskedUrl('http://127.0.0.1:3001')).toBe('http://127.0.0.1:3001/')
  expect(maskedUrl('postgres:///payments?host=/var/run/postgresql')).toBe('postgres:///payments?host=***')
  // An opaque URL has no host to keep: its whole path may be the secret.
  expect(maskedUrl('mailto:secret@example.com')).toBe('mailto:***')
  expect(maskedUrl('http://[bad')).toBe('(not shown: not a URL)')
})

test('a token-shaped segment: 32+ characters, or a run of 16+ letters and digits mixing both; words and short ids are kept', () => {
  for (const token of ['sk_live_4eC39HqLyjWDarjtT1zdp7dc', 'a'.repeat(32), '550e8400-e29b-41d4-a716-446655440000', '0123456789abcdef', 'tok%2D9f86d081884c7d65', 'bot123456:ABC-DEF1234ghIkl-zyx57W2v1u1'])
    expect({ token, masked: looksLikeToken(token) }).toEqual({ token, masked: true })
  for (const word of ['v1', 'charges', 'payments', 'X-Amz-Credential', '2026-12-06', 'idempotent_post', 'T00000000', 'idem_masked_urls_1a2b3c4d', 'payments_2026_12_06', ''])
    expect({ word, masked: looksLikeToken(word) }).toEqual({ word, masked: false })
})

const CANARY = 'cAn4ry9f3e'
/** The canary inside a value shaped as a real secret of its kind would be. */
const secretOf = (tag: string) => `${tag}_${CANARY}_${'x'.repeat(12)}`

let db: TestDatabase
let provider: ProviderHandle
/**
 * A role whose password carries the canary, made for this test: the server may check passwords (the embedded
 * one does) or ignore them (trust), and either way the canary must reach the process and never come out of it.
 */
const canaryRole = `masked_canary_${crypto.randomUUID().slice(0, 8)}`
beforeAll(async () => {
  db = await createTestDatabase('masked_urls')
  provider = await startProvider()
  await db.sql.unsafe(`create role ${canaryRole} login superuser password '${secretOf('dbpw')}'`)
})
afterAll(async () => {
  await provider?.stop()
  await db?.drop()
  const admin = postgres(process.env.DATABASE_URL!, { max: 1, onnotice: () => undefined })
  await admin.unsafe(`drop role if exists ${canaryRole}`).finally(() => admin.end())
})

/** Every setting that can carry a URL, a canary in each part that may hold a secret (in the path: a token-shaped segment, the kind masked-url.ts recognises). */
function canaryEnv(): Record<string, string> {
  const database = new URL(db.url)
  database.username = canaryRole
  database.password = secretOf('dbpw')
  database.searchParams.set('application_name', secretOf('dbq'))
  const { host } = new URL(provider.url)
  const query = ['client_secret', 'x-amz-signature', 'api_key', 'sig', 'sk', 'token'].map((name) => `${name}=${secretOf(name)}`).join('&')
  return {
    DATABASE_URL: database.toString(),
    PAYMENT_PROVIDER_URL: `http://${secretOf('user')}:${secretOf('pass')}@${host}/v1/sk_live_${CANARY}Hq7LyjWDarjtT1zd?${query}#token=${secretOf('fragment')}`,
    LOG_LEVEL: 'debug',
  }
}

test('the real process prints no canary: banner, debug log lines, a failed charge, the stop, --help and a refused start', async () => {
  const env = canaryEnv()
  const { proc, url, output } = await spawnService({ env: { ...env, API_KEYS: 'acme:acme-key', NODE_ENV: 'test' } })
  try {
    expect((await fetch(`${url}/healthz`)).status).toBe(200)
    // The charge goes to the masked URL's host and fails there (the provider URL carries a query and a fragment):
    // its failure lines are printed too.
    const paid = await fetch(`${url}/api/payments`, {
      method: 'POST',
      headers: { authorization: 'Bearer acme-key', 'content-type': 'application/json', 'idempotency-key': 'canary-1' },
      body: JSON.stringify({ amount: 100, currency: 'EUR', customer: 'cus_1' }),
    })
    expect(paid.status).toBeGreaterThanOrEqual(400)
    const banner = output()
    // The server's own parameters (the embedded one's sslmode) come first, each masked too.
    expect(banner).toMatch(/database +postgres:\/\/\*\*\*:\*\*\*@127\.0\.0\.1:\d+\/idem_masked_urls_[0-9a-f]{8}\?(?:[a-z_]+=\*\*\*&)*application_name=\*\*\*\n/)
    expect(banner).toMatch(/provider +http:\/\/\*\*\*:\*\*\*@127\.0\.0\.1:\d+\/v1\/\*\*\*\?client_secret=\*\*\*&x-amz-signature=\*\*\*&api_key=\*\*\*&sig=\*\*\*&sk=\*\*\*&token=\*\*\*#\*\*\*/)
  } finally {
    proc.kill('SIGTERM')
    await proc.exited
  }
  const printed = output()
  expect(printed).toContain('"msg":"stopped"')
  expect(printed).not.toContain(CANARY)

  const run = async (args: string[], extra: Record<string, string>) => {
    const child = Bun.spawn([process.execPath, 'src/main.ts', ...args], { env: { ...process.env, ...env, ...extra }, stdout: 'pipe', stderr: 'pipe' })
    const [out, err, code] = await Promise.all([new Response(child.stdout).text(), new Response(child.stderr).text(), child.exited])
    return { code, text: `${out}${err}` }
  }
  const help = await run(['--help'], {})
  expect(help.code).toBe(0)
  expect(help.text).toContain('PAYMENT_PROVIDER_URL')
  expect(help.text).not.toContain(CANARY)
  // Refused (production without its secrets): the refusal names the variables, never a URL's secret.
  const refused = await run([], { NODE_ENV: 'production' })
  expect(refused.code).toBe(2)
  expect(refused.text).toContain('API_KEYS')
  expect(refused.text).not.toContain(CANARY)
}, 60_000)
