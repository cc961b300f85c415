/**
 * `UPSTREAM_URL=http://127.0.0.1:8080 npm run gateway`: the idempotency
 * gateway in front of any HTTP service. As `npm start` does (src/main.ts):
 * the stop signals are caught first, the embedded PostgreSQL is started when
 * DATABASE_URL is unset, migrations are applied, then it serves until SIGTERM
 * or SIGINT and drains (gateway/lifecycle.ts); what started is stopped in
 * reverse order, the database last, and the exit is 0.
 */
import '../store/driver-fixes'
import { createLogger, errorText, log } from '../log'

const stop = new AbortController()
for (const signal of ['SIGTERM', 'SIGINT'] as const) {
  process.on(signal, () => {
    if (stop.signal.aborted) log.info(`${signal}: already stopping`, { signal })
    else stop.abort(signal)
  })
}

const fatal = createLogger({ base: { pid: process.pid }, sink: (line) => { process.stderr.write(`${line}\n`) } })

async function main(): Promise<number> {
  const { ConfigError, DEFAULT_EMBEDDED_DIR } = await import('../config/constants')
  const { loadGatewayConfig } = await import('./config')
  let config: ReturnType<typeof loadGatewayConfig>
  try {
    config = loadGatewayConfig()
  } catch (error) {
    if (error instanceof ConfigError) {
      fatal.error(`configuration error: ${error.message}`, { variable: error.variable })
      return 2
    }
    throw error
  }
  const stopped = () => stop.signal.aborted
  const teardown: (() => Promise<void>)[] = []
  try {
    if (stopped()) return 0
    let databaseUrl = config.database.databaseUrl
    if (!databaseUrl) {
      const { startEmbedded } = await import('../store/embedded')
      const embedded = await startEmbedded({
        dir: config.embeddedDir, port: config.embeddedPort, portChosen: config.embeddedPortChosen, relocate: config.embeddedDir === DEFAULT_EMBEDDED_DIR, log: (line) => log.info(line),
      })
      teardown.push(async () => {
        if (await embedded.stop()) log.info('embedded PostgreSQL stopped')
        else log.info('embedded PostgreSQL left running: another process of this checkout still uses it')
      })
      databaseUrl = embedded.url
      log.info(`embedded PostgreSQL ready (data in ${embedded.dir}, port ${embedded.port})`)
      if (stopped()) return 0
    }
    const { checkSchema, describeVersions, migrateService } = await import('../store/migrate')
    if (config.database.databasePgbouncer) {
      log.info(`schema at migrations ${describeVersions(await checkSchema(databaseUrl, { prepare: false }))} (checked; DATABASE_PGBOUNCER=1 does not migrate)`)
    } else {
      const { applied, versions } = await migrateService(databaseUrl)
      log.info(`schema at migrations ${describeVersions(versions)}${applied ? ` (${applied} applied)` : ''}`, { migrations: versions, applied })
    }
    if (stopped()) return 0
    const { runGateway } = await import('./lifecycle')
    const { maskedUrl } = await import('../store/masked-url')
    const url = databaseUrl
    return await runGateway(config, url, {
      log,
      stop: stop.signal,
      onListening: (port) => {
        const base = `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${port}`
        const lines = [
          `gateway        ${base} (POST and PATCH with an Idempotency-Key are claimed; the rest is forwarded untouched)`,
          ...config.routes.map((route) => `route          ${route.methods.join(',')} ${route.pattern} -> ${maskedUrl(route.upstream)} (ttl ${route.ttlSeconds} s, unknown outcome: ${route.unknown})`),
          `metrics        ${base}/_gateway/metrics`,
          `database       ${maskedUrl(url)}`,
        ]
        process.stdout.write(`${lines.join('\n')}\n`)
      },
    })
  } catch (error) {
    if (stop.signal.aborted) {
      log.info(`${String(stop.signal.reason)} during start-up: stopping (${errorText(error)})`)
      return 0
    }
    throw error
  } finally {
    for (const step of teardown.reverse()) await step().catch((error: unknown) => log.error(`stop failed: ${errorText(error)}`, { error }))
  }
}

main().then(
  (code) => {
    log.info('stopped', { exit_code: code })
    process.exit(code)
  },
  (error: unknown) => {
    const variable = (error as { variable?: unknown } | null)?.variable
    fatal.error(`failed to start: ${errorText(error)}`, { error, ...(typeof variable === 'string' ? { variable } : {}) })
    process.exit(typeof variable === 'string' ? 2 : 1)
  },
)
