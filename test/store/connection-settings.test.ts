/**
 * One reading of DATABASE_URL and the PG* variables (src/store/connection-settings.ts):
 * each spelling of a TLS mode to the mode it resolves to, each ambiguity
 * refused by its parameter's name, and the driver handed the resolved values
 * (the pools, the health probe and the migrations, against a recorder in front
 * of this machine's PostgreSQL, which has no TLS).
 */
import { afterAll, beforeAll, describe, expect, test } from 'bun:test'
import postgres from 'postgres'
import { loadDatabaseConfig } from '../../src/config'
import { ConnectionSettingsError, driverConnection, resolveConnection, type Env } from '../../src/store/connection-settings'
import { openPools } from '../../src/store/db'
import { DatabaseHealth } from '../../src/store/health'
import { checkSchema, migrateService } from '../../src/store/migrate'
import { createTestDatabase, type TestDatabase } from '../support/db'
import { startStartupRecorder, type StartupRecorder } from '../support/startup-recorder'

const BASE = 'postgres://app:pw-canary-77@db.internal:5432/payments'
const resolved = (query: string, env: Env = {}) => {
  const settings = resolveConnection(`${BASE}${query}`, env)
  return { mode: settings.sslmode as string, from: settings.sslmodeFrom as string, plainText: settings.plainText }
}
function refusal(url: string, env: Env = {}): ConnectionSettingsError {
  try {
    resolveConnection(url, env)
  } catch (error) {
    if (error instanceof ConnectionSettingsError) return error
    throw error
  }
  throw new Error(`not refused: ${url.replace(/:[^@/]*@/, ':***@')}`)
}

describe('each spelling that reaches the driver, to its mode', () => {
  // Catches: a spelling read otherwise than the driver reads it (the check's mode is the one the driver is given).
  test('in the URL', () => {
    const table: [query: string, mode: string, from: string][] = [
      ['', 'disable', 'default'],
      ['?sslmode=disable', 'disable', 'sslmode'], ['?sslmode=false', 'disable', 'sslmode'],
      ['?sslmode=prefer', 'prefer', 'sslmode'], ['?sslmode=allow', 'require', 'sslmode'],
      ['?sslmode=require', 'require', 'sslmode'], ['?sslmode=no-verify', 'require', 'sslmode'],
      ['?sslmode=verify-ca', 'verify-ca', 'sslmode'], ['?sslmode=verify-full', 'verify-full', 'sslmode'], ['?sslmode=true', 'verify-full', 'sslmode'],
      ['?ssl=false', 'disable', 'ssl'], ['?ssl=disable', 'disable', 'ssl'], ['?ssl=true', 'verify-full', 'ssl'], ['?ssl=require', 'require', 'ssl'],
      ['?ssl=prefer', 'prefer', 'ssl'], ['?ssl=verify-full', 'verify-full', 'ssl'],
      ['?sslrootcert=system', 'verify-full', 'sslrootcert'], ['?sslrootcert=system&sslmode=verify-full', 'verify-full', 'sslmode'],
      ['?sslmode=require&ssl=require', 'require', 'sslmode'], ['?ssl=true&sslmode=verify-full', 'verify-full', 'sslmode'],
      // Percent-encoded, as URLSearchParams (and so postgres.js) decodes it.
      ['?ssl%6Dode=require', 'require', 'sslmode'], ['?sslmode=verify%2Dfull', 'verify-full', 'sslmode'],
    ]
    for (const [query, mode, from] of table)
      expect({ query, ...resolved(query) }).toEqual({ query, mode, from, plainText: mode === 'disable' || mode === 'prefer' })
  })

  test('in the environment, where the URL names no mode; the URL wins over it', () => {
    expect(resolved('', { PGSSLMODE: 'require' })).toEqual({ mode: 'require', from: 'PGSSLMODE', plainText: false })
    expect(resolved('', { PGSSLMODE: ' verify-full ' })).toEqual({ mode: 'verify-full', from: 'PGSSLMODE', plainText: false })
    expect(resolved('', { PGSSL: 'require' })).toEqual({ mode: 'require', from: 'PGSSL', plainText: false })
    expect(resolved('', { PGSSL: 'true' })).toEqual({ mode: 'verify-full', from: 'PGSSL', plainText: false })
    // postgres.js alone takes PGSSL=disable (any string) for TLS with verification: it is given what the operator wrote.
    expect(resolved('', { PGSSL: 'disable' })).toEqual({ mode: 'disable', from: 'PGSSL', plainText: true })
    expect(resolved('', { PGSSLMODE: 'prefer', PGSSL: 'prefer' })).toEqual({ mode: 'prefer', from: 'PGSSLMODE', plainText: true })
    expect(resolved('', { PGSSLMODE: '', PGSSL: '' })).toEqual({ mode: 'disable', from: 'default', plainText: true })
    expect(resolved('?sslmode=disable', { PGSSLMODE: 'verify-full' })).toEqual({ mode: 'disable', from: 'sslmode', plainText: true })
    expect(resolved('?sslmode=require', { PGSSL: 'disable' })).toEqual({ mode: 'require', from: 'sslmode', plainText: false })
    expect(resolved('?sslrootcert=system', { PGSSLMODE: 'disable' })).toEqual({ mode: 'verify-full', from: 'sslrootcert', plainText: false })
  })

  // Catches: a check that disagrees with postgres.js where postgres.js's own reading is unambiguous.
  test('agrees with postgres.js\'s own reading of every URL it reads one way', () => {
    const driverMode = (url: string) => {
      const ssl = (postgres(url, { max: 1 }) as unknown as { options: { ssl: unknown } }).options.ssl
      return ssl === false ? 'plain' : ssl === 'prefer' ? 'prefer' : 'tls'
    }
    for (const query of ['', '?sslmode=disable', '?sslmode=false', '?sslmode=prefer', '?sslmode=require', '?sslmode=verify-ca', '?sslmode=verify-full', '?sslmode=true',
      '?sslmode=allow', '?sslmode=no-verify', '?ssl=false', '?ssl=disable', '?ssl=true', '?ssl=require', '?ssl=prefer', '?sslrootcert=system', '?sslmode=require&ssl=require']) {
      const { mode } = resolved(query)
      expect({ query, ours: mode === 'disable' ? 'plain' : mode === 'prefer' ? 'prefer' : 'tls' }).toEqual({ query, ours: driverMode(`${BASE}${query}`) })
    }
    // Where it is ambiguous, postgres.js takes the last and URLSearchParams.get the first: the two readings issue 41 saw differ.
    const repeated = `${BASE}?sslmode=require&sslmode=disable`
    expect([new URL(repeated).searchParams.get('sslmode'), driverMode(repeated)]).toEqual(['require', 'plain'])
  })
})

describe('an ambiguous or unread setting is refused, naming its parameter, never the URL', () => {
  // Catches: the bypass of issue 41.1, and every other way the check and the driver could read one URL two ways.
  test('repeated, conflicting, misspelt, empty or unknown', () => {
    const table: [query: string, env: Env, variable: string, parameter: string, says: RegExp][] = [
      ['?sslmode=require&sslmode=disable', {}, 'DATABASE_URL', 'sslmode', /gives sslmode more than once/],
      ['?sslmode=require&sslmode=require', {}, 'DATABASE_URL', 'sslmode', /gives sslmode more than once/],
      ['?ssl=true&ssl=false', {}, 'DATABASE_URL', 'ssl', /gives ssl more than once/],
      ['?sslmode=require&ssl%6Dode=disable', {}, 'DATABASE_URL', 'sslmode', /gives sslmode more than once/],
      ['?application_name=a&application_name=b', {}, 'DATABASE_URL', 'application_name', /gives application_name more than once/],
      ['?target_session_attrs=read-write&target_session_attrs=any', {}, 'DATABASE_URL', 'target_session_attrs', /more than once/],
      ['?sslmode=require&ssl=false', {}, 'DATABASE_URL', 'ssl', /sslmode=require and ssl=false \(disable\), which disagree/],
      ['?ssl=true&sslmode=disable', {}, 'DATABASE_URL', 'ssl', /sslmode=disable and ssl=true \(verify-full\), which disagree/],
      ['?sslmode=require&sslrootcert=system', {}, 'DATABASE_URL', 'sslrootcert', /sslrootcert=system \(verify-full\), which disagree/],
      ['?sslmode=disable&sslrootcert=system', {}, 'DATABASE_URL', 'sslrootcert', /which disagree/],
      ['?sslrootcert=/etc/ssl/ca.pem', {}, 'DATABASE_URL', 'sslrootcert', /postgres\.js does not read/],
      ['?SSLMODE=require', {}, 'DATABASE_URL', 'sslmode', /has SSLMODE, which the driver does not read/],
      ['?sslMode=disable', {}, 'DATABASE_URL', 'sslmode', /has sslMode/],
      ['?sslmode=', {}, 'DATABASE_URL', 'sslmode', /empty sslmode/],
      ['?ssl=', {}, 'DATABASE_URL', 'ssl', /empty ssl/],
      ['?sslmode=Require', {}, 'DATABASE_URL', 'sslmode', /value of sslmode that is not one of/],
      ['?sslmode=require%20', {}, 'DATABASE_URL', 'sslmode', /not one of/],
      ['?sslmode=constructor', {}, 'DATABASE_URL', 'sslmode', /not one of/],
      ['?ssl=__proto__', {}, 'DATABASE_URL', 'ssl', /not one of/],
      ['?sslcert=client.pem', {}, 'DATABASE_URL', 'sslcert', /postgres\.js does not read/],
      ['?channel_binding=require', {}, 'DATABASE_URL', 'channel_binding', /postgres\.js does not read/],
      ['?sslnegotiation=tls', {}, 'DATABASE_URL', 'sslnegotiation', /neither postgres nor direct/],
      ['?target_session_attrs=writable', {}, 'DATABASE_URL', 'target_session_attrs', /not one of/],
      ['?host=/var/run/postgresql', {}, 'DATABASE_URL', 'host', /both before its path and as \?host=/],
      ['?port=6432', {}, 'DATABASE_URL', 'port', /both after its host and as \?port=/],
      ['', { PGSSLMODE: 'require', PGSSL: 'disable' }, 'PGSSLMODE', 'PGSSL', /PGSSLMODE \(require\) and PGSSL \(disable\) disagree/],
      ['', { PGSSLMODE: 'on' }, 'PGSSLMODE', 'PGSSLMODE', /is not one of/],
      ['', { PGSSL: 'yes' }, 'PGSSL', 'PGSSL', /is not one of/],
      ['', { PGSSLNEGOTIATION: 'tls' }, 'PGSSLNEGOTIATION', 'sslnegotiation', /neither postgres nor direct/],
      ['', { PGTARGETSESSIONATTRS: 'writable' }, 'PGTARGETSESSIONATTRS', 'target_session_attrs', /not one of/],
    ]
    for (const [query, env, variable, parameter, says] of table) {
      const error = refusal(`${BASE}${query}`, env)
      expect({ query, variable: error.variable, parameter: error.parameter, says: says.test(error.message) }).toEqual({ query, variable, parameter, says: true })
      expect(error.message).not.toContain('pw-canary-77')
      expect(error.message).not.toContain('db.internal')
      expect(error.message).not.toContain('client.pem')
      expect(error.message).not.toContain('Require')
    }
  })

  test('the start check names them as configuration errors, by the variable', () => {
    expect(() => loadDatabaseConfig({ DATABASE_URL: `${BASE}?sslmode=require&sslmode=disable`, REQUIRE_TLS: '1' })).toThrow(/^DATABASE_URL: gives sslmode more than once/)
    expect(() => loadDatabaseConfig({ DATABASE_URL: `${BASE}?sslmode=require&sslmode=disable` })).toThrow(/^DATABASE_URL: gives sslmode more than once/)
    expect(() => loadDatabaseConfig({ DATABASE_URL: BASE, PGSSLMODE: 'require', PGSSL: 'disable' })).toThrow(/^PGSSLMODE: /)
    // The refusal REQUIRE_TLS=1 makes says which setting chose plain text.
    expect(() => loadDatabaseConfig({ DATABASE_URL: `${BASE}?sslmode=disable`, PGSSLMODE: 'verify-full', REQUIRE_TLS: '1' })).toThrow(/its sslmode makes it disable/)
    expect(() => loadDatabaseConfig({ DATABASE_URL: BASE, PGSSLMODE: 'prefer', REQUIRE_TLS: '1' })).toThrow(/PGSSLMODE makes it prefer/)
    expect(loadDatabaseConfig({ DATABASE_URL: BASE, PGSSLMODE: 'require', REQUIRE_TLS: '1' }).databaseConnection?.sslmode).toBe('require')
  })
})

describe('where the connection goes', () => {
  const where = (url: string, env: Env = {}) => {
    const settings = resolveConnection(url, env)
    return { hosts: settings.hosts.map(({ host, port }) => `${host}:${port}`), socket: settings.socket, leavesHost: settings.leavesHost }
  }

  test('hosts, ports, sockets and the variables postgres.js reads for them', () => {
    expect(where('postgres://app@db.internal/payments')).toEqual({ hosts: ['db.internal:5432'], socket: undefined, leavesHost: true })
    expect(where('postgres://app@127.0.0.1:6543/payments')).toEqual({ hosts: ['127.0.0.1:6543'], socket: undefined, leavesHost: false })
    expect(where('postgres://app@[::1]:5433/payments')).toEqual({ hosts: ['::1:5433'], socket: undefined, leavesHost: false })
    expect(where('postgres://app@localhost/payments')).toEqual({ hosts: ['localhost:5432'], socket: undefined, leavesHost: false })
    // A cluster: every host counts; a host without a port takes the first host's, as postgres.js does.
    expect(where('postgres://app@127.0.0.1:5433,db.internal/payments')).toEqual({ hosts: ['127.0.0.1:5433', 'db.internal:5433'], socket: undefined, leavesHost: true })
    expect(where('postgres://app@127.0.0.1:5432,127.0.0.2:5433/payments')).toEqual({ hosts: ['127.0.0.1:5432', '127.0.0.2:5433'], socket: undefined, leavesHost: false })
    // No host in the URL: ?host=, else PGHOST (and PGPORT), else localhost.
    expect(where('postgres:///payments?host=/var/run/postgresql')).toEqual({ hosts: ['/var/run/postgresql:5432'], socket: '/var/run/postgresql/.s.PGSQL.5432', leavesHost: false })
    expect(where('postgres://%2Fvar%2Frun%2Fpostgresql/payments')).toEqual({ hosts: ['/var/run/postgresql:5432'], socket: '/var/run/postgresql/.s.PGSQL.5432', leavesHost: false })
    expect(where('postgres:///payments?host=db.internal&port=6432')).toEqual({ hosts: ['db.internal:6432'], socket: undefined, leavesHost: true })
    expect(where('postgres:///payments', { PGHOST: 'db.internal', PGPORT: '6432' })).toEqual({ hosts: ['db.internal:6432'], socket: undefined, leavesHost: true })
    expect(where('postgres:///payments', { PGHOST: '/tmp' })).toEqual({ hosts: ['/tmp:5432'], socket: '/tmp/.s.PGSQL.5432', leavesHost: false })
    expect(where('postgres:///payments', {})).toEqual({ hosts: ['localhost:5432'], socket: undefined, leavesHost: false })
    expect(where('postgres:///payments', { PGHOST: '::1' })).toEqual({ hosts: ['::1:5432'], socket: undefined, leavesHost: false })
    // PGHOST is read only where the URL names no host, as postgres.js reads it.
    expect(where('postgres://app@127.0.0.1/payments', { PGHOST: 'db.internal' })).toEqual({ hosts: ['127.0.0.1:5432'], socket: undefined, leavesHost: false })
    // A host elsewhere named only by PGHOST needs TLS like any other (the check once took a URL without a host for local).
    expect(resolveConnection('postgres:///payments', { PGHOST: 'db.internal' }).plainText).toBe(true)
    expect(refusal('postgres:///payments', { PGHOST: '/tmp,db.internal' }).variable).toBe('PGHOST')
    expect(refusal('postgres:///payments', { PGPORT: 'five' }).variable).toBe('PGPORT')
  })

  test('the driver is given the resolved values, and a URL without them', () => {
    const tls = driverConnection(resolveConnection('postgres://app:pw@db.internal:5433,db2.internal:5434/payments?sslmode=require&target_session_attrs=read-write&application_name=x'))
    expect(tls).toEqual({
      url: 'postgres://app:pw@db.internal:5433/payments?application_name=x',
      options: { host: ['db.internal', 'db2.internal'], port: [5433, 5434], ssl: 'require', sslnegotiation: null, target_session_attrs: 'primary' },
    })
    expect(driverConnection(resolveConnection(`${BASE}?sslmode=disable`)).options.ssl).toBe(false)
    expect(driverConnection(resolveConnection(`${BASE}?sslmode=verify-ca`)).options.ssl).toBe('verify-full')
    expect(driverConnection(resolveConnection(`${BASE}?sslmode=prefer&sslnegotiation=direct`)).options).toMatchObject({ ssl: 'prefer', sslnegotiation: 'direct' })
    expect(driverConnection(resolveConnection(BASE, { PGSSLMODE: 'require', PGTARGETSESSIONATTRS: 'read-write' })).options).toMatchObject({ ssl: 'require', target_session_attrs: 'primary' })
    expect(driverConnection(resolveConnection('postgres:///payments?host=/tmp')).options).toMatchObject({ host: ['/tmp'], port: [5432], path: '/tmp/.s.PGSQL.5432' })
    // What postgres.js makes of it: the options win over anything in the URL or the environment.
    const { url, options } = driverConnection(resolveConnection(`${BASE}?sslmode=require`, {}))
    const parsed = (postgres(url, { ...(options as object), max: 1 }) as unknown as { options: { ssl: unknown; host: string[]; port: number[] } }).options
    expect({ ssl: parsed.ssl, host: parsed.host, port: parsed.port }).toEqual({ ssl: 'require', host: ['db.internal'], port: [5432] })
  })
})

/**
 * The driver's paths, in this process, against a recorder in front of this
 * machine's PostgreSQL (no TLS): a TLS mode sends an SSLRequest and never a
 * plain StartupMessage; disable sends the StartupMessage. The URL the
 * recorder gives is on 0.0.0.0: another host by its name.
 */
describe('the pools, the health probe and the migrations connect as resolved', () => {
  let db: TestDatabase
  let recorder: StartupRecorder
  beforeAll(async () => {
    db = await createTestDatabase('connection_settings')
    recorder = await startStartupRecorder(db.url)
  })
  afterAll(async () => {
    await recorder.stop()
    await db.drop()
  })
  const at = (query: string) => {
    const url = new URL(recorder.url)
    url.search = ''
    return resolveConnection(`${url.toString()}${query}`, {})
  }
  const seen = async (work: () => Promise<unknown>) => {
    const before = recorder.connections.length
    await work().catch(() => undefined)
    return recorder.connections.slice(before).map((kinds) => kinds[0])
  }
  const firstsOnly = (kinds: (string | undefined)[]) => [...new Set(kinds)]

  // Catches: a path of ours that lets postgres.js read the URL (or PGSSL) again instead of taking the resolved mode.
  test('openPools', async () => {
    for (const [query, first] of [['?sslmode=require', 'ssl-request'], ['?sslrootcert=system', 'ssl-request'], ['?sslmode=disable', 'startup']] as const) {
      const kinds = await seen(async () => {
        const pools = openPools(at(query), { shortMax: 1, workMax: 1, applicationName: 'test:tls' })
        try {
          await Promise.all([pools.short`select 1`, pools.work`select 1`])
        } finally {
          await pools.close(1)
        }
      })
      expect({ query, kinds: firstsOnly(kinds), count: kinds.length > 0 }).toEqual({ query, kinds: [first], count: true })
    }
  })

  test('the health probe', async () => {
    for (const [query, first, up] of [['?sslmode=require', 'ssl-request', false], ['?sslmode=disable', 'startup', true]] as const) {
      let answered: boolean | undefined
      const kinds = await seen(async () => {
        const health = new DatabaseHealth(at(query), 'test:tls-health')
        try {
          answered = await health.probe()
        } finally {
          await health.close()
        }
      })
      expect({ query, kinds: firstsOnly(kinds), up: answered }).toEqual({ query, kinds: [first], up })
    }
  })

  test('the migrations and the schema check', async () => {
    for (const [query, first] of [['?sslmode=require', 'ssl-request'], ['?ssl=true', 'ssl-request'], ['?sslmode=disable', 'startup']] as const) {
      const migrated = await seen(() => migrateService(at(query)))
      const checked = await seen(() => checkSchema(at(query), { prepare: false }))
      expect({ query, migrated: firstsOnly(migrated), checked: firstsOnly(checked) }).toEqual({ query, migrated: [first], checked: [first] })
    }
  })
})
