/**
 * NODE_ENV=production (any letter case) refuses every laptop default, naming
 * the variable: checked on loadConfig, then on the real process (`bun
 * src/main.ts`), which must exit 2 before starting anything (no embedded
 * database, no simulator, no listening socket).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import postgres from 'postgres'
import { createHash } from 'node:crypto'
import { ConfigError, loadConfig, loadDatabaseConfig, plainTextDatabase } from '../../src/config'
import { createTestDatabase } from '../support/db'
import { spawnService } from '../support/process'
import { startProvider } from '../support/server'
import { maskedUrl } from '../../src/store/masked-url'

/** A secret production takes: long, and random-looking (its characters carry well over 96 bits), the same for a tag every run. */
const LONG = (tag: string) => `${tag}-${createHash('sha256').update(tag).digest('base64url').slice(0, 40)}`
/** Everything production needs, valid. */
const PRODUCTION: Record<string, string> = {
  NODE_ENV: 'production',
  DATABASE_URL: 'postgres://app@db.internal:5432/payments',
  PAYMENT_PROVIDER_URL: 'https://provider.example',
  API_KEYS: `acme:${LONG('acme')},globex:${LONG('globex')}`,
  ADMIN_TOKEN: LONG('admin'),
  METRICS_TOKEN: LONG('metrics'),
}

function refusal(env: Record<string, string | undefined>): ConfigError | undefined {
  try {
    loadConfig(env)
    return undefined
  } catch (error) {
    if (error instanceof ConfigError) return error
    throw error
  }
}

const without = (name: string) => Object.fromEntries(Object.entries(PRODUCTION).filter(([key]) => key !== name))

/** Each laptop default, and the variable production names for it. */
const REFUSALS: [label: string, env: Record<string, string>, variable: string][] = [
  ['no DATABASE_URL (the embedded database)', without('DATABASE_URL'), 'DATABASE_URL'],
  ['no PAYMENT_PROVIDER_URL (the simulator)', without('PAYMENT_PROVIDER_URL'), 'PAYMENT_PROVIDER_URL'],
  ['no API_KEYS (the demo key)', without('API_KEYS'), 'API_KEYS'],
  ['no ADMIN_TOKEN (a random one printed)', without('ADMIN_TOKEN'), 'ADMIN_TOKEN'],
  ['an admin token of 8 characters', { ...PRODUCTION, ADMIN_TOKEN: '12345678' }, 'ADMIN_TOKEN'],
  ['an admin token of 31 characters', { ...PRODUCTION, ADMIN_TOKEN: 'a'.repeat(31) }, 'ADMIN_TOKEN'],
  ['a named operator\'s short token', { ...without('ADMIN_TOKEN'), ADMIN_TOKENS: `alice:${LONG('alice')},bob:short-token` }, 'ADMIN_TOKENS'],
  ['a 1-character API key', { ...PRODUCTION, API_KEYS: `acme:${LONG('acme')},globex:k` }, 'API_KEYS'],
  ['the demo key', { ...PRODUCTION, API_KEYS: 'demo:demo-key' }, 'API_KEYS'],
  ['the demo key under another tenant, among long ones', { ...PRODUCTION, API_KEYS: `acme:${LONG('acme')},globex:demo-key` }, 'API_KEYS'],
  ['a short METRICS_TOKEN', { ...PRODUCTION, METRICS_TOKEN: 'metrics' }, 'METRICS_TOKEN'],
  ['a public /metrics (no METRICS_TOKEN, no METRICS_PORT)', without('METRICS_TOKEN'), 'METRICS_TOKEN'],
  ['an admin token that is a tenant\'s API key', { ...PRODUCTION, ADMIN_TOKEN: LONG('acme') }, 'ADMIN_TOKEN'],
  ['a named operator\'s token that is a tenant\'s API key', { ...without('ADMIN_TOKEN'), ADMIN_TOKENS: `alice:${LONG('globex')}` }, 'ADMIN_TOKENS'],
  ['a METRICS_TOKEN that is a tenant\'s API key', { ...PRODUCTION, METRICS_TOKEN: LONG('acme') }, 'METRICS_TOKEN'],
  ['a METRICS_TOKEN that is the admin token', { ...PRODUCTION, METRICS_TOKEN: LONG('admin') }, 'METRICS_TOKEN'],
  ['an admin token of one letter 32 times', { ...PRODUCTION, ADMIN_TOKEN: 'a'.repeat(32) }, 'ADMIN_TOKEN'],
  ['an API key of a short pattern repeated', { ...PRODUCTION, API_KEYS: `acme:${'abcd'.repeat(10)}` }, 'API_KEYS'],
  ['a METRICS_TOKEN of one letter 40 times', { ...PRODUCTION, METRICS_TOKEN: 'm'.repeat(40) }, 'METRICS_TOKEN'],
  ['a provider over plain http:// to another host', { ...PRODUCTION, PAYMENT_PROVIDER_URL: 'http://provider.example' }, 'PAYMENT_PROVIDER_URL'],
  ['the bench routes (BENCH_BASELINE_ROUTE=1: a route that charged twice for one body; removed)', { ...PRODUCTION, BENCH_BASELINE_ROUTE: '1' }, 'BENCH_BASELINE_ROUTE'],
  ['a DATABASE_URL that does not parse (exited 1 with "Invalid URL")', { ...PRODUCTION, DATABASE_URL: 'postgres://app:p/ss@db.internal,db2.internal/payments' }, 'DATABASE_URL'],
  ['a database reached in plain text, with REQUIRE_TLS=1', { ...PRODUCTION, REQUIRE_TLS: '1' }, 'DATABASE_URL'],
  ['REQUIRE_TLS=yes (0 or 1 only)', { ...PRODUCTION, REQUIRE_TLS: 'yes' }, 'REQUIRE_TLS'],
  // REQUIRE_TLS holds whatever NODE_ENV says.
  ['outside production, a database reached in plain text, with REQUIRE_TLS=1', { DATABASE_URL: 'postgres://app@db.internal:5432/payments', REQUIRE_TLS: '1' }, 'DATABASE_URL'],
  ['outside production, a provider over plain http:// to another host, with REQUIRE_TLS=1', { DATABASE_URL: 'postgres://app@db.internal:5432/payments?sslmode=verify-full', PAYMENT_PROVIDER_URL: 'http://provider.example', REQUIRE_TLS: '1' }, 'PAYMENT_PROVIDER_URL'],
]

describe('loadConfig in production', () => {
  for (const [label, env, variable] of REFUSALS) {
    test(`refuses ${label}, naming ${variable}`, () => {
      const error = refusal(env)
      expect(error?.variable).toBe(variable)
      expect(error?.message).toStartWith(`${variable}: `)
    })
  }

  test('the demo key is refused as the demo key (and would be as too short anyway)', () => {
    expect(refusal({ ...PRODUCTION, API_KEYS: 'demo:demo-key' })?.message).toContain('the demo key')
  })

  test('NODE_ENV=Production, PRODUCTION and " production " are production too: no demo key, no embedded database', () => {
    for (const spelling of ['Production', 'PRODUCTION', ' production ']) {
      expect(refusal({ ...without('API_KEYS'), NODE_ENV: spelling })?.variable).toBe('API_KEYS')
      expect(refusal({ NODE_ENV: spelling })?.variable).toBe('DATABASE_URL')
    }
  })

  test('a complete production configuration starts, with operators by name, a token given by its hash, and nothing generated', () => {
    const bobToken = LONG('bob')
    const hash = createHash('sha256').update(bobToken).digest('hex')
    const config = loadConfig({ ...PRODUCTION, ADMIN_TOKENS: `alice:${LONG('alice')},bob:sha256:${hash}` })
    expect(config.production).toBe(true)
    expect(config.operators.map((operator) => operator.name)).toEqual(['admin', 'alice', 'bob'])
    expect(config.operators[2]!.digest.toString('hex')).toBe(hash)
    expect(config.generatedAdminToken).toBeUndefined()
    expect(config.demoKeys).toBe(false)
    // No plaintext token is kept in the configuration.
    expect(JSON.stringify(config)).not.toContain(LONG('alice'))
  })

  test('operators with the same name or the same token are refused: the token alone must say who signs in', () => {
    expect(refusal({ ...PRODUCTION, ADMIN_TOKENS: `alice:${LONG('one')},alice:${LONG('two')}` })?.variable).toBe('ADMIN_TOKENS')
    expect(refusal({ ...PRODUCTION, ADMIN_TOKENS: `alice:${LONG('same')},bob:${LONG('same')}` })?.variable).toBe('ADMIN_TOKENS')
    expect(refusal({ ...PRODUCTION, ADMIN_TOKENS: `admin:${LONG('other')}` })?.variable).toBe('ADMIN_TOKENS')
    expect(refusal({ ...PRODUCTION, ADMIN_TOKENS: 'alice' })?.variable).toBe('ADMIN_TOKENS')
    expect(refusal({ ...PRODUCTION, ADMIN_TOKENS: `<script>:${LONG('x')}` })?.variable).toBe('ADMIN_TOKENS')
  })

  test('outside production the laptop defaults stay: the demo key, a generated admin token, the embedded database', () => {
    const config = loadConfig({ NODE_ENV: 'development' })
    expect(config.demoKeys).toBe(true)
    expect(config.generatedAdminToken).toBeString()
    expect(config.databaseUrl).toBeUndefined()
  })
})

describe('the service in production', () => {
  const start = async (env: Record<string, string | undefined>) => {
    const proc = Bun.spawn([process.execPath, 'src/main.ts'], {
      // Only what the case sets: none of the test runner's DATABASE_URL or tokens.
      env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', HOST: '127.0.0.1', PORT: '0', TEST_ALLOW_PORT_0: '1', ...env } as Record<string, string>,
      stdout: 'pipe',
      stderr: 'pipe',
    })
    const [code, stdout, stderr] = await Promise.all([proc.exited, new Response(proc.stdout).text(), new Response(proc.stderr).text()])
    return { code, stdout, stderr }
  }

  test('every refusal stops the start with exit 2 and the variable\'s name, before anything starts', async () => {
    // Two starts at a time, not all 26: each is a Bun process loading the service. 26 at once coincided, in one
    // CI run, with the second in which the file beside this one saw 92 claims wait out their 5 s (test/run.ts).
    const results: ({ label: string; variable: string } & Awaited<ReturnType<typeof start>>)[] = []
    const queue = [...REFUSALS]
    await Promise.all([1, 2].map(async () => {
      for (let next = queue.shift(); next; next = queue.shift()) {
        const [label, env, variable] = next
        results.push({ label, variable, ...(await start(env)) })
      }
    }))
    for (const { label, variable, code, stdout, stderr } of results) {
      expect({ label, code }).toEqual({ label, code: 2 })
      // One JSON line on stderr (src/log.ts), its message naming the variable.
      const line = JSON.parse(stderr.trim()) as { level: string; msg: string; variable: string }
      expect({ label, level: line.level, msg: line.msg, variable: line.variable })
        .toEqual({ label, level: 'error', msg: expect.stringMatching(new RegExp(`^configuration error: ${variable}: `)), variable })
      // Nothing was started: no embedded PostgreSQL, no simulator, no banner.
      const said = stdout.split('\n').filter(Boolean).map((text) => (JSON.parse(text) as { msg: string }).msg)
      expect({ label, said }).toEqual({ label, said: said.filter((msg) => msg === 'stopped') })
    }
  }, 60_000)

  test('NODE_ENV=Production without API_KEYS does not fall back to the demo key', async () => {
    const { code, stderr } = await start({ ...without('API_KEYS'), NODE_ENV: 'Production' })
    expect(code).toBe(2)
    expect(stderr).toContain('API_KEYS')
    expect(stderr).not.toContain('demo-key (tenant')
  }, 30_000)
})

test('the banner masks userinfo found by URL parsing: with a user, without one; every query value (store/masked-url.ts, issue 41)', () => {
  expect(maskedUrl('postgres://postgres:postgres@127.0.0.1:54329/postgres')).toBe('postgres://***:***@127.0.0.1:54329/postgres')
  expect(maskedUrl('postgres://:secret@db.internal/payments')).toBe('postgres://:***@db.internal/payments')
  expect(maskedUrl('postgresql://app:p%40ss%3Aword@[::1]:5432/x?sslmode=require')).toBe('postgresql://***:***@[::1]:5432/x?sslmode=***')
  expect(maskedUrl('postgres://app@db/x?password=hunter2&sslmode=require')).toBe('postgres://***@db/x?password=***&sslmode=***')
  expect(maskedUrl('postgres://db.internal/payments')).toBe('postgres://db.internal/payments')
  for (const url of ['postgres://:secret@h/d', 'postgres://u:secret@h/d', 'postgres://u@h/d?password=secret', 'postgres://u:secret@']) expect(maskedUrl(url)).not.toContain('secret')
  // postgres.js's multi-host form (a Patroni cluster): the hosts kept, the userinfo masked.
  expect(maskedUrl('postgres://app:secret@10.0.0.1:5432,10.0.0.2:5433/pay?target_session_attrs=read-write'))
    .toBe('postgres://***:***@10.0.0.1:5432,10.0.0.2:5433/pay?target_session_attrs=***')
})

// Catches: the URL check refusing what postgres.js takes (a multi-host URL exited 2 at start, the Patroni paths with it).
test('a multi-host DATABASE_URL is a URL the service takes', () => {
  expect(() => loadDatabaseConfig({ DATABASE_URL: 'postgres://postgres@127.0.0.1:5432,127.0.0.1:5433/test?target_session_attrs=read-write' })).not.toThrow()
  expect(() => loadDatabaseConfig({ DATABASE_URL: 'postgres://u:p@ss@h/d' })).not.toThrow() // the last @ ends the user part, as for the driver
  expect(() => loadDatabaseConfig({ DATABASE_URL: 'postgres://u:p/ss@h1,h2/d' })).toThrow(/DATABASE_URL/)
})

// Catches: a first production start that names one missing setting per restart.
test('NODE_ENV=production with nothing set names every missing setting at once, never a secret', () => {
  let error: unknown
  try { loadConfig({ NODE_ENV: 'production' }) } catch (caught) { error = caught }
  expect(error).toBeInstanceOf(ConfigError)
  expect((error as ConfigError).variable).toBe('DATABASE_URL')
  const message = (error as Error).message
  for (const name of ['DATABASE_URL', 'PAYMENT_PROVIDER_URL', 'API_KEYS', 'ADMIN_TOKEN', 'METRICS_TOKEN']) expect(message).toContain(name)
  expect(message).toContain('needs 5 more settings')
  // One missing is said as before, on its own.
  let one: unknown
  try { loadConfig({ NODE_ENV: 'production', DATABASE_URL: 'postgres://db/x', PAYMENT_PROVIDER_URL: 'https://p.example', API_KEYS: `acme:${'k'.repeat(8)}${crypto.randomUUID()}`, ADMIN_TOKEN: crypto.randomUUID() + crypto.randomUUID() }) } catch (caught) { one = caught }
  expect((one as ConfigError).variable).toBe('METRICS_TOKEN')
  expect((one as Error).message).not.toContain('more settings')
})

// Catches: production charging over plain text, or a warning that cries wolf for a local or TLS connection.
test('plain text in production: a provider over http:// is refused but to this host; a database without sslmode is warned about', () => {
  expect(refusal({ ...PRODUCTION, PAYMENT_PROVIDER_URL: 'http://127.0.0.1:8443' })).toBeUndefined() // a sidecar adding TLS
  expect(refusal({ ...PRODUCTION, PAYMENT_PROVIDER_URL: 'http://localhost:8443' })).toBeUndefined()
  const warned = (url: string) => plainTextDatabase(loadConfig({ ...PRODUCTION, DATABASE_URL: url }))
  expect(warned('postgres://app@db.internal:5432/payments')).toContain('sslmode=require')
  expect(warned('postgres://app@10.0.0.1,10.0.0.2/payments?target_session_attrs=read-write')).toContain('plain text')
  for (const url of ['postgres://app@db.internal/payments?sslmode=require', 'postgres://app@db.internal/payments?sslmode=verify-full', 'postgres://app@127.0.0.1/payments', 'postgres://app@localhost/payments'])
    expect({ url, warning: warned(url) }).toEqual({ url, warning: undefined })
  expect(plainTextDatabase(loadConfig({ ...PRODUCTION, NODE_ENV: 'test' }))).toBeUndefined()
})

/**
 * REQUIRE_TLS=1 (issue 27: production "warns, or refuses with REQUIRE_TLS=1, on
 * plain-text connections"): what production warns about, and a provider over
 * plain http:// outside production, refuse the start, naming the variable to
 * fix and the setting that refused it, never the URL (it may hold a password).
 */
describe('REQUIRE_TLS=1', () => {
  const PASSWORD = 'pw-canary-4b1e'
  const tls = (env: Record<string, string>) => refusal({ ...PRODUCTION, REQUIRE_TLS: '1', ...env })

  // Catches: REQUIRE_TLS ignored, or a check that refuses a TLS or local connection (a start refused for nothing).
  test('refuses a database reached in plain text, whatever spells it; takes every TLS mode, this host and a socket', () => {
    for (const url of [
      `postgres://app:${PASSWORD}@db.internal:5432/payments`,
      'postgres://app@db.internal/payments?sslmode=prefer', // falls back to plain text
      'postgres://app@db.internal/payments?sslmode=disable',
      'postgres://app@127.0.0.1:5432,db.internal:5432/payments?target_session_attrs=read-write', // one host of a cluster elsewhere
      'postgres://app@10.0.0.7/payments?ssl=false',
    ]) {
      const error = tls({ DATABASE_URL: url })
      expect({ url, variable: error?.variable }).toEqual({ url, variable: 'DATABASE_URL' })
      expect(error!.message).toContain('REQUIRE_TLS=1')
      expect(error!.message).toContain('sslmode=verify-full')
      expect(error!.message).not.toContain(PASSWORD)
      expect(error!.message).not.toContain('db.internal')
    }
    for (const url of [
      'postgres://app@db.internal/payments?sslmode=require', 'postgres://app@db.internal/payments?sslmode=verify-ca',
      'postgres://app@db.internal/payments?sslmode=verify-full', 'postgres://app@db.internal/payments?ssl=true',
      'postgres://app@db.internal/payments?sslrootcert=system', 'postgres://app@127.0.0.1/payments', 'postgres://app@[::1]:5432/payments',
      'postgres://app@localhost/payments', 'postgres://app@127.0.0.1:5432,127.0.0.2:5433/payments', 'postgres:///payments?host=/var/run/postgresql',
    ]) expect({ url, refused: tls({ DATABASE_URL: url })?.message }).toEqual({ url, refused: undefined })
    // PGSSL, which the driver reads when the URL names no mode.
    expect(tls({ DATABASE_URL: 'postgres://app@db.internal/payments', PGSSL: 'require' })).toBeUndefined()
    expect(tls({ DATABASE_URL: 'postgres://app@db.internal/payments?sslmode=disable', PGSSL: 'require' })?.variable).toBe('DATABASE_URL')
  })

  test('outside production it refuses a provider over plain http:// to another host, never showing its credentials; this host is a sidecar', () => {
    const env = { DATABASE_URL: 'postgres://app@db.internal/payments?sslmode=require', REQUIRE_TLS: '1' }
    const error = refusal({ ...env, PAYMENT_PROVIDER_URL: `http://user:${PASSWORD}@provider.example/v1?key=${PASSWORD}` })
    expect(error?.variable).toBe('PAYMENT_PROVIDER_URL')
    expect(error!.message).toContain('REQUIRE_TLS=1')
    expect(error!.message).not.toContain(PASSWORD)
    expect(refusal({ ...env, PAYMENT_PROVIDER_URL: 'https://provider.example' })).toBeUndefined()
    expect(refusal({ ...env, PAYMENT_PROVIDER_URL: 'http://127.0.0.1:8443' })).toBeUndefined()
    // Without it, outside production, neither is refused.
    expect(refusal({ DATABASE_URL: 'postgres://app@db.internal/payments', PAYMENT_PROVIDER_URL: 'http://provider.example' })).toBeUndefined()
  })

  test('both at once are named at once, in production too', () => {
    for (const env of [{}, { ...PRODUCTION }]) {
      const error = refusal({ ...env, DATABASE_URL: 'postgres://app@db.internal/payments', PAYMENT_PROVIDER_URL: 'http://provider.example', REQUIRE_TLS: '1' })
      expect(error?.variable).toBe('DATABASE_URL')
      expect(error!.message).toContain('REQUIRE_TLS=1 refuses 2 plain-text connections')
      expect(error!.message).toContain('\n  DATABASE_URL: ')
      expect(error!.message).toContain('\n  PAYMENT_PROVIDER_URL: ')
    }
  })

  test('the CLI and npm run migrate read the database the same way: REQUIRE_TLS=1 keeps them off a plain-text one', () => {
    expect(() => loadDatabaseConfig({ DATABASE_URL: 'postgres://app@db.internal/payments', REQUIRE_TLS: '1' })).toThrow(/^DATABASE_URL: .*REQUIRE_TLS=1/)
    expect(loadDatabaseConfig({ DATABASE_URL: 'postgres://app@db.internal/payments' }).requireTls).toBe(false)
    expect(() => loadDatabaseConfig({ DATABASE_URL: 'postgres://app@db.internal/payments?sslmode=verify-full', REQUIRE_TLS: '1' })).not.toThrow()
  })

  test('production without it warns, and the warning says how to refuse', () => {
    expect(plainTextDatabase(loadConfig(PRODUCTION))).toContain('REQUIRE_TLS=1')
  })

  /**
   * A role whose password is the canary, made for these tests (the server's own superuser may have no
   * password, as on a trust-auth server, or a password that is also its name, as the embedded one's
   * `postgres:postgres`): the canary must reach the process, and must never come out of it.
   */
  const canaryRole = `tls_canary_${crypto.randomUUID().slice(0, 8)}`
  beforeAll(async () => {
    const admin = postgres(process.env.DATABASE_URL!, { max: 1, onnotice: () => undefined })
    await admin.unsafe(`create role ${canaryRole} login superuser password '${PASSWORD}'`)
    await admin.end()
  })
  afterAll(async () => {
    const admin = postgres(process.env.DATABASE_URL!, { max: 1, onnotice: () => undefined })
    await admin.unsafe(`drop role if exists ${canaryRole}`)
    await admin.end()
  })
  /** A host that is not loopback by its name but reaches this machine's PostgreSQL (Linux routes 0.0.0.0 to it), as the canary role. */
  const elsewhere = (url: string) => {
    const other = new URL(url)
    other.hostname = '0.0.0.0'
    other.username = canaryRole
    other.password = PASSWORD
    return other.toString()
  }
  const productionOn = (databaseUrl: string) => ({ ...PRODUCTION, DATABASE_URL: databaseUrl, PAYMENT_PROVIDER_URL: 'https://provider.invalid', HOST: '127.0.0.1', PORT: '0', TEST_ALLOW_PORT_0: '1' })

  test('the real process: production on a plain-text database warns once and serves; with REQUIRE_TLS=1 it exits 2 naming both, before anything starts; neither prints the password', async () => {
    const db = await createTestDatabase('require_tls')
    try {
      const { proc, url, output } = await spawnService({ env: { ...productionOn(elsewhere(db.url)), REQUIRE_TLS: undefined, PAYMENT_PROVIDER_PORT: undefined } })
      try {
        expect((await fetch(`${url}/healthz`)).status).toBe(200)
        const warnings = output().split('\n').filter((line) => line.includes('"level":"warn"') && line.includes('plain text'))
        expect(warnings).toHaveLength(1)
        expect(JSON.parse(warnings[0]!)).toMatchObject({ variable: 'DATABASE_URL', msg: expect.stringContaining('REQUIRE_TLS=1') })
      } finally {
        proc.kill('SIGTERM')
        await proc.exited
      }
      expect(output()).not.toContain(PASSWORD)

      const refused = Bun.spawn([process.execPath, 'src/main.ts'], {
        env: { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/tmp', ...productionOn(elsewhere(db.url)), REQUIRE_TLS: '1' },
        stdout: 'pipe',
        stderr: 'pipe',
        timeout: 20_000, // a start that is not refused serves until killed
      })
      const [code, stdout, stderr] = await Promise.all([refused.exited, new Response(refused.stdout).text(), new Response(refused.stderr).text()])
      expect(code).toBe(2)
      const line = JSON.parse(stderr.trim()) as { level: string; msg: string; variable: string }
      expect(line).toMatchObject({ level: 'error', variable: 'DATABASE_URL', msg: expect.stringMatching(/^configuration error: DATABASE_URL: .*REQUIRE_TLS=1/) })
      expect(stdout.split('\n').filter(Boolean).map((text) => (JSON.parse(text) as { msg: string }).msg).filter((msg) => msg !== 'stopped')).toEqual([])
      expect(`${stdout}${stderr}`).not.toContain(PASSWORD)
    } finally {
      await db.drop()
    }
  }, 60_000)

  test('the real process with REQUIRE_TLS=1 on this host\'s database and a provider over http:// on this host (a TLS sidecar) serves; the CLI refuses a plain-text database with exit 2', async () => {
    const db = await createTestDatabase('require_tls_local')
    const provider = await startProvider()
    try {
      const { proc, url } = await spawnService({ env: { DATABASE_URL: db.url, REQUIRE_TLS: '1', NODE_ENV: 'development', PAYMENT_PROVIDER_URL: provider.url, API_KEYS: 'acme:acme-key' } })
      try {
        expect((await fetch(`${url}/api/payments`, { method: 'POST', headers: { authorization: 'Bearer acme-key', 'content-type': 'application/json', 'idempotency-key': 'tls-1' }, body: '{"amount":100,"currency":"EUR","customer":"c"}' })).status).toBe(201)
      } finally {
        proc.kill('SIGTERM')
        await proc.exited
      }
      const cli = (databaseUrl: string) => Bun.spawnSync([process.execPath, 'src/cli.ts', 'counts'], { env: { ...process.env, DATABASE_URL: databaseUrl, REQUIRE_TLS: '1' }, stdout: 'pipe', stderr: 'pipe' })
      const refused = cli(elsewhere(db.url))
      expect(refused.exitCode).toBe(2)
      expect(refused.stderr.toString()).toMatch(/^idem: DATABASE_URL: .*REQUIRE_TLS=1/)
      expect(`${refused.stdout}${refused.stderr}`).not.toContain(PASSWORD)
      expect(cli(db.url).exitCode).toBe(0)
    } finally {
      await provider.stop()
      await db.drop()
    }
  }, 60_000)
})
