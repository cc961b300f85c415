/**
 * The production secrets floor catches repetition and dictionary words (issue
 * 41, ASVS 2.10.4): `0123456789abcdef` three times and
 * `correcthorsebatterystaplecorrecthorse` passed as production API keys under
 * the character-entropy floor. The estimator (src/secret-strength.ts) alone,
 * then the real process: a production start refused for each, naming the
 * variable and never the secret; a start with random 32+ character secrets
 * serves and takes a payment.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { randomBytes } from 'node:crypto'
import { MIN_SECRET_BITS, secretBits, weakSecret } from '../../src/secret-strength'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { captureOutput, waitForListening } from '../support/process'
import { startProvider, type ProviderHandle } from '../support/server'

const PATTERNED = '0123456789abcdef0123456789abcdef0123456789abcdef'
const WORDS = 'correcthorsebatterystaplecorrecthorse'
const random = (bytes: number, encoding: 'hex' | 'base64url' | 'base64') => randomBytes(bytes).toString(encoding)

describe('the estimator', () => {
  test('refuses the issue\'s two secrets and the patterns the old floor caught', () => {
    for (const secret of [PATTERNED, WORDS, 'a'.repeat(32), 'abcd'.repeat(10), 'm'.repeat(40), 'passwordpasswordpasswordpassword1', 'qwertyuiopasdfghjklzxcvbnm1234567890'])
      expect({ secret, weak: weakSecret(secret) }).toEqual({ secret, weak: true })
  })

  test('takes random secrets of 32+ characters as generators make them: hex, base64url, base64, UUIDs', () => {
    const secrets = [
      ...Array.from({ length: 40 }, () => random(16, 'hex')), // openssl rand -hex 16: 32 characters
      ...Array.from({ length: 40 }, () => random(24, 'base64url')), // 32 characters
      ...Array.from({ length: 20 }, () => random(32, 'base64')), // openssl rand -base64 32
      ...Array.from({ length: 20 }, () => crypto.randomUUID()),
    ]
    for (const secret of secrets) expect({ secret, weak: weakSecret(secret) }).toEqual({ secret, weak: false })
    expect(Math.min(...secrets.map(secretBits))).toBeGreaterThan(MIN_SECRET_BITS)
  })
})

describe('a production start', () => {
  let db: TestDatabase
  let provider: ProviderHandle
  beforeAll(async () => {
    db = await createTestDatabase('secret_strength')
    provider = await startProvider()
  })
  afterAll(async () => {
    await provider?.stop()
    await db?.drop()
  })

  /** Everything production needs, on this test's database and provider (loopback: no TLS asked), each secret random. */
  const production = () => ({
    NODE_ENV: 'production',
    DATABASE_URL: db.url,
    PAYMENT_PROVIDER_URL: provider.url,
    API_KEYS: `acme:${random(24, 'base64url')}`,
    ADMIN_TOKEN: random(24, 'base64url'),
    METRICS_TOKEN: random(16, 'hex'),
  })

  /** The real process: its exit code once refused, or 'served' (then stopped) when it listened. */
  async function start(env: Record<string, string>) {
    const proc = Bun.spawn([process.execPath, 'src/main.ts'], {
      env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', HOST: '127.0.0.1', PORT: '0', TEST_ALLOW_PORT_0: '1', ...env },
      stdout: 'pipe',
      stderr: 'pipe',
    })
    const output = captureOutput(proc)
    const port = await waitForListening(proc, output, 20_000)
    if (port === undefined) {
      await proc.exited
      await output.ended
      return { code: proc.exitCode as number | 'served', port, output: output(), stop: async () => {} }
    }
    return { code: 'served' as const, port, output: output(), stop: async () => { proc.kill('SIGTERM'); await proc.exited } }
  }

  for (const [label, variable, override] of [
    ['an API key of a hex pattern repeated', 'API_KEYS', (env: Record<string, string>) => ({ ...env, API_KEYS: `acme:${PATTERNED}` })],
    ['an API key of dictionary words', 'API_KEYS', (env: Record<string, string>) => ({ ...env, API_KEYS: `acme:${WORDS}` })],
    ['an admin token of dictionary words', 'ADMIN_TOKEN', (env: Record<string, string>) => ({ ...env, ADMIN_TOKEN: WORDS })],
    ['a metrics token of a hex pattern repeated', 'METRICS_TOKEN', (env: Record<string, string>) => ({ ...env, METRICS_TOKEN: PATTERNED })],
  ] as const) {
    test(`refuses ${label}: exit 2, naming ${variable}, never the secret`, async () => {
      const started = await start(override(production()))
      await started.stop()
      expect({ code: started.code }).toEqual({ code: 2 })
      const lines = started.output.split('\n').filter((text) => text.startsWith('{')).map((text) => JSON.parse(text) as { msg: string; variable?: string })
      const refusal = lines.find((line) => line.msg.startsWith('configuration error: '))
      expect(refusal?.variable).toBe(variable)
      expect(started.output).not.toContain(PATTERNED)
      expect(started.output).not.toContain(WORDS)
    }, 30_000)
  }

  test('takes random 32+ character secrets: it serves, and the random API key pays', async () => {
    const env = production()
    const started = await start(env)
    try {
      expect(started.code).toBe('served')
      const paid = await fetch(`http://127.0.0.1:${started.port}/api/payments`, {
        method: 'POST',
        headers: { authorization: `Bearer ${env.API_KEYS.slice('acme:'.length)}`, 'content-type': 'application/json', 'idempotency-key': 'strong-1' },
        body: JSON.stringify({ amount: 100, currency: 'EUR', customer: 'cus_1' }),
      })
      expect(paid.status).toBe(201)
    } finally {
      await started.stop()
    }
  }, 30_000)
})
