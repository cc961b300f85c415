import { expect, test } from 'bun:test'
import { ConfigError, loadConfig } from '../src/config'

const refuses = (env: Record<string, string>, variable: string) => {
  let error: unknown
  try { loadConfig(env) } catch (e) { error = e }
  expect(error).toBeInstanceOf(ConfigError)
  expect((error as ConfigError).variable).toBe(variable)
}

test('defaults', () => {
  const config = loadConfig({})
  expect(config).toMatchObject({ host: '127.0.0.1', port: 3000, ttlSeconds: 30, retentionSeconds: 86400, workers: 1, maxBodyBytes: 65536, providerDelayMs: 0, providerFailureRate: 0, demoKeys: true })
  expect(config.apiKeys.get('demo-key')).toBe('demo')
  expect(config.generatedAdminToken!.length).toBeGreaterThanOrEqual(16)
  expect(config.operators.map((operator) => operator.name)).toEqual(['admin'])
  expect(Object.isFrozen(config)).toBe(true)
})

test('bad values stop the start, naming the variable', () => {
  refuses({ IDEMPOTENCY_TTL_SECONDS: '0' }, 'IDEMPOTENCY_TTL_SECONDS')
  refuses({ IDEMPOTENCY_TTL_SECONDS: '1.5' }, 'IDEMPOTENCY_TTL_SECONDS')
  refuses({ IDEMPOTENCY_TTL_SECONDS: '30s' }, 'IDEMPOTENCY_TTL_SECONDS')
  refuses({ IDEMPOTENCY_TTL_SECONDS: '60', IDEMPOTENCY_RETENTION_SECONDS: '59' }, 'IDEMPOTENCY_RETENTION_SECONDS')
  refuses({ PORT: '0' }, 'PORT')
  refuses({ PORT: '65536' }, 'PORT')
  refuses({ PORT: 'http' }, 'PORT')
  refuses({ WORKERS: '0' }, 'WORKERS')
  refuses({ PAYMENT_PROVIDER_FAILURE_RATE: '1.5' }, 'PAYMENT_PROVIDER_FAILURE_RATE')
  refuses({ PAYMENT_PROVIDER_FAILURE_RATE: '-0.1' }, 'PAYMENT_PROVIDER_FAILURE_RATE')
  refuses({ PAYMENT_PROVIDER_FAILURE_RATE: 'half' }, 'PAYMENT_PROVIDER_FAILURE_RATE')
  refuses({ PAYMENT_PROVIDER_DELAY_MS: '-1' }, 'PAYMENT_PROVIDER_DELAY_MS')
  refuses({ MAX_BODY_BYTES: '1023' }, 'MAX_BODY_BYTES')
  refuses({ API_KEYS: 'acme' }, 'API_KEYS')
  refuses({ API_KEYS: 'acme:k1,:k2' }, 'API_KEYS')
  refuses({ API_KEYS: 'acme:k1,globex:k1' }, 'API_KEYS')
  refuses({ NODE_ENV: 'production' }, 'DATABASE_URL')
  refuses({ DATABASE_URL: 'mysql://x' }, 'DATABASE_URL')
})

test('the yardstick routes left the service: asking for them is refused, in any mode (they charged twice for one body)', () => {
  refuses({ BENCH_BASELINE_ROUTE: '1' }, 'BENCH_BASELINE_ROUTE')
  expect(() => loadConfig({ BENCH_BASELINE_ROUTE: '0' })).not.toThrow()
})

test('valid values are taken as given', () => {
  const config = loadConfig({ API_KEYS: 'acme:k1, globex:k2', PORT: '8080', PAYMENT_PROVIDER_FAILURE_RATE: '0.25', IDEMPOTENCY_TTL_SECONDS: '5', IDEMPOTENCY_RETENTION_SECONDS: '5', ADMIN_TOKEN: 'a-long-token' })
  expect(config.apiKeys.get('k2')).toBe('globex')
  expect(config.port).toBe(8080)
  expect(config.providerFailureRate).toBe(0.25)
  expect(config.operators.map((operator) => operator.name)).toEqual(['admin'])
  expect(config.generatedAdminToken).toBeUndefined()
})

test('the service refuses to start on a bad value and names the variable', async () => {
  const proc = Bun.spawn([process.execPath, 'src/main.ts'], {
    env: { ...process.env, IDEMPOTENCY_TTL_SECONDS: 'soon', DATABASE_URL: 'postgres://127.0.0.1:1/none' },
    stdout: 'pipe',
    stderr: 'pipe',
  })
  expect(await proc.exited).toBe(2)
  expect(await new Response(proc.stderr).text()).toContain('IDEMPOTENCY_TTL_SECONDS')
})
