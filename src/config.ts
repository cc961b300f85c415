/**
 * Configuration, read once from the environment into one frozen object.
 * A bad value stops the start with the variable's name: a silent default
 * would hide a typo until the first incident.
 */
import { DEFAULT_RETENTION_SECONDS, DEFAULT_TTL_SECONDS, MIN_TTL_SECONDS } from './core/policy'

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
/** Where the bundled provider simulator listens when PAYMENT_PROVIDER_URL is unset (SPEC). */
export const DEFAULT_PROVIDER_PORT = 3001
/** The simulator's durable ledger, relative to the working directory like the embedded data. */
export const DEFAULT_PROVIDER_LEDGER = '.data/provider/ledger.sqlite'

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
  readonly adminToken: string
  /** True when ADMIN_TOKEN was unset and a random one was made for this run. */
  readonly adminTokenGenerated: boolean
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
  /** The database gauges at /metrics are recomputed at most once per this many ms (METRICS_CACHE_MS). */
  readonly metricsCacheMs: number
  /** BENCH_BASELINE_ROUTE=1: `npm run bench` only; adds the yardstick routes, non-idempotent and naive check-then-insert (payments/bench-baseline.ts, bench-naive.ts). */
  readonly benchBaselineRoute: boolean
  /** How often each process runs the retention purge of completed keys (PURGE_INTERVAL_MS). */
  readonly purgeIntervalMs: number
  /** Data directory of the embedded PostgreSQL, used when DATABASE_URL is unset (EMBEDDED_PG_DIR, default .data/pg). */
  readonly embeddedDir: string
  /** Port of the embedded PostgreSQL (EMBEDDED_PG_PORT, default 54329, off the standard 5432). */
  readonly embeddedPort: number
  readonly production: boolean
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
    return { keys: new Map([['demo-key', 'demo']]), demo: true }
  }
  const keys = new Map<string, string>()
  for (const entry of raw.split(',')) {
    const match = /^([A-Za-z0-9_.-]{1,64}):([!-~]{1,256})$/.exec(entry.trim())
    if (!match) throw new ConfigError('API_KEYS', `every entry must be tenant:key (tenant of letters, digits, _ . -), got ${JSON.stringify(entry.trim())}`)
    const [, tenant, key] = match as unknown as [string, string, string]
    if (keys.has(key)) throw new ConfigError('API_KEYS', `the same key is given twice`)
    keys.set(key, tenant)
  }
  return { keys, demo: false }
}

function randomToken(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(24))
  return Buffer.from(bytes).toString('base64url')
}

/** Where the database is: the part of the configuration the operator CLI shares with the server. */
export interface DatabaseConfig {
  readonly databaseUrl: string | undefined
  readonly databasePgbouncer: boolean
}

/** DATABASE_URL and DATABASE_PGBOUNCER, validated as the server validates them (loadConfig calls this). */
export function loadDatabaseConfig(env: Env = process.env): DatabaseConfig {
  const databaseUrl = env.DATABASE_URL?.trim() || undefined
  if (databaseUrl !== undefined && !/^postgres(ql)?:\/\//.test(databaseUrl))
    throw new ConfigError('DATABASE_URL', 'must be a postgres:// or postgresql:// URL')
  return { databaseUrl, databasePgbouncer: integer(env, 'DATABASE_PGBOUNCER', 0, 0, 1) === 1 }
}

export function loadConfig(env: Env = process.env): Config {
  const production = env.NODE_ENV === 'production'
  const ttlSeconds = integer(env, 'IDEMPOTENCY_TTL_SECONDS', DEFAULT_TTL_SECONDS, MIN_TTL_SECONDS)
  const retentionSeconds = integer(env, 'IDEMPOTENCY_RETENTION_SECONDS', DEFAULT_RETENTION_SECONDS, 1)
  if (retentionSeconds < ttlSeconds)
    throw new ConfigError('IDEMPOTENCY_RETENTION_SECONDS', `must be at least IDEMPOTENCY_TTL_SECONDS (${ttlSeconds}), got ${retentionSeconds}`)
  const { keys, demo } = apiKeys(env, production)
  const adminToken = env.ADMIN_TOKEN
  if (adminToken !== undefined && adminToken !== '' && adminToken.length < 8)
    throw new ConfigError('ADMIN_TOKEN', 'must be at least 8 characters')
  const { databaseUrl, databasePgbouncer } = loadDatabaseConfig(env)
  return Object.freeze({
    databaseUrl,
    databasePgbouncer,
    host: env.HOST?.trim() || DEFAULT_HOST,
    port: integer(env, 'PORT', DEFAULT_PORT, 0, 65535) || badPort(env, 'PORT'),
    apiKeys: keys,
    demoKeys: demo,
    adminToken: adminToken || randomToken(),
    adminTokenGenerated: !adminToken,
    ttlSeconds,
    retentionSeconds,
    providerUrl: providerUrl(env),
    providerPort: integer(env, 'PAYMENT_PROVIDER_PORT', DEFAULT_PROVIDER_PORT, 0, 65535) || badPort(env, 'PAYMENT_PROVIDER_PORT'),
    providerDelayMs: integer(env, 'PAYMENT_PROVIDER_DELAY_MS', 0, 0),
    providerFailureRate: fraction(env, 'PAYMENT_PROVIDER_FAILURE_RATE'),
    providerLostResponseRate: fraction(env, 'PAYMENT_PROVIDER_LOST_RESPONSE_RATE'),
    providerLedger: env.PAYMENT_PROVIDER_LEDGER?.trim() || DEFAULT_PROVIDER_LEDGER,
    workers: integer(env, 'WORKERS', 1, 1, 256),
    maxBodyBytes: integer(env, 'MAX_BODY_BYTES', DEFAULT_MAX_BODY_BYTES, MIN_MAX_BODY_BYTES),
    metricsCacheMs: integer(env, 'METRICS_CACHE_MS', DEFAULT_METRICS_CACHE_MS, 0, 3_600_000),
    benchBaselineRoute: integer(env, 'BENCH_BASELINE_ROUTE', 0, 0, 1) === 1,
    purgeIntervalMs: integer(env, 'PURGE_INTERVAL_MS', DEFAULT_PURGE_INTERVAL_MS, 100, 86_400_000),
    embeddedDir: env.EMBEDDED_PG_DIR?.trim() || DEFAULT_EMBEDDED_DIR,
    embeddedPort: integer(env, 'EMBEDDED_PG_PORT', DEFAULT_EMBEDDED_PORT, 1, 65535),
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
  let url: URL
  try {
    url = new URL(raw)
  } catch {
    throw new ConfigError('PAYMENT_PROVIDER_URL', `must be an http:// or https:// URL, got ${JSON.stringify(raw)}`)
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:')
    throw new ConfigError('PAYMENT_PROVIDER_URL', `must be an http:// or https:// URL, got ${JSON.stringify(raw)}`)
  return raw.replace(/\/+$/, '')
}
