/**
 * The start's refusals, from a real `bun src/main.ts`: every bad value named
 * in one start, near misses of a name, a database it cannot reach, a port
 * that is taken; and `--help`, rendered from the declarations.
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import { chmodSync, mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { Subprocess } from 'bun'
import { SETTING_NAMES } from '../../src/config'
import { portIsFree } from '../../src/config/port-taken'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { captureOutput, spawnService } from '../support/process'
import { ADMIN_TOKEN, API_KEYS } from '../support/server'
import { waitFor } from '../support/wait'

/** A provider URL nothing listens on: a start that serves charges nothing, and needs no simulator. */
const NO_PROVIDER = 'http://127.0.0.1:9/'
const PASSWORD = 'canary-pw-5d1f'

/** Runs `command` with `env` over ours (undefined removes a variable) until it exits; its exit code and everything it printed. */
async function run(env: Record<string, string | undefined>, command = ['src/main.ts']): Promise<{ code: number; output: string }> {
  const merged = Object.fromEntries(Object.entries({ ...process.env, HOST: '127.0.0.1', ...env }).filter(([, value]) => value !== undefined)) as Record<string, string>
  const proc = Bun.spawn([process.execPath, ...command], { env: merged, stdout: 'pipe', stderr: 'pipe' })
  const output = captureOutput(proc)
  const code = await exited(proc, output)
  await output.ended
  return { code, output: output() }
}

async function exited(proc: Subprocess, output: () => string, timeoutMs = 20_000): Promise<number> {
  await waitFor(() => proc.exitCode !== null || proc.signalCode !== null, () => `the process to exit; it printed:\n${output()}`, timeoutMs).catch((error) => {
    proc.kill('SIGKILL')
    throw error
  })
  return proc.exitCode ?? 128
}

/** A port some other process (this test) holds. */
function holdPort(): { port: number; release(): void } {
  const listener = Bun.listen({ hostname: '127.0.0.1', port: 0, socket: { data() {} } })
  return { port: listener.port, release: () => listener.stop(true) }
}

/** The free port a refusal suggests for `variable`, e.g. `PORT=3002`. */
const suggested = (output: string, variable: string): number | undefined => {
  const found = new RegExp(`e\\.g\\. ${variable}=(\\d+)`).exec(output)?.[1]
  return found === undefined ? undefined : Number(found)
}

let db: TestDatabase
let ledgerDir: string
beforeAll(async () => {
  db = await createTestDatabase('config-start')
  ledgerDir = mkdtempSync(join(tmpdir(), 'idem-config-start-'))
}, 60_000)
afterAll(async () => {
  await db?.drop()
  if (ledgerDir) rmSync(ledgerDir, { recursive: true, force: true })
})

// Catches: a start that names one bad value, so each restart reveals the next.
test('every invalid setting is named in one start, each by its variable', async () => {
  const { code, output } = await run({ IDEMPOTENCY_TTL_SECONDS: 'abc', MAX_BODY_BYTES: '-5', PAYMENT_PROVIDER_FAILURE_RATE: '2', DATABASE_URL: db.url })
  expect(code).toBe(2)
  for (const variable of ['IDEMPOTENCY_TTL_SECONDS', 'MAX_BODY_BYTES', 'PAYMENT_PROVIDER_FAILURE_RATE']) expect(output).toContain(`${variable}: must`)
  expect(output).toContain('3 settings are refused')
  const line = JSON.parse(output.split('\n').find((text) => text.includes('configuration error'))!)
  expect([...line.variables].sort()).toEqual(['IDEMPOTENCY_TTL_SECONDS', 'MAX_BODY_BYTES', 'PAYMENT_PROVIDER_FAILURE_RATE'])
})

describe('a near miss of a setting\'s name', () => {
  // Catches: `DATABSE_URL=...` running silently on the default (the embedded database, a TTL of 30 s).
  test('outside production: the service starts and warns, naming the setting it probably means', async () => {
    const service = await spawnService({
      env: { DATABASE_URL: db.url, API_KEYS, ADMIN_TOKEN, NODE_ENV: 'test', PAYMENT_PROVIDER_URL: NO_PROVIDER, DATABSE_URL: 'postgres://elsewhere/db', IDEMPOTENCY_TTL_SECOND: '5' },
    })
    try {
      const warnings = service.output().split('\n').filter((line) => line.includes('"level":"warn"') && line.includes('is not a setting'))
      expect(warnings.some((line) => line.includes('DATABSE_URL') && line.includes('did you mean DATABASE_URL?'))).toBe(true)
      expect(warnings.some((line) => line.includes('IDEMPOTENCY_TTL_SECOND ') && line.includes('did you mean IDEMPOTENCY_TTL_SECONDS?'))).toBe(true)
      expect(service.output()).not.toContain('postgres://elsewhere')
    } finally {
      service.proc.kill('SIGTERM')
      await service.proc.exited
    }
  }, 30_000)

  // Catches: a production start on a default the operator believes overridden.
  test('in production (any letter case): the start is refused, naming the variable and the setting it probably means', async () => {
    const secret = () => crypto.randomUUID() + crypto.randomUUID()
    // A database nothing listens on: past the configuration, the start stops there (exit 1) instead of serving.
    const production = {
      NODE_ENV: 'Production', DATABASE_URL: 'postgres://127.0.0.1:1/none', PAYMENT_PROVIDER_URL: 'https://provider.example', API_KEYS: `acme:${secret()}`,
      ADMIN_TOKEN: secret(), METRICS_TOKEN: secret(),
    }
    const { code, output } = await run({ ...production, IDEMPOTENCY_TTL_SECOND: '5' })
    expect(code).toBe(2)
    expect(output).toContain('IDEMPOTENCY_TTL_SECOND: is not a setting')
    expect(output).toContain('did you mean IDEMPOTENCY_TTL_SECONDS?')
    // The same settings without the near miss pass the configuration (and go on to the database).
    const { code: cleanCode, output: clean } = await run(production)
    expect(cleanCode).toBe(1)
    expect(clean).toContain('DATABASE_URL: cannot reach the database')
    expect(clean).not.toContain('is not a setting')
    expect(clean).not.toContain('configuration error')
  }, 30_000)
})

describe('a database the start cannot reach', () => {
  // Catches: "connect ECONNREFUSED 127.0.0.1:1" with no setting named, or a message that prints the password.
  test('names DATABASE_URL by host, port and database (never the user or the password) and what to check', async () => {
    const held = holdPort()
    held.release() // free now: nothing listens on it
    const { code, output } = await run({ DATABASE_URL: `postgres://payer:${PASSWORD}@127.0.0.1:${held.port}/payments_db`, PAYMENT_PROVIDER_URL: NO_PROVIDER })
    expect(code).toBe(1) // not 2: a database down now may be up in a minute, so a supervisor restarts it
    expect(output).toContain(`DATABASE_URL: cannot reach the database at 127.0.0.1:${held.port}/payments_db (ECONNREFUSED)`)
    expect(output).toContain('is PostgreSQL running')
    expect(output).not.toContain(PASSWORD)
    expect(output).not.toContain('payer')
  }, 30_000)

  test('a database missing on a server that answers is said as such', async () => {
    const missing = new URL(db.url)
    missing.pathname = '/no_such_database_here'
    const { code, output } = await run({ DATABASE_URL: missing.toString(), PAYMENT_PROVIDER_URL: NO_PROVIDER })
    expect(code).toBe(1)
    expect(output).toContain('DATABASE_URL: cannot reach the database at')
    expect(output).toContain('/no_such_database_here (3D000): the database does not exist')
  }, 30_000)
})

describe('a port that is taken', () => {
  // Catches: EADDRINUSE without the setting, or a fix the operator must search a free port for.
  test('PORT: named, with a free port to set instead', async () => {
    const held = holdPort()
    try {
      const { code, output } = await run({ DATABASE_URL: db.url, PORT: String(held.port), PAYMENT_PROVIDER_URL: NO_PROVIDER, API_KEYS, ADMIN_TOKEN })
      expect(code).toBe(2)
      expect(output).toContain(`PORT: port ${held.port} on 127.0.0.1 is in use by another process`)
      const free = suggested(output, 'PORT')
      expect(free).toBeDefined()
      expect(free).not.toBe(held.port)
      expect(portIsFree('127.0.0.1', free!)).toBe(true)
    } finally {
      held.release()
    }
  }, 30_000)

  test('PAYMENT_PROVIDER_PORT (the simulator npm start runs): named, with a free port to set instead', async () => {
    const held = holdPort()
    try {
      const { code, output } = await run({
        DATABASE_URL: db.url, PORT: '0', TEST_ALLOW_PORT_0: '1', PAYMENT_PROVIDER_URL: undefined, PAYMENT_PROVIDER_PORT: String(held.port),
        PAYMENT_PROVIDER_LEDGER: join(ledgerDir, 'ledger.sqlite'), API_KEYS, ADMIN_TOKEN,
      })
      expect(code).toBe(2)
      expect(output).toContain(`PAYMENT_PROVIDER_PORT: port ${held.port} on 127.0.0.1 is in use by another process`)
      const free = suggested(output, 'PAYMENT_PROVIDER_PORT')
      expect(free).not.toBe(held.port)
      expect(portIsFree('127.0.0.1', free!)).toBe(true)
    } finally {
      held.release()
    }
  }, 30_000)

  test('EMBEDDED_PG_PORT, when chosen (no DATABASE_URL): named, with a free port to set instead', async () => {
    const held = holdPort()
    const dataDir = mkdtempSync(join(tmpdir(), 'idem-config-embedded-'))
    chmodSync(dataDir, 0o755) // the postgres user (when run as root) must reach it
    try {
      const { code, output } = await run({ DATABASE_URL: undefined, EMBEDDED_PG_PORT: String(held.port), EMBEDDED_PG_DIR: join(dataDir, 'pg'), PAYMENT_PROVIDER_URL: NO_PROVIDER })
      expect(code).toBe(2)
      expect(output).toContain(`EMBEDDED_PG_PORT: port ${held.port} on 127.0.0.1 is in use by another process`)
      const free = suggested(output, 'EMBEDDED_PG_PORT')
      expect(free).not.toBe(held.port)
      expect(portIsFree('127.0.0.1', free!)).toBe(true)
    } finally {
      held.release()
      rmSync(dataDir, { recursive: true, force: true })
    }
  }, 30_000)

  test('PAYMENT_PROVIDER_PORT, when the simulator itself finds it taken (run alone, or a race with the check)', async () => {
    const held = holdPort()
    try {
      const { code, output } = await run({ PAYMENT_PROVIDER_PORT: String(held.port), PAYMENT_PROVIDER_LEDGER: join(ledgerDir, 'alone.sqlite') }, ['src/provider/main.ts'])
      expect(code).toBe(2)
      expect(output).toContain(`PAYMENT_PROVIDER_PORT: port ${held.port} on 127.0.0.1 is in use`)
      expect(suggested(output, 'PAYMENT_PROVIDER_PORT')).toBeDefined()
    } finally {
      held.release()
    }
  }, 30_000)
})

test('--help lists every declared setting, and exits 0 without starting anything', async () => {
  const { code, output } = await run({ DATABASE_URL: 'postgres://127.0.0.1:1/none' }, ['src/main.ts', '--help'])
  expect(code).toBe(0)
  const listed = new Set([...output.matchAll(/^ {2}([A-Z][A-Z0-9_]+) {2}\(/gm)].map((match) => match[1]))
  expect(SETTING_NAMES.filter((name) => !listed.has(name))).toEqual([])
  expect(output).not.toContain('"level"')
})
