/**
 * loadConfig: the environment read once, by the declarations, into one
 * frozen object. Every refused setting of a start is named in that start
 * (Problems), each by its variable: a silent default would hide a typo until
 * the first incident, and one refusal per restart costs a restart per typo.
 */
import { isIP } from 'node:net'
import { isLoopback, loadDatabaseConfig, providerUrl, refusePlainText, type DatabaseConfig } from './database'
import { ConfigError, DEFAULT_HOST, DEFAULT_PORT, DEFAULT_PROVIDER_LEDGER, isProduction, type Env } from './constants'
import { describeNearMiss, nearMisses, nearMissRefusals } from './near-miss'
import { flag, fraction, integer, port, Problems, refuseRemoved, text } from './parse'
import { missingForProduction, refusePlainProvider } from './production'
import { apiKeys, operators, refuseSharedRoles, secret } from './secrets'
import type { Config } from './types'

export function loadConfig(env: Env = process.env): Config {
  const production = isProduction(env)
  const problems = new Problems()
  const take = problems.take.bind(problems)
  if (production) {
    const missing = missingForProduction(env)
    if (missing) problems.add(missing)
  }
  take(() => flag(env, 'TEST_ALLOW_PORT_0'), false)
  take(() => text(env, 'LOG_LEVEL'), undefined)
  const ttlSeconds = take(() => integer(env, 'IDEMPOTENCY_TTL_SECONDS'), 0)
  const retentionSeconds = take(() => integer(env, 'IDEMPOTENCY_RETENTION_SECONDS'), 0)
  if (!problems.has('IDEMPOTENCY_TTL_SECONDS') && !problems.has('IDEMPOTENCY_RETENTION_SECONDS') && retentionSeconds < ttlSeconds)
    problems.add(new ConfigError('IDEMPOTENCY_RETENTION_SECONDS', `must be at least IDEMPOTENCY_TTL_SECONDS (${ttlSeconds}), got ${retentionSeconds}`))
  const database: DatabaseConfig = take(() => loadDatabaseConfig(env, { tls: false }), { databaseUrl: undefined, databaseConnection: undefined, databasePgbouncer: false, embeddedDir: '', requireTls: false, databasePlainText: false })
  const provider = take(() => providerUrl(env), undefined)
  // Charges and the provider's credentials cross the network in it: in production only over TLS, or to this host (a sidecar that adds TLS).
  const providerAt = provider ? new URL(provider) : undefined
  // REQUIRE_TLS=1 first: it names the database and the provider together.
  take(() => refusePlainText(database, providerAt), undefined)
  if (production) take(() => refusePlainProvider(providerAt, isLoopback), undefined)
  const { keys, demo } = take(() => apiKeys(env, production), { keys: new Map<string, string>(), demo: false })
  const admins = take(() => operators(env, production), { operators: [], generated: undefined })
  const host = text(env, 'HOST') ?? DEFAULT_HOST
  const listenPort = take(() => port(env, 'PORT'), DEFAULT_PORT) ?? DEFAULT_PORT
  const metricsPort = take(() => port(env, 'METRICS_PORT'), undefined)
  if (metricsPort !== undefined && metricsPort === listenPort && !problems.has('PORT'))
    problems.add(new ConfigError('METRICS_PORT', `must differ from PORT (${listenPort}); leave it unset to serve /metrics on PORT`))
  const metricsToken = take(() => secret(env, 'METRICS_TOKEN', production), undefined)
  if (production && !problems.has('API_KEYS') && !problems.has('ADMIN_TOKEN') && !problems.has('ADMIN_TOKENS') && !problems.has('METRICS_TOKEN'))
    take(() => refuseSharedRoles(keys, admins.operators, metricsToken), undefined)
  const allowed = take(() => allowedHosts(env, host), { any: false, names: [] })
  const read = {
    trustProxy: take(() => integer(env, 'TRUST_PROXY'), 0),
    tenantRateLimit: take(() => integer(env, 'TENANT_RATE_LIMIT'), 0),
    tenantRateBurst: take(() => integer(env, 'TENANT_RATE_BURST'), 0),
    tenantMaxInFlight: take(() => integer(env, 'TENANT_MAX_IN_FLIGHT'), 0),
    authFailuresPerMinute: take(() => integer(env, 'AUTH_FAILURES_PER_MINUTE'), 0),
    providerPort: take(() => port(env, 'PAYMENT_PROVIDER_PORT'), 0) ?? 0,
    providerDelayMs: take(() => integer(env, 'PAYMENT_PROVIDER_DELAY_MS'), 0),
    providerFailureRate: take(() => fraction(env, 'PAYMENT_PROVIDER_FAILURE_RATE'), 0),
    providerLostResponseRate: take(() => fraction(env, 'PAYMENT_PROVIDER_LOST_RESPONSE_RATE'), 0),
    workers: take(() => integer(env, 'WORKERS'), 1),
    maxBodyBytes: take(() => integer(env, 'MAX_BODY_BYTES'), 0),
    replayCacheEntries: take(() => integer(env, 'REPLAY_CACHE_ENTRIES'), 0),
    metricsCacheMs: take(() => integer(env, 'METRICS_CACHE_MS'), 0),
    duplicateWindowSeconds: take(() => integer(env, 'METRICS_DUPLICATE_WINDOW_SECONDS'), 0),
    duplicateWindowKeys: take(() => integer(env, 'METRICS_DUPLICATE_WINDOW_KEYS'), 0),
    purgeIntervalMs: take(() => integer(env, 'PURGE_INTERVAL_MS'), 0),
    embeddedPort: take(() => port(env, 'EMBEDDED_PG_PORT'), 0) ?? 0,
  }
  take(() => refuseRemoved(env, 'BENCH_BASELINE_ROUTE'), undefined)
  // A near miss of a name is a setting the operator believes set: production refuses it, elsewhere a warning.
  const misses = nearMisses(env)
  if (production) for (const refusal of nearMissRefusals(env)) problems.add(refusal)
  problems.throwIfAny()
  return Object.freeze({
    databaseUrl: database.databaseUrl,
    databaseConnection: database.databaseConnection,
    databasePgbouncer: database.databasePgbouncer,
    host,
    port: listenPort,
    apiKeys: keys,
    demoKeys: demo,
    operators: Object.freeze(admins.operators),
    generatedAdminToken: admins.generated,
    allowedHosts: Object.freeze(allowed),
    metricsToken,
    metricsPort,
    metricsHost: text(env, 'METRICS_HOST') ?? host,
    ttlSeconds,
    retentionSeconds,
    providerUrl: provider,
    providerLedger: text(env, 'PAYMENT_PROVIDER_LEDGER') ?? DEFAULT_PROVIDER_LEDGER,
    ...read,
    embeddedDir: database.embeddedDir,
    embeddedPortChosen: (env.EMBEDDED_PG_PORT ?? '').trim() !== '',
    requireTls: database.requireTls,
    databasePlainText: database.databasePlainText,
    production,
    warnings: Object.freeze(misses.map(describeNearMiss)),
  })
}

/** Host names as ALLOWED_HOSTS lists them: `*`, or names (a leading dot: that domain and every name under it). */
function allowedHosts(env: Env, host: string): { any: boolean; names: string[] } {
  const raw = text(env, 'ALLOWED_HOSTS')
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
