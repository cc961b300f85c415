/**
 * `npm start`: the payments service. Starts the embedded PostgreSQL when
 * DATABASE_URL is unset, applies migrations, starts the provider simulator
 * when PAYMENT_PROVIDER_URL is unset, serves, and drains on SIGTERM or
 * SIGINT. With WORKERS>1 this process supervises N server processes that
 * share the port (each runs this file too).
 *
 * A stop may come at any moment of the start: a rolling deploy stops a pod
 * that has just started. So the signal handlers are the first thing this file
 * runs (the rest is imported after them, dynamically: static imports would
 * load first), they stay until the exit, and every step of the start checks
 * them. What has started is stopped in reverse order, and the exit is 0.
 */
import type { Config } from './config'
// Before anything imports the database driver (bunfig.toml preloads it too, when run from the checkout).
import './store/driver-fixes'
import { createLogger, errorText, log } from './log'

const stop = new AbortController()
for (const signal of ['SIGTERM', 'SIGINT'] as const) {
  process.on(signal, () => {
    if (stop.signal.aborted) log.info(`${signal}: already stopping`, { signal })
    else stop.abort(signal)
  })
}

/** Set by the supervisor in its workers' environment, to its own pid. */
const WORKER_ENV = 'IDEMPOTENT_POST_WORKER'

/** Loaded with the config (store/masked-url.ts), before anything is printed. */
let maskedUrl: (url: string) => string = () => '(not shown)'

/**
 * A start that fails (bad configuration, nothing to serve) says so on stderr,
 * where an orchestrator and a person at the terminal look first; a JSON line
 * still, with the process's pid.
 */
const fatal = createLogger({ base: { pid: process.pid }, sink: (line) => { process.stderr.write(`${line}\n`) } })

/** For the modules that take a line printer (the embedded PostgreSQL's start): their lines as info lines. */
const info = (line: string): void => log.info(line)

async function main(): Promise<number> {
  const { ConfigError, DEFAULT_EMBEDDED_DIR, loadConfig } = await import('./config')
  maskedUrl = (await import('./store/masked-url')).maskedUrl
  let config: Config
  try {
    config = loadConfig()
  } catch (error) {
    if (error instanceof ConfigError) {
      fatal.error(`configuration error: ${error.message}`, configFields(error))
      return 2
    }
    throw error
  }
  const supervisorPid = Number(process.env[WORKER_ENV]) || undefined
  const isWorker = supervisorPid !== undefined
  const { plainTextDatabase } = await import('./config')
  const plainText = plainTextDatabase(config)
  if (plainText) log.warn(plainText, { variable: 'DATABASE_URL' })
  // Near misses of a setting's name (refused in production): said once, by the process the operator started.
  if (!isWorker) for (const warning of config.warnings) log.warn(warning, { variable: warning.split(' ')[0] })
  const { portTaken } = await import('./config/port-taken')
  // A free port suggested for a taken one is none of the others this start takes.
  const ours = [config.port, config.providerPort, config.embeddedPort, ...(config.metricsPort ? [config.metricsPort] : [])]

  /** Whether a signal came during the start; if so, say so (the caller then returns 0). */
  const stopped = (): boolean => {
    if (!stop.signal.aborted) return false
    log.info(`${String(stop.signal.reason)} during start-up: stopping`, { signal: String(stop.signal.reason) })
    return true
  }
  // What has started, stopped last-in first-out: the simulator after the service drained, the database last.
  const teardown: (() => Promise<void>)[] = []
  // Past this, the server or the supervisor owns the stop, and a failure is a failure.
  let serving = false
  try {
    if (stopped()) return 0
    let databaseUrl = config.databaseUrl
    if (!databaseUrl) {
      const { startEmbedded } = await import('./store/embedded')
      // An EMBEDDED_PG_DIR set by the operator is used as given; the default may move (see startEmbedded).
      const embedded = await startEmbedded({ dir: config.embeddedDir, port: config.embeddedPort, portChosen: config.embeddedPortChosen, relocate: config.embeddedDir === DEFAULT_EMBEDDED_DIR, log: info }).catch((error: unknown) => {
        // store/embedded.ts says a chosen port is taken in its own words: named here as the setting, with a free port.
        if (error instanceof Error && error.message.startsWith('EMBEDDED_PG_PORT:')) throw portTaken('EMBEDDED_PG_PORT', '127.0.0.1', config.embeddedPort, ours)
        throw error
      })
      teardown.push(async () => {
        if (await embedded.stop()) log.info('embedded PostgreSQL stopped')
        else log.info('embedded PostgreSQL left running: another process of this checkout still uses it')
      })
      databaseUrl = embedded.url
      log.info(`embedded PostgreSQL ready (data in ${embedded.dir}, port ${embedded.port})`)
      if (stopped()) return 0
    }
    // The first connection: a database the operator's DATABASE_URL cannot reach is named as that setting, with what to check.
    const { databaseUnreachable, isConnectFailure } = await import('./config/database-unreachable')
    const operatorsDatabase = config.databaseUrl
    const reaching = <T>(step: Promise<T>): Promise<T> => step.catch((error: unknown) => {
      throw operatorsDatabase !== undefined && isConnectFailure(error) ? databaseUnreachable(operatorsDatabase, error) : error
    })
    if (!isWorker && config.databasePgbouncer) {
      // No migrations through PgBouncer (store/migrate.ts checkSchema says why).
      const { checkSchema, describeVersions } = await import('./store/migrate')
      log.info(`schema at migrations ${describeVersions(await reaching(checkSchema(databaseUrl, { prepare: false })))} (checked; DATABASE_PGBOUNCER=1 does not migrate)`)
      if (stopped()) return 0
    } else if (!isWorker) {
      const { describeVersions, describeWaiting, migrateService } = await import('./store/migrate')
      const { applied, versions, adopted, pending, ahead } = await reaching(migrateService(databaseUrl))
      log.info(`schema at migrations ${describeVersions(versions)}${applied ? ` (${applied} applied)` : ''}${adopted ? ' (the single-line layout of earlier releases recorded in the new lines)' : ''}`, { migrations: versions, applied })
      if (ahead) log.info(`the database's schema is ahead of this release (${describeVersions(ahead)}) by online steps only: serving on it`, { ahead })
      for (const step of pending ?? []) {
        log.info(`contract step ${step.line} ${step.version} (${step.name}) waits: ${describeWaiting(step)} still serve; ` +
          'it runs at the next start or `npm run migrate` once they are gone (docs/how-to/upgrade.md)', { pending: step })
      }
      if (stopped()) return 0
    }
    // Never in a worker: its supervisor passes the URL of the one simulator.
    let providerUrl = config.providerUrl
    if (providerUrl === undefined) {
      const simulator = await startSimulator(config, ours)
      teardown.push(simulator.stop)
      providerUrl = simulator.url
      if (stopped()) return 0
    }
    const served: Config = { ...config, providerUrl }
    const simulated = config.providerUrl === undefined

    if (config.workers > 1 && !isWorker) {
      const { sharedPort, superviseWorkers } = await import('./workers')
      const port = sharedPort(config.host, config.port)
      banner({ ...served, port }, databaseUrl, simulated)
      // A random admin token made for this run is passed on, so every worker takes the one the banner prints.
      const env = {
        ...process.env, DATABASE_URL: databaseUrl, PORT: String(port), PAYMENT_PROVIDER_URL: providerUrl, [WORKER_ENV]: String(process.pid),
        ...(config.generatedAdminToken ? { ADMIN_TOKEN: config.generatedAdminToken } : {}),
      }
      serving = true
      return await superviseWorkers({ count: config.workers, env, log, stop: stop.signal })
    }
    const { runServer } = await import('./lifecycle')
    if (stopped()) return 0
    const url = databaseUrl
    // A worker drains when its supervisor is gone (even SIGKILLed), instead of serving on orphaned.
    serving = true
    return await runServer(served, url, {
      log,
      stop: stop.signal,
      ...(isWorker ? { watchParent: true, parentPid: supervisorPid } : { onListening: (port: number) => banner({ ...served, port }, url, simulated) }),
    })
  } catch (error) {
    // A child started during the start (initdb, the simulator) can receive a
    // signal sent to our group in the instant before it leaves it, and fail:
    // when a stop was asked for, that failure is the stop, and a clean one.
    // The child may even see that signal before our own handler has run (seen
    // once in six loaded runs: the simulator exited 130 first): give the
    // handler a moment to run before calling the start failed.
    if (!serving && !stop.signal.aborted && stopSignalOf(error)) {
      log.info(`a child of the start ended by ${stopSignalOf(error)}: waiting up to ${STOP_ARRIVES_MS / 1000} s for the stop it belongs to`)
      await stopArrives(STOP_ARRIVES_MS)
    }
    if (!serving && stop.signal.aborted) {
      log.info(`${String(stop.signal.reason)} during start-up: stopping (${errorText(error)})`, { signal: String(stop.signal.reason) })
      return 0
    }
    throw error
  } finally {
    for (const step of teardown.reverse()) {
      await step().catch((error: unknown) => log.error(`stop failed: ${errorText(error)}`, { error }))
    }
  }
}

/** 5 s: our handler runs within a turn or two of the event loop, even on a loaded machine; past this the child's stop was not ours. */
const STOP_ARRIVES_MS = 5_000

/** The signal a child started during the start ended by, when the error says (provider/spawn.ts). */
function stopSignalOf(error: unknown): string | undefined {
  const signal = (error as { stopSignal?: unknown } | null)?.stopSignal
  return typeof signal === 'string' ? signal : undefined
}

/** Resolves when a stop has been asked for, or after `ms`. */
async function stopArrives(ms: number): Promise<void> {
  if (stop.signal.aborted) return
  await new Promise<void>((resolve) => {
    const timer = setTimeout(done, ms)
    function done() {
      clearTimeout(timer)
      stop.signal.removeEventListener('abort', done)
      resolve()
    }
    stop.signal.addEventListener('abort', done, { once: true })
  })
}

/**
 * The bundled provider simulator, in a process group of its own: a Ctrl-C to
 * ours must not stop it before the service has drained; we stop it after.
 * The price, as with the embedded PostgreSQL: a SIGKILL of our group leaves it
 * running on its port. So first the simulators left on this ledger by a
 * killed service are stopped (provider/orphans.ts: per ledger, never another
 * checkout's; their ledger is durable, nothing is lost), and ours is recorded.
 */
async function startSimulator(config: Config, ours: readonly number[]): Promise<{ url: string; stop(): Promise<void> }> {
  const { spawnSimulator, STOP_GRACE_MS } = await import('./provider/spawn')
  const { orphanedSimulators, recordSimulator, stillRunning } = await import('./provider/orphans')
  const orphans = orphanedSimulators(config.providerLedger)
  if (orphans.length > 0) {
    log.warn(`stopping ${orphans.length} provider simulator(s) left running on this ledger by a killed service (pid ${orphans.map((o) => o.pid).join(', ')})`)
    const signal = (pid: number, name: NodeJS.Signals) => { try { process.kill(pid, name) } catch { /* gone */ } }
    for (const orphan of orphans) signal(orphan.pid, 'SIGTERM')
    for (const deadline = Date.now() + STOP_GRACE_MS; orphans.some(stillRunning) && Date.now() < deadline;) await Bun.sleep(50)
    for (const orphan of orphans.filter(stillRunning)) signal(orphan.pid, 'SIGKILL')
    // Gone means its sockets are closed: an exited process holds no port, even before it is reaped.
    for (const deadline = Date.now() + 1_000; orphans.some(stillRunning) && Date.now() < deadline;) await Bun.sleep(20)
  }
  const { simulatorEnv } = await import('./provider/simulator-env')
  // Said here, as the setting to change with a free port, rather than as the child's failure (it says so too, when it loses a race).
  const { portIsFree, portTaken } = await import('./config/port-taken')
  const host = process.env.PAYMENT_PROVIDER_HOST?.trim() || '127.0.0.1'
  if (config.providerPort !== 0 && !portIsFree(host, config.providerPort)) throw portTaken('PAYMENT_PROVIDER_PORT', host, config.providerPort, ours)
  const simulator = await spawnSimulator({ detached: true, env: simulatorEnv(config, process.env) })
  const forget = recordSimulator(config.providerLedger, simulator.proc.pid)
  return {
    url: simulator.url,
    async stop() {
      const code = await simulator.stop()
      forget()
      log.info(`provider simulator stopped${code === 0 ? '' : ` (exit ${code})`}`)
    },
  }
}

function banner(config: Config, databaseUrl: string, simulated: boolean): void {
  const base = `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${config.port}`
  const lines = [
    `payments API   ${base}/api/payments`,
    config.demoKeys ? `API key        demo-key (tenant "demo"; dev only: set API_KEYS for real use)` : `API keys       ${config.apiKeys.size} configured`,
    `admin          ${base}/admin`,
    config.generatedAdminToken
      ? `admin token    ${config.generatedAdminToken} (random for this run: set ADMIN_TOKEN or ADMIN_TOKENS to keep one)`
      : `admin token    from ADMIN_TOKEN/ADMIN_TOKENS, operators: ${config.operators.map((operator) => operator.name).join(', ')}`,
    `API docs       ${base}/docs (OpenAPI: ${base}/openapi.json)`,
    config.metricsPort !== undefined
      ? `metrics        http://${config.metricsHost.includes(':') ? `[${config.metricsHost}]` : config.metricsHost}:${config.metricsPort}/metrics${config.metricsToken ? ' (Bearer METRICS_TOKEN)' : ''}`
      : `metrics        ${base}/metrics${config.metricsToken ? ' (Bearer METRICS_TOKEN)' : ''}`,
    `database       ${maskedUrl(databaseUrl)}`,
    `provider       ${maskedUrl(config.providerUrl!)}${simulated ? ' (simulator; set PAYMENT_PROVIDER_URL for a real one)' : ''}`,
  ]
  // For a person at a terminal, so plain text: the only lines of ours that are not JSON.
  process.stdout.write(`${lines.join('\n')}\n`)
}

/** The log fields of a refusal: the variable, and every one when several are refused at once. */
function configFields(error: { variable: string; problems?: readonly { variable: string }[] }): Record<string, unknown> {
  return { variable: error.variable, ...(error.problems?.length ? { variables: error.problems.map((problem) => problem.variable) } : {}) }
}

// `--help`: every setting, rendered from its declaration; any other argument is refused (config/reference.ts).
const usageExit = process.argv.length > 2 ? (await import('./config/reference')).answerArguments(process.argv.slice(2)) : undefined
if (usageExit !== undefined) process.exit(usageExit)

main().then(
  (code) => {
    log.info('stopped', { exit_code: code })
    process.exit(code)
  },
  (error: unknown) => {
    // A port taken by another process is the operator's setting to change: exit 2 and name it, as for a bad value.
    const variable = (error as { variable?: unknown } | null)?.variable
    if (typeof variable === 'string') {
      fatal.error(`configuration error: ${errorText(error)}`, configFields(error as { variable: string }))
      process.exit(2)
    }
    const setting = (error as { setting?: unknown } | null)?.setting
    fatal.error(`failed to start: ${errorText(error)}`, { error, ...(typeof setting === 'string' ? { variable: setting } : {}) })
    process.exit(1)
  },
)
