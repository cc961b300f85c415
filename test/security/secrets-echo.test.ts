/**
 * Secrets are never echoed (issue 27, ASVS 7.1.1): a canary secret in every
 * setting that holds one, and a scan of everything the process prints, for a
 * refused start (each malformed setting) and for a start that serves (the
 * banner, the log lines). A refusal names the variable and the entry's
 * position, never its content.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { ConfigError, loadConfig } from '../../src/config'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { spawnService } from '../support/process'
import { startProvider, type ProviderHandle } from '../support/server'

const CANARY = 'canary7f3a9'
const secret = (tag: string) => `${tag}-${CANARY}-${'z'.repeat(32)}`

/** Settings, each malformed in a way that still puts a secret in it. */
const MALFORMED: [label: string, env: Record<string, string>, variable: string][] = [
  ['an API_KEYS entry without its colon', { API_KEYS: `acme:${secret('ok')},${secret('broken')}` }, 'API_KEYS'],
  ['an API_KEYS key with a space in it', { API_KEYS: `acme:${secret('a')} ${secret('b')}` }, 'API_KEYS'],
  ['an ADMIN_TOKENS entry with a bad name', { ADMIN_TOKENS: `alice:${secret('alice')},b o b:${secret('bob')}` }, 'ADMIN_TOKENS'],
  ['an ADMIN_TOKENS entry with a space in its token', { ADMIN_TOKENS: `alice:${secret('a')} ${secret('b')}` }, 'ADMIN_TOKENS'],
  ['a PAYMENT_PROVIDER_URL that does not parse', { PAYMENT_PROVIDER_URL: `http://user:${secret('pw')}@[bad host/` }, 'PAYMENT_PROVIDER_URL'],
  ['a PAYMENT_PROVIDER_URL of another scheme', { PAYMENT_PROVIDER_URL: `ftp://user:${secret('pw')}@provider.example` }, 'PAYMENT_PROVIDER_URL'],
  ['a DATABASE_URL that does not parse', { DATABASE_URL: `postgres://app:${secret('pw')}@db:notaport/payments` }, 'DATABASE_URL'],
  ['a METRICS_TOKEN with a space', { METRICS_TOKEN: `${secret('m')} x` }, 'METRICS_TOKEN'],
  // Well-formed, and refused by REQUIRE_TLS=1: the refusal names the variable, not the URL.
  ['a plain-text DATABASE_URL under REQUIRE_TLS=1', { DATABASE_URL: `postgres://app:${secret('pw')}@db.internal/payments`, REQUIRE_TLS: '1' }, 'DATABASE_URL'],
  ['a plain http:// PAYMENT_PROVIDER_URL under REQUIRE_TLS=1', { DATABASE_URL: 'postgres://app@db.internal/payments?sslmode=require', PAYMENT_PROVIDER_URL: `http://user:${secret('pw')}@provider.example/?key=${secret('k')}`, REQUIRE_TLS: '1' }, 'PAYMENT_PROVIDER_URL'],
]

describe('a refused configuration names the variable, never the secret', () => {
  for (const [label, env, variable] of MALFORMED) {
    test(label, () => {
      let error: unknown
      try { loadConfig(env) } catch (caught) { error = caught }
      expect(error).toBeInstanceOf(ConfigError)
      expect((error as ConfigError).variable).toBe(variable)
      expect((error as ConfigError).message).not.toContain(CANARY)
    })
  }

  test('the real process: exit 2, the variable named, no canary in anything it printed', async () => {
    for (const [, env, variable] of [...MALFORMED.slice(0, 3), ...MALFORMED.filter(([, env]) => env.REQUIRE_TLS)]) {
      const proc = Bun.spawn([process.execPath, 'src/main.ts'], { env: { ...process.env, ...env }, stdout: 'pipe', stderr: 'pipe' })
      const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
      expect(code).toBe(2)
      expect(`${out}${err}`).toContain(variable)
      expect(`${out}${err}`).not.toContain(CANARY)
    }
  })
})

describe('a start that serves', () => {
  let db: TestDatabase
  let provider: ProviderHandle
  beforeAll(async () => {
    db = await createTestDatabase('secrets_echo')
    provider = await startProvider()
  })
  afterAll(async () => {
    await provider?.stop()
    await db?.drop()
  })

  test('the banner and the log show the provider URL without its user, password or key', async () => {
    const url = new URL(provider.url)
    url.username = `user-${CANARY}`
    url.password = secret('password')
    url.searchParams.set('key', secret('key'))
    const { proc, url: served, output } = await spawnService({
      env: { DATABASE_URL: db.url, PAYMENT_PROVIDER_URL: url.toString(), API_KEYS: `acme:${secret('api')}`, ADMIN_TOKEN: secret('admin'), METRICS_TOKEN: secret('metrics') },
    })
    try {
      expect((await fetch(`${served}/healthz`)).status).toBe(200)
      const printed = output()
      expect(printed).toMatch(/provider +http:\/\/\*\*\*:\*\*\*@127\.0\.0\.1:\d+\/\?key=\*\*\*/)
      expect(printed).not.toContain(CANARY)
    } finally {
      proc.kill('SIGTERM')
      await proc.exited
    }
    expect(output()).not.toContain(CANARY)
  })
})
