/**
 * The gateway's settings, read once at start into one frozen object. The
 * settings it shares with `npm start` (HOST, PORT, DATABASE_URL and the
 * embedded database's, IDEMPOTENCY_TTL_SECONDS, IDEMPOTENCY_RETENTION_SECONDS,
 * MAX_BODY_BYTES) are read by their declarations (src/config/), with the
 * same bounds and refusals; its own are declared here. Every refusal of one
 * start is named at once.
 */
import { readFileSync } from 'node:fs'
import { ConfigError, DEFAULT_EMBEDDED_DIR, DEFAULT_HOST, DEFAULT_PORT, type Env } from '../config/constants'
import { loadDatabaseConfig, type DatabaseConfig } from '../config/database'
import { integer, port, Problems, text } from '../config/parse'
import { DEFAULT_UNREPLAYED_HEADERS } from './headers'
import { defaultTable, RouteError, routeTable, type GatewayRoute, type RouteDefaults } from './routes'

/**
 * 1 MiB: an answer is stored in its key's row and replayed from it (and from
 * the replay cache, 10,000 entries); a typical JSON answer is under 10 kB.
 * A larger one is answered and not stored (GATEWAY_MAX_STORED_BYTES).
 */
export const DEFAULT_MAX_STORED_BYTES = 1024 * 1024

/** The gateway's own settings, one sentence each (what `--help`-style docs would print). */
export const GATEWAY_SETTINGS = {
  UPSTREAM_URL: 'Base URL of the service behind the gateway (http or https): requests go there with their path and query. Required unless every route of GATEWAY_ROUTES names its upstream.',
  GATEWAY_ROUTES: 'Path of a JSON route table ({"routes": [{"path", "methods", "upstream", "ttlSeconds", "timeoutMs", "maxBodyBytes", "maxStoredBytes", "on4xx", "on5xx", "unknown"}]}); unset: POST and PATCH to any path, to UPSTREAM_URL.',
  GATEWAY_REQUIRE_KEY: '1: a POST or PATCH without Idempotency-Key (a method a route claims) is refused with 400 instead of forwarded untouched. Default 0.',
  GATEWAY_TENANT_HEADER: 'The request field whose digest scopes keys (the client credential). Default authorization.',
  GATEWAY_UNREPLAYED_HEADERS: `Comma-separated answer fields not stored, so not replayed (hop-by-hop ones never are). Default ${DEFAULT_UNREPLAYED_HEADERS.join(',')}.`,
  GATEWAY_MAX_STORED_BYTES: `Answers with a larger body are answered but not stored (the key is released, and counted). Default ${DEFAULT_MAX_STORED_BYTES}.`,
} as const

export interface GatewayConfig {
  readonly host: string
  readonly port: number
  /** The default route TTL, and what the operator tools apply (IDEMPOTENCY_TTL_SECONDS). */
  readonly ttlSeconds: number
  readonly retentionSeconds: number
  readonly database: DatabaseConfig
  readonly embeddedPort: number
  readonly embeddedPortChosen: boolean
  readonly embeddedDir: string
  readonly routes: readonly GatewayRoute[]
  /** Where unclaimed requests go: UPSTREAM_URL, else the first route's upstream. */
  readonly defaultUpstream: string
  readonly requireKey: boolean
  readonly tenantHeader: string
  readonly unreplayedHeaders: ReadonlySet<string>
}

const FIELD_NAME = /^[!#$%&'*+.^_`|~0-9a-z-]+$/

export function loadGatewayConfig(env: Env = process.env): GatewayConfig {
  const problems = new Problems()
  const take = problems.take.bind(problems)
  const ttlSeconds = take(() => integer(env, 'IDEMPOTENCY_TTL_SECONDS'), 30)
  const retentionSeconds = take(() => integer(env, 'IDEMPOTENCY_RETENTION_SECONDS'), 86_400)
  if (!problems.has('IDEMPOTENCY_TTL_SECONDS') && !problems.has('IDEMPOTENCY_RETENTION_SECONDS') && retentionSeconds < ttlSeconds)
    problems.add(new ConfigError('IDEMPOTENCY_RETENTION_SECONDS', `must be at least IDEMPOTENCY_TTL_SECONDS (${ttlSeconds}), got ${retentionSeconds}`))
  const maxBodyBytes = take(() => integer(env, 'MAX_BODY_BYTES'), 65_536)
  const database = take(() => loadDatabaseConfig(env, { tls: false }), { databaseUrl: undefined, databasePgbouncer: false, embeddedDir: DEFAULT_EMBEDDED_DIR, requireTls: false, databasePlainText: false })
  const listenPort = take(() => port(env, 'PORT'), DEFAULT_PORT) ?? DEFAULT_PORT
  const embeddedPort = take(() => port(env, 'EMBEDDED_PG_PORT'), 0) ?? 0
  const host = take(() => text(env, 'HOST'), DEFAULT_HOST) ?? DEFAULT_HOST

  const maxStoredBytes = take(() => wholeSetting(env, 'GATEWAY_MAX_STORED_BYTES', DEFAULT_MAX_STORED_BYTES, 0, 64 * 1024 * 1024), DEFAULT_MAX_STORED_BYTES)
  const upstream = take(() => upstreamUrl(env), undefined)
  const defaults: RouteDefaults = { upstream, ttlSeconds, maxBodyBytes, maxStoredBytes }
  const routesFile = env.GATEWAY_ROUTES?.trim()
  const routes = take(() => {
    try {
      if (!routesFile) {
        if (upstream === undefined) throw new ConfigError('UPSTREAM_URL', 'is required (the service to put the gateway in front of), e.g. http://127.0.0.1:8080')
        return defaultTable(defaults)
      }
      let json: unknown
      try {
        json = JSON.parse(readFileSync(routesFile, 'utf8'))
      } catch (error) {
        throw new RouteError(`cannot read ${routesFile} as JSON: ${error instanceof Error ? error.message : String(error)}`)
      }
      return routeTable(json, defaults)
    } catch (error) {
      if (error instanceof RouteError) throw new ConfigError('GATEWAY_ROUTES', error.message)
      throw error
    }
  }, [] as GatewayRoute[])
  const requireKey = take(() => wholeSetting(env, 'GATEWAY_REQUIRE_KEY', 0, 0, 1) === 1, false)
  const tenantHeader = take(() => fieldName(env, 'GATEWAY_TENANT_HEADER', 'authorization'), 'authorization')
  const unreplayed = take(() => fieldList(env, 'GATEWAY_UNREPLAYED_HEADERS', DEFAULT_UNREPLAYED_HEADERS), DEFAULT_UNREPLAYED_HEADERS)
  problems.throwIfAny()
  return Object.freeze({
    host,
    port: listenPort,
    ttlSeconds,
    retentionSeconds,
    database,
    embeddedPort,
    embeddedPortChosen: (env.EMBEDDED_PG_PORT ?? '').trim() !== '',
    embeddedDir: database.embeddedDir,
    routes,
    defaultUpstream: upstream ?? routes[0]!.upstream,
    requireKey,
    tenantHeader,
    unreplayedHeaders: new Set(unreplayed),
  })
}

function upstreamUrl(env: Env): string | undefined {
  const raw = env.UPSTREAM_URL?.trim()
  if (!raw) return undefined
  let url: URL
  try {
    url = new URL(raw)
  } catch {
    throw new ConfigError('UPSTREAM_URL', 'must be an http or https URL, e.g. http://127.0.0.1:8080')
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new ConfigError('UPSTREAM_URL', `must be http or https, got ${url.protocol}`)
  if (url.search || url.hash) throw new ConfigError('UPSTREAM_URL', 'must have no query or fragment')
  return url.toString().replace(/\/$/, '')
}

function wholeSetting(env: Env, name: string, fallback: number, min: number, max: number): number {
  const raw = env[name]?.trim()
  if (!raw) return fallback
  if (!/^\d+$/.test(raw) || Number(raw) < min || Number(raw) > max) throw new ConfigError(name, `must be a whole number from ${min} to ${max}, got ${JSON.stringify(raw.slice(0, 32))}`)
  return Number(raw)
}

function fieldName(env: Env, name: string, fallback: string): string {
  const raw = env[name]?.trim().toLowerCase()
  if (!raw) return fallback
  if (!FIELD_NAME.test(raw)) throw new ConfigError(name, 'must be a header field name')
  return raw
}

function fieldList(env: Env, name: string, fallback: readonly string[]): readonly string[] {
  const raw = env[name]
  if (raw === undefined || raw.trim() === '') return fallback
  const names = raw.split(',').map((part) => part.trim().toLowerCase()).filter(Boolean)
  if (names.some((field) => !FIELD_NAME.test(field))) throw new ConfigError(name, 'must be comma-separated header field names')
  return names
}
