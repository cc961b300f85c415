/**
 * Configuration, read once from the environment into one frozen object.
 * A bad value stops the start with the variable's name: a silent default
 * would hide a typo until the first incident.
 */
import { isIP } from 'node:net'
import { credential, DEFAULT_OPERATOR, OPERATOR_NAME, tokenDigest, type OperatorCredential } from './credentials'
import { DEFAULT_RETENTION_SECONDS, DEFAULT_TTL_SECONDS, MIN_TTL_SECONDS } from './core/policy'
import { splitHosts } from './store/masked-url'

/** Listen address; loopback unless the operator opens it up. */
export const DEFAULT_HOST = '127.0.0.1'
export const DEFAULT_PORT = 3000
/** The key lifecycle defaults live with the rest of the policy (core/policy.ts); re-exported for existing importers. */
export { DEFAULT_RETENTION_SECONDS, DEFAULT_TTL_SECONDS }
/** 64 KiB: a payment is under 1 KiB; anything far larger is abuse. */
export const DEFAULT_MAX_BODY_BYTES = 65_536
export const MIN_MAX_BODY_BYTES = 1024
/** 5 s: see DEFAULT_GAUGE_CACHE_MS in metrics/gauges.ts for why. */
export const DEFAULT_METRICS_CACHE_MS = 5_000
/** One minute: expired keys are harmless (a claim treats them as new), so the purge need not hurry. */
export const DEFAULT_PURGE_INTERVAL_MS = 60_000
/** Relative to the working directory, like `npm start` is run from the checkout. */
export const DEFAULT_EMBEDDED_DIR = '.data/pg'
/** Off the standard 5432, so it never collides with a PostgreSQL already installed. */
export const DEFAULT_EMBEDDED_PORT = 54329
/** Where the bundled provider simulator listens when PAYMENT_PROVIDER_URL is unset (README, Configuration). */
export const DEFAULT_PROVIDER_PORT = 3001
/** The simulator's durable ledger, relative to the working directory like the embedded data. */
export const DEFAULT_PROVIDER_LEDGER = '.data/provider/ledger.sqlite'
/**
 * NODE_ENV=production: secrets (API keys, admin and metrics tokens) must be
 * at least this long. 32 random characters of the base64url alphabet are
 * 192 bits: out of reach of any guessing, throttled or not.
 */
export const MIN_PRODUCTION_SECRET_LENGTH = 32
/** Outside production a short admin token is only refused below this (a typo, not a choice). */
const MIN_DEV_TOKEN_LENGTH = 8
/**
 * The least a production secret's characters may carry, in bits: its length
 * times the Shannon entropy of its characters. 32 random base64url characters
 * give about 150, 32 random hex digits about 120; one letter repeated gives 0,
 * `abcd` repeated 64. A floor against a typed or patterned token, not a
 * proof of randomness.
 */
export const MIN_PRODUCTION_SECRET_BITS = 96

/** `secret`'s length times the Shannon entropy of its characters, in bits. */
export function secretBits(secret: string): number {
  const counts = new Map<string, number>()
  for (const char of secret) counts.set(char, (counts.get(char) ?? 0) + 1)
  let perChar = 0
  for (const count of counts.values()) {
    const p = count / secret.length
    perChar -= p * Math.log2(p)
  }
  return perChar * secret.length
}

const LOW_ENTROPY = `looks typed or patterned (fewer than ${MIN_PRODUCTION_SECRET_BITS} bits by its characters); NODE_ENV=production needs a random one, e.g. openssl rand -base64 32`
/** The key of the dev-only demo tenant, refused in production even when given explicitly. */
export const DEMO_API_KEY = 'demo-key'
/**
 * 100 requests per second per tenant and process, with bursts of 200: five
 * times the 1.7 s that 200 keys took in the attack this limit answers, and at
 * the default in-flight cap (64) a provider answering within 640 ms is never
 * the reason for a 429 (100/s × 0.64 s = 64 in flight).
 */
export const DEFAULT_TENANT_RATE_LIMIT = 100
export const DEFAULT_TENANT_RATE_BURST = 200
/**
 * 64 requests of one tenant in processing at once, per process: 8 times the
 * 8 connections of each pool (store/db.ts), so one tenant keeps every pool
 * busy only with requests it really has in flight, and a provider that hangs
 * (up to the TTL, 30 s) strands at most 64 of its requests, not thousands.
 */
export const DEFAULT_TENANT_MAX_IN_FLIGHT = 64

export interface Config {
  /** A real server's URL, or undefined for the embedded PostgreSQL. */
  readonly databaseUrl: string | undefined
  /** DATABASE_PGBOUNCER=1: DATABASE_URL is a PgBouncer in transaction mode: no prepared statements, no session settings as startup parameters (docs/scaling.md). */
  readonly databasePgbouncer: boolean
  readonly host: string
  readonly port: number
  /** API key → tenant. */
  readonly apiKeys: ReadonlyMap<string, string>
  /** True when API_KEYS was unset and the dev-only demo tenant is in use. */
  readonly demoKeys: boolean
  /** Who may use /admin (ADMIN_TOKENS and ADMIN_TOKEN): names and token hashes, never the tokens. */
  readonly operators: readonly OperatorCredential[]
  /** The random token of operator "admin" made for this run when no admin token is set (outside production only), to print once. */
  readonly generatedAdminToken: string | undefined
  /**
   * TRUST_PROXY: how many reverse proxies stand in front of the service (0:
   * none). With N > 0 the client address is the Nth X-Forwarded-For entry from
   * the right, and X-Forwarded-Proto: https makes cookies Secure and sends HSTS.
   */
  readonly trustProxy: number
  /** ALLOWED_HOSTS: Host names served besides IP literals and localhost (a defence against DNS rebinding); `any` for `*`. */
  readonly allowedHosts: { readonly any: boolean; readonly names: readonly string[] }
  /** METRICS_TOKEN: when set, /metrics needs `Authorization: Bearer <it>`. */
  readonly metricsToken: string | undefined
  /** METRICS_PORT: when set, /metrics is served there (on METRICS_HOST) and not on PORT. */
  readonly metricsPort: number | undefined
  readonly metricsHost: string
  /** TENANT_RATE_LIMIT: requests per second each tenant may send (per process); 0 is no limit. */
  readonly tenantRateLimit: number
  /** TENANT_RATE_BURST: how many requests a tenant may send at once above its rate. */
  readonly tenantRateBurst: number
  /** TENANT_MAX_IN_FLIGHT: requests of one tenant in processing at once (per process); 0 is no cap. */
  readonly tenantMaxInFlight: number
  /** Age after which a processing key whose owner is gone may be reclaimed. */
  readonly ttlSeconds: number
  /** How long a completed key is replayed. */
  readonly retentionSeconds: number
  /** Base URL of the payment provider, or undefined: `npm start` runs the bundled simulator. */
  readonly providerUrl: string | undefined
  /** Simulator only: where it listens when providerUrl is unset. */
  readonly providerPort: number
  /** Simulator only: latency of every charge. */
  readonly providerDelayMs: number
  /** Simulator only: share (0..1) of charges refused with a 5xx before anything is charged. */
  readonly providerFailureRate: number
  /** Simulator only: share (0..1) of charges made and recorded whose answer is lost (connection dropped). */
  readonly providerLostResponseRate: number
  /** Simulator only: its ledger file (PAYMENT_PROVIDER_LEDGER). */
  readonly providerLedger: string
  /** Server processes sharing the port. */
  readonly workers: number
  /** Larger request bodies get 413. */
  readonly maxBodyBytes: number
  /** Completed keys' answers each process keeps for replays that need no database (REPLAY_CACHE_ENTRIES; 0: none). */
  readonly replayCacheEntries: number
  /** The database gauges at /metrics are recomputed at most once per this many ms (METRICS_CACHE_MS). */
  readonly metricsCacheMs: number
  /** How often each process runs the retention purge of completed keys (PURGE_INTERVAL_MS). */
  readonly purgeIntervalMs: number
  /** Data directory of the embedded PostgreSQL, used when DATABASE_URL is unset (EMBEDDED_PG_DIR, default .data/pg). */
  readonly embeddedDir: string
  /** Wrong API keys or metrics tokens from one address within a minute before it gets 429 (AUTH_FAILURES_PER_MINUTE; 0: never throttled, still counted). */
  readonly authFailuresPerMinute: number
  /** Port of the embedded PostgreSQL (EMBEDDED_PG_PORT, default 54329, off the standard 5432). */
  readonly embeddedPort: number
  /** EMBEDDED_PG_PORT was set: a port taken by another server fails the start instead of moving to a free one. */
  readonly embeddedPortChosen: boolean
  /** REQUIRE_TLS=1: a database or provider connection that may cross the network in plain text refuses the start (else production warns about the database's). */
  readonly requireTls: boolean
  /** DATABASE_URL may cross the network in plain text (plainTextDatabaseUrl): a refusal with REQUIRE_TLS=1, a warning in production. */
  readonly databasePlainText: boolean
  readonly production: boolean
}

/**
 * BENCH_BASELINE_ROUTE=1 once added two non-idempotent routes to the service
 * (one charged twice for one body, in production too). They left it: the
 * bench's yardsticks are an app of their own (bench/naive-app.ts). A start
 * that still asks for them is refused, so a bench script of an older release
 * fails loudly instead of measuring routes that are not there.
 */
function refusedRemoved(env: Env): Record<string, never> {
  const raw = env.BENCH_BASELINE_ROUTE?.trim()
  if (raw && raw !== '0') throw new ConfigError('BENCH_BASELINE_ROUTE', 'was removed: the service has no yardstick routes any more (npm run bench runs bench/naive-app.ts beside it)')
  return {}
}

export class ConfigError extends Error {
  constructor(readonly variable: string, message: string) {
    super(`${variable}: ${message}`)
    this.name = 'ConfigError'
  }
}

type Env = Record<string, string | undefined>

function integer(env: Env, name: string, fallback: number, min: number, max = Number.MAX_SAFE_INTEGER): number {
  const raw = env[name]
  if (raw === undefined || raw === '') return fallback
  if (!/^-?\d+$/.test(raw.trim())) throw new ConfigError(name, `must be a whole number, got ${JSON.stringify(raw)}`)
  const value = Number(raw.trim())
  if (!Number.isSafeInteger(value) || value < min || value > max)
    throw new ConfigError(name, `must be between ${min} and ${max}, got ${raw}`)
  return value
}

function fraction(env: Env, name: string): number {
  const raw = env[name]
  if (raw === undefined || raw === '') return 0
  if (!/^\s*(\d+(\.\d*)?|\.\d+)\s*$/.test(raw)) throw new ConfigError(name, `must be a number from 0 to 1, got ${JSON.stringify(raw)}`)
  const value = Number(raw)
  if (value < 0 || value > 1) throw new ConfigError(name, `must be from 0 to 1, got ${raw}`)
  return value
}

function apiKeys(env: Env, production: boolean): { keys: Map<string, string>; demo: boolean } {
  const raw = env.API_KEYS
  if (raw === undefined || raw.trim() === '') {
    if (production) throw new ConfigError('API_KEYS', 'must be set when NODE_ENV=production (the demo key is dev-only)')
    return { keys: new Map([[DEMO_API_KEY, 'demo']]), demo: true }
  }
  const keys = new Map<string, string>()
  for (const [index, entry] of raw.split(',').entries()) {
    const match = /^([A-Za-z0-9_.-]{1,64}):([!-~]{1,256})$/.exec(entry.trim())
    // The entry is named by its position, never shown: it holds a key.
    if (!match) throw new ConfigError('API_KEYS', `every entry must be tenant:key (tenant of letters, digits, _ . -; key of 1 to 256 printable characters), entry ${index + 1} is not`)
    const [, tenant, key] = match as unknown as [string, string, string]
    if (keys.has(key)) throw new ConfigError('API_KEYS', `the same key is given twice`)
    if (production && key === DEMO_API_KEY) throw new ConfigError('API_KEYS', `tenant "${tenant}" has the demo key, which NODE_ENV=production refuses`)
    if (production && key.length < MIN_PRODUCTION_SECRET_LENGTH)
      throw new ConfigError('API_KEYS', `tenant "${tenant}"'s key is ${key.length} characters; NODE_ENV=production needs at least ${MIN_PRODUCTION_SECRET_LENGTH}`)
    if (production && secretBits(key) < MIN_PRODUCTION_SECRET_BITS) throw new ConfigError('API_KEYS', `tenant "${tenant}"'s key ${LOW_ENTROPY}`)
    keys.set(key, tenant)
  }
  return { keys, demo: false }
}

/**
 * ADMIN_TOKENS (`name:token,...`, a token also as `sha256:<hex>`) and
 * ADMIN_TOKEN (operator "admin"). Names and tokens must be distinct: the
 * token alone says who signs in.
 */
function operators(env: Env, production: boolean): { operators: OperatorCredential[]; generated: string | undefined } {
  const list: OperatorCredential[] = []
  const short = (variable: string, name: string, length: number) => {
    const min = production ? MIN_PRODUCTION_SECRET_LENGTH : MIN_DEV_TOKEN_LENGTH
    if (length < min)
      throw new ConfigError(variable, `operator "${name}"'s token is ${length} characters; ${production ? 'NODE_ENV=production needs' : 'the minimum is'} at least ${min}`)
  }
  const add = (variable: string, name: string, secret: string) => {
    const entry = credential(name, secret)
    if (!entry.hashed) short(variable, name, secret.length)
    if (!entry.hashed && production && secretBits(secret) < MIN_PRODUCTION_SECRET_BITS) throw new ConfigError(variable, `operator "${name}"'s token ${LOW_ENTROPY}`)
    if (list.some((other) => other.name === name)) throw new ConfigError(variable, `operator "${name}" is given twice`)
    if (list.some((other) => other.digest.equals(entry.digest))) throw new ConfigError(variable, `operator "${name}" has the same token as another operator`)
    list.push(entry)
  }
  const single = env.ADMIN_TOKEN?.trim()
  if (single) add('ADMIN_TOKEN', DEFAULT_OPERATOR, single)
  const named = env.ADMIN_TOKENS?.trim()
  if (named) {
    for (const [index, entry] of named.split(',').entries()) {
      const match = /^([^:]+):([!-~]{1,512})$/.exec(entry.trim())
      // Named by its position (and its operator, when that part is a name), never shown: it holds a token.
      if (!match || !OPERATOR_NAME.test(match[1]!)) {
        const name = /^([A-Za-z0-9_.@-]{1,40}):/.exec(entry.trim())?.[1]
        throw new ConfigError('ADMIN_TOKENS', `every entry must be name:token or name:sha256:<64 hex digits> (name of letters, digits, _ . @ -), entry ${index + 1}${name ? ` (operator "${name}")` : ''} is not`)
      }
      add('ADMIN_TOKENS', match[1]!, match[2]!)
    }
  }
  if (list.length > 0) return { operators: list, generated: undefined }
  if (production) throw new ConfigError('ADMIN_TOKEN', 'ADMIN_TOKEN or ADMIN_TOKENS must be set when NODE_ENV=production (no random token is made)')
  const generated = randomToken()
  return { operators: [credential(DEFAULT_OPERATOR, generated)], generated }
}

/** Host names as ALLOWED_HOSTS lists them: `*`, or names (a leading dot: that domain and every name under it). */
function allowedHosts(env: Env, host: string): { any: boolean; names: string[] } {
  const raw = env.ALLOWED_HOSTS?.trim()
  if (raw === '*') return { any: true, names: [] }
  const names = raw ? raw.split(',').map((name) => name.trim().toLowerCase()) : []
  for (const name of names) {
    if (!/^\.?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$/.test(name))
      throw new ConfigError('ALLOWED_HOSTS', `must be * or host names separated by commas (no port, no scheme), got ${JSON.stringify(name)}`)
  }
  // The listen address, when it is a name (an IP literal is always allowed).
  if (host && isIP(host) === 0 && !names.includes(host.toLowerCase())) names.push(host.toLowerCase())
  return { any: false, names }
}

function secret(env: Env, name: string, production: boolean): string | undefined {
  const raw = env[name]?.trim()
  if (!raw) return undefined
  const min = production ? MIN_PRODUCTION_SECRET_LENGTH : MIN_DEV_TOKEN_LENGTH
  if (raw.length < min || !/^[!-~]+$/.test(raw))
    throw new ConfigError(name, `must be at least ${min} printable characters${production ? ' when NODE_ENV=production' : ''}, got ${raw.length}`)
  if (production && secretBits(raw) < MIN_PRODUCTION_SECRET_BITS) throw new ConfigError(name, LOW_ENTROPY)
  return raw
}

/**
 * One secret in two roles (a tenant's API key that is also an operator's
 * token, or the metrics token): whoever holds it for one role holds the
 * other, and rotating it for one breaks the other. Compared by digest.
 */
function refuseSharedRoles(apiKeys: ReadonlyMap<string, string>, operators: readonly OperatorCredential[], metricsToken: string | undefined): void {
  const tenantOf = new Map([...apiKeys].map(([key, tenant]) => [tokenDigest(key).toString('hex'), tenant]))
  for (const operator of operators) {
    const tenant = tenantOf.get(operator.digest.toString('hex'))
    if (tenant !== undefined) throw new ConfigError(operator.name === DEFAULT_OPERATOR ? 'ADMIN_TOKEN' : 'ADMIN_TOKENS', `operator "${operator.name}"'s token is tenant "${tenant}"'s API key: one secret, one role`)
  }
  if (metricsToken === undefined) return
  const digest = tokenDigest(metricsToken).toString('hex')
  const tenant = tenantOf.get(digest)
  if (tenant !== undefined) throw new ConfigError('METRICS_TOKEN', `is tenant "${tenant}"'s API key: one secret, one role`)
  const operator = operators.find((candidate) => candidate.digest.toString('hex') === digest)
  if (operator) throw new ConfigError('METRICS_TOKEN', `is operator "${operator.name}"'s token: one secret, one role`)
}

function randomToken(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(24))
  return Buffer.from(bytes).toString('base64url')
}

/** Where the database is: the part of the configuration the operator CLI shares with the server. */
export interface DatabaseConfig {
  readonly databaseUrl: string | undefined
  readonly databasePgbouncer: boolean
  /** Data directory of the embedded PostgreSQL, used when DATABASE_URL is unset (EMBEDDED_PG_DIR, default .data/pg). */
  readonly embeddedDir: string
  /** REQUIRE_TLS=1 (see Config). */
  readonly requireTls: boolean
  /** DATABASE_URL reaches another host and nothing makes the driver use TLS (see plainTextDatabaseUrl). */
  readonly databasePlainText: boolean
}

/**
 * DATABASE_URL, DATABASE_PGBOUNCER, EMBEDDED_PG_DIR and REQUIRE_TLS, validated
 * as the server validates them: the CLI and `npm run migrate` call this too,
 * so REQUIRE_TLS=1 keeps them off a plain-text database as it keeps the server.
 * loadConfig passes `{ tls: false }` and judges the database and the provider together.
 */
export function loadDatabaseConfig(env: Env = process.env, options: { tls?: boolean } = {}): DatabaseConfig {
  const databaseUrl = env.DATABASE_URL?.trim() || undefined
  if (databaseUrl !== undefined && !/^postgres(ql)?:\/\//.test(databaseUrl))
    throw new ConfigError('DATABASE_URL', 'must be a postgres:// or postgresql:// URL')
  // Parsed here, so a URL the driver cannot read stops the start naming the variable (not "Invalid URL" from deep inside).
  if (databaseUrl !== undefined && !URL.canParse(splitHosts(databaseUrl).single))
    throw new ConfigError('DATABASE_URL', 'is not a URL that parses (a password with @, / or : must be percent-encoded); not shown, it may hold a password')
  const requireTls = integer(env, 'REQUIRE_TLS', 0, 0, 1) === 1
  const databasePlainText = databaseUrl !== undefined && plainTextDatabaseUrl(databaseUrl, env)
  if (options.tls !== false && requireTls && databasePlainText) throw databasePlainTextRefused()
  return { databaseUrl, databasePgbouncer: integer(env, 'DATABASE_PGBOUNCER', 0, 0, 1) === 1, embeddedDir: env.EMBEDDED_PG_DIR?.trim() || DEFAULT_EMBEDDED_DIR, requireTls, databasePlainText }
}

/** localhost, 127.0.0.0/8 or ::1: a connection that never leaves the host. */
export function isLoopback(hostname: string): boolean {
  const host = hostname.replace(/^\[|\]$/g, '').toLowerCase()
  return host === 'localhost' || host === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host)
}

/** The modes in which postgres.js speaks TLS or fails (prefer and allow fall back to plain text). */
const TLS_MODES = ['require', 'verify-ca', 'verify-full', 'true']

/**
 * Whether a connection to `url` may cross the network in plain text: a host
 * other than this one (every host of a multi-host URL; a Unix socket never
 * leaves it) and no TLS mode in the URL (`sslmode=`, `ssl=`,
 * `sslrootcert=system`) nor, where the URL names none, in PGSSL, which the
 * driver reads too. The URL is never part of a message: it may hold a password.
 */
export function plainTextDatabaseUrl(databaseUrl: string, env: Env = {}): boolean {
  const { hosts: listed, single } = splitHosts(databaseUrl)
  let url: URL
  try {
    url = new URL(single)
  } catch {
    return false
  }
  const hosts = (listed ?? url.host).split(',').map((host) => host.replace(/:\d+$/, ''))
  if (hosts.every(isLoopback) || url.hostname === '' || url.searchParams.get('host')?.startsWith('/')) return false
  if (url.searchParams.get('sslrootcert') === 'system') return false
  const mode = url.searchParams.get('sslmode') ?? url.searchParams.get('ssl') ?? env.PGSSL?.trim()
  return !(mode && TLS_MODES.includes(mode))
}

const DATABASE_PLAIN_TEXT = 'reaches another host without sslmode=require (or verify-ca, verify-full): keys, answers and payments may cross the network in plain text'
const databasePlainTextRefused = () => new ConfigError('DATABASE_URL', `${DATABASE_PLAIN_TEXT}, and REQUIRE_TLS=1 refuses that: add sslmode=verify-full (or require) to it, or unset REQUIRE_TLS`)
const providerPlainTextRefused = () => new ConfigError('PAYMENT_PROVIDER_URL', 'is plain http:// to another host (charges and the provider\'s credentials in plain text), and REQUIRE_TLS=1 refuses that: use https://, or http:// to this host (a sidecar that adds TLS)')

/**
 * The warning a production start without REQUIRE_TLS=1 gives for a database
 * reached in plain text, or undefined. Warned, not refused, by default: a
 * private network is a decision the operator may have made; REQUIRE_TLS=1
 * makes it a refusal (loadConfig).
 */
export function plainTextDatabase(config: Pick<Config, 'production' | 'databaseUrl'> & { readonly databasePlainText?: boolean }): string | undefined {
  if (!config.production || !config.databaseUrl || !(config.databasePlainText ?? plainTextDatabaseUrl(config.databaseUrl))) return undefined
  return `DATABASE_URL ${DATABASE_PLAIN_TEXT} (REQUIRE_TLS=1 refuses such a start)`
}

/**
 * REQUIRE_TLS=1: each connection that may cross the network in plain text,
 * named by its variable, all at once (fixing one and restarting to learn of
 * the next costs a restart).
 */
function refusePlainText(database: DatabaseConfig, provider: URL | undefined): void {
  if (!database.requireTls) return
  const refused = [
    ...(database.databasePlainText ? [databasePlainTextRefused()] : []),
    ...(provider?.protocol === 'http:' && !isLoopback(provider.hostname) ? [providerPlainTextRefused()] : []),
  ]
  if (refused.length === 1) throw refused[0]!
  if (refused.length > 1) throw new ConfigError(refused[0]!.variable, `REQUIRE_TLS=1 refuses ${refused.length} plain-text connections:\n${refused.map((error) => `  ${error.message}`).join('\n')}`)
}

/** NODE_ENV=production in any letter case (`Production` too): a near miss must not turn the checks off. */
export function isProduction(env: Env): boolean {
  return env.NODE_ENV?.trim().toLowerCase() === 'production'
}

/**
 * What production needs and a first deployment most often lacks, said all at
 * once: one start that names DATABASE_URL, the next PAYMENT_PROVIDER_URL, the
 * next API_KEYS... cost an operator a restart per setting.
 */
function missingForProduction(env: Env): ConfigError[] {
  const unset = (name: string) => !env[name]?.trim()
  return [
    ...(unset('DATABASE_URL') ? [new ConfigError('DATABASE_URL', 'must be set (the embedded PostgreSQL is for development)')] : []),
    ...(unset('PAYMENT_PROVIDER_URL') ? [new ConfigError('PAYMENT_PROVIDER_URL', 'must be set (the bundled simulator takes no real payments)')] : []),
    ...(unset('API_KEYS') ? [new ConfigError('API_KEYS', 'must be set (the demo key is dev-only)')] : []),
    ...(unset('ADMIN_TOKEN') && unset('ADMIN_TOKENS') ? [new ConfigError('ADMIN_TOKEN', 'ADMIN_TOKEN or ADMIN_TOKENS must be set (no random token is made)')] : []),
    ...(unset('METRICS_TOKEN') && unset('METRICS_PORT') ? [new ConfigError('METRICS_TOKEN', 'or METRICS_PORT must be set: /metrics (tenant names, volumes) is not served to anyone who asks')] : []),
  ]
}

export function loadConfig(env: Env = process.env): Config {
  const production = isProduction(env)
  if (production) {
    const missing = missingForProduction(env)
    if (missing.length > 1)
      throw new ConfigError(missing[0]!.variable, `NODE_ENV=production needs ${missing.length} more settings:\n${missing.map((error) => `  ${error.message}`).join('\n')}`)
  }
  const ttlSeconds = integer(env, 'IDEMPOTENCY_TTL_SECONDS', DEFAULT_TTL_SECONDS, MIN_TTL_SECONDS)
  const retentionSeconds = integer(env, 'IDEMPOTENCY_RETENTION_SECONDS', DEFAULT_RETENTION_SECONDS, 1)
  if (retentionSeconds < ttlSeconds)
    throw new ConfigError('IDEMPOTENCY_RETENTION_SECONDS', `must be at least IDEMPOTENCY_TTL_SECONDS (${ttlSeconds}), got ${retentionSeconds}`)
  const database = loadDatabaseConfig(env, { tls: false })
  const { databaseUrl, databasePgbouncer, embeddedDir } = database
  // Production runs on nothing made for a laptop: no embedded database (its superuser is postgres:postgres), no simulator taking "payments".
  if (production && !databaseUrl) throw new ConfigError('DATABASE_URL', 'must be set when NODE_ENV=production (the embedded PostgreSQL is for development)')
  const provider = providerUrl(env)
  if (production && !provider) throw new ConfigError('PAYMENT_PROVIDER_URL', 'must be set when NODE_ENV=production (the bundled simulator takes no real payments)')
  // Charges and the provider's credentials cross the network in it: in production only over TLS, or to this host (a sidecar that adds TLS).
  const providerAt = provider ? new URL(provider) : undefined
  // REQUIRE_TLS=1 first: it names the database and the provider together.
  refusePlainText(database, providerAt)
  if (production && providerAt?.protocol === 'http:' && !isLoopback(providerAt.hostname))
    throw new ConfigError('PAYMENT_PROVIDER_URL', 'must be https:// when NODE_ENV=production (plain http:// only to this host, e.g. a sidecar that adds TLS)')
  const { keys, demo } = apiKeys(env, production)
  const admins = operators(env, production)
  const host = env.HOST?.trim() || DEFAULT_HOST
  const port = integer(env, 'PORT', DEFAULT_PORT, 0, 65535) || badPort(env, 'PORT')
  const metricsPort = integer(env, 'METRICS_PORT', 0, 0, 65535) || undefined
  if (metricsPort !== undefined && metricsPort === port) throw new ConfigError('METRICS_PORT', `must differ from PORT (${port}); leave it unset to serve /metrics on PORT`)
  const metricsToken = secret(env, 'METRICS_TOKEN', production)
  if (production) refuseSharedRoles(keys, admins.operators, metricsToken)
  // /metrics names every tenant and its volumes: production serves it behind a token, or on a port of its own.
  if (production && metricsToken === undefined && metricsPort === undefined)
    throw new ConfigError('METRICS_TOKEN', 'or METRICS_PORT must be set when NODE_ENV=production: /metrics (tenant names, volumes) is not served to anyone who asks')
  return Object.freeze({
    databaseUrl,
    databasePgbouncer,
    host,
    port,
    apiKeys: keys,
    demoKeys: demo,
    operators: Object.freeze(admins.operators),
    generatedAdminToken: admins.generated,
    trustProxy: integer(env, 'TRUST_PROXY', 0, 0, 16),
    allowedHosts: Object.freeze(allowedHosts(env, host)),
    metricsToken,
    metricsPort,
    metricsHost: env.METRICS_HOST?.trim() || host,
    tenantRateLimit: integer(env, 'TENANT_RATE_LIMIT', DEFAULT_TENANT_RATE_LIMIT, 0, 1_000_000),
    tenantRateBurst: integer(env, 'TENANT_RATE_BURST', DEFAULT_TENANT_RATE_BURST, 1, 1_000_000),
    tenantMaxInFlight: integer(env, 'TENANT_MAX_IN_FLIGHT', DEFAULT_TENANT_MAX_IN_FLIGHT, 0, 1_000_000),
    authFailuresPerMinute: integer(env, 'AUTH_FAILURES_PER_MINUTE', 10, 0, 1_000_000),
    ttlSeconds,
    retentionSeconds,
    providerUrl: provider,
    providerPort: integer(env, 'PAYMENT_PROVIDER_PORT', DEFAULT_PROVIDER_PORT, 0, 65535) || badPort(env, 'PAYMENT_PROVIDER_PORT'),
    providerDelayMs: integer(env, 'PAYMENT_PROVIDER_DELAY_MS', 0, 0),
    providerFailureRate: fraction(env, 'PAYMENT_PROVIDER_FAILURE_RATE'),
    providerLostResponseRate: fraction(env, 'PAYMENT_PROVIDER_LOST_RESPONSE_RATE'),
    providerLedger: env.PAYMENT_PROVIDER_LEDGER?.trim() || DEFAULT_PROVIDER_LEDGER,
    workers: integer(env, 'WORKERS', 1, 1, 256),
    maxBodyBytes: integer(env, 'MAX_BODY_BYTES', DEFAULT_MAX_BODY_BYTES, MIN_MAX_BODY_BYTES),
    replayCacheEntries: integer(env, 'REPLAY_CACHE_ENTRIES', 10_000, 0, 1_000_000),
    metricsCacheMs: integer(env, 'METRICS_CACHE_MS', DEFAULT_METRICS_CACHE_MS, 0, 3_600_000),
    ...refusedRemoved(env),
    purgeIntervalMs: integer(env, 'PURGE_INTERVAL_MS', DEFAULT_PURGE_INTERVAL_MS, 100, 86_400_000),
    embeddedDir,
    embeddedPort: integer(env, 'EMBEDDED_PG_PORT', DEFAULT_EMBEDDED_PORT, 1, 65535),
    embeddedPortChosen: (env.EMBEDDED_PG_PORT ?? '').trim() !== '',
    requireTls: database.requireTls,
    databasePlainText: database.databasePlainText,
    production,
  })
}

/** Port 0 (any free port) is allowed only for tests, through the explicit TEST_ALLOW_PORT_0 switch. */
function badPort(env: Env, name: string): number {
  if (env.TEST_ALLOW_PORT_0 === '1') return 0
  throw new ConfigError(name, 'must be between 1 and 65535, got 0')
}

function providerUrl(env: Env): string | undefined {
  const raw = env.PAYMENT_PROVIDER_URL?.trim()
  if (!raw) return undefined
  // Never repeated in the message: it may carry the provider's credentials (user:password@, ?key=).
  let url: URL
  try {
    url = new URL(raw)
  } catch {
    throw new ConfigError('PAYMENT_PROVIDER_URL', 'must be an http:// or https:// URL; it does not parse (not shown: it may hold credentials)')
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:')
    throw new ConfigError('PAYMENT_PROVIDER_URL', `must be an http:// or https:// URL, got one with the scheme ${JSON.stringify(url.protocol.slice(0, 16))}`)
  return raw.replace(/\/+$/, '')
}
