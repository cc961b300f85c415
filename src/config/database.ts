/**
 * Where the database and the provider are, and whether a connection to them
 * may cross the network in plain text (REQUIRE_TLS). A URL is never part of
 * a message: it may hold a password.
 */
import { splitHosts } from '../store/masked-url'
import { ConfigError, DEFAULT_EMBEDDED_DIR, type Env } from './constants'
import { flag, Problems, text } from './parse'
import type { Config } from './types'

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
  const problems = new Problems()
  const databaseUrl = problems.take(() => databaseUrlOf(env), undefined)
  const requireTls = problems.take(() => flag(env, 'REQUIRE_TLS'), false)
  const databasePgbouncer = problems.take(() => flag(env, 'DATABASE_PGBOUNCER'), false)
  const embeddedDir = text(env, 'EMBEDDED_PG_DIR') ?? DEFAULT_EMBEDDED_DIR
  const databasePlainText = databaseUrl !== undefined && plainTextDatabaseUrl(databaseUrl, env)
  if (options.tls !== false && requireTls && databasePlainText) problems.add(databasePlainTextRefused())
  problems.throwIfAny()
  return { databaseUrl, databasePgbouncer, embeddedDir, requireTls, databasePlainText }
}

function databaseUrlOf(env: Env): string | undefined {
  const databaseUrl = text(env, 'DATABASE_URL')
  if (databaseUrl !== undefined && !/^postgres(ql)?:\/\//.test(databaseUrl))
    throw new ConfigError('DATABASE_URL', 'must be a postgres:// or postgresql:// URL')
  // Parsed here, so a URL the driver cannot read stops the start naming the variable (not "Invalid URL" from deep inside).
  if (databaseUrl !== undefined && !URL.canParse(splitHosts(databaseUrl).single))
    throw new ConfigError('DATABASE_URL', 'is not a URL that parses (a password with @, / or : must be percent-encoded); not shown, it may hold a password')
  return databaseUrl
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
export function refusePlainText(database: DatabaseConfig, provider: URL | undefined): void {
  if (!database.requireTls) return
  const refused = [
    ...(database.databasePlainText ? [databasePlainTextRefused()] : []),
    ...(provider?.protocol === 'http:' && !isLoopback(provider.hostname) ? [providerPlainTextRefused()] : []),
  ]
  if (refused.length === 1) throw refused[0]!
  if (refused.length > 1) throw new ConfigError(refused[0]!.variable, `REQUIRE_TLS=1 refuses ${refused.length} plain-text connections:\n${refused.map((error) => `  ${error.message}`).join('\n')}`, refused)
}

export function providerUrl(env: Env): string | undefined {
  const raw = text(env, 'PAYMENT_PROVIDER_URL')
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
