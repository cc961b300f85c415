/**
 * `npm start`: the payments service. Starts the embedded PostgreSQL when
 * DATABASE_URL is unset, applies migrations, serves, and drains on SIGTERM or
 * SIGINT. With WORKERS>1 this process supervises N server processes that
 * share the port.
 */
import { ConfigError, loadConfig, type Config } from './config'
import { startEmbedded, type EmbeddedPostgres } from './store/embedded'
import { migrate } from './store/migrate'
import { runServer } from './lifecycle'
import { sharedPort, superviseWorkers } from './workers'

const WORKER_ENV = 'IDEMPOTENT_POST_WORKER'

function log(line: string): void {
  console.log(`[${new Date().toISOString()}] ${line}`)
}

async function main(): Promise<number> {
  let config: Config
  try {
    config = loadConfig()
  } catch (error) {
    if (error instanceof ConfigError) {
      console.error(`configuration error: ${error.message}`)
      return 2
    }
    throw error
  }

  // Until the server runs, a signal just stops the start.
  let stopping = false
  const early = () => { stopping = true }
  process.on('SIGTERM', early).on('SIGINT', early)

  let embedded: EmbeddedPostgres | undefined
  let url = config.databaseUrl
  if (!url) {
    embedded = await startEmbedded({ dir: config.embeddedDir, port: config.embeddedPort, log })
    url = embedded.url
    log(`embedded PostgreSQL ready (data in ${config.embeddedDir}, port ${config.embeddedPort})`)
  }
  try {
    const isWorker = process.env[WORKER_ENV] === '1'
    if (!isWorker) {
      const { applied, version } = await migrate(url)
      log(`schema at migration ${version}${applied ? ` (${applied} applied)` : ''}`)
    }
    process.off('SIGTERM', early).off('SIGINT', early)
    if (stopping) return 0
    if (config.workers > 1 && !isWorker) {
      const port = sharedPort(config.host, config.port)
      banner({ ...config, port }, url)
      const env = { ...process.env, DATABASE_URL: url, PORT: String(port), [WORKER_ENV]: '1' }
      return await superviseWorkers({ count: config.workers, env, log })
    }
    // A worker drains when its supervisor is gone (even SIGKILLed), instead of serving on orphaned.
    return await runServer(config, url, { log, watchParent: isWorker, onListening: isWorker ? undefined : (port) => banner({ ...config, port }, url!) })
  } finally {
    if (embedded) {
      await embedded.stop()
      log('embedded PostgreSQL stopped')
    }
  }
}

function banner(config: Config, databaseUrl: string): void {
  const base = `http://${config.host.includes(':') ? `[${config.host}]` : config.host}:${config.port}`
  const lines = [
    `payments API   ${base}/api/payments`,
    config.demoKeys ? `API key        demo-key (tenant "demo"; dev only: set API_KEYS for real use)` : `API keys       ${config.apiKeys.size} configured`,
    `admin          ${base}/admin`,
    config.adminTokenGenerated ? `admin token    ${config.adminToken} (random for this run: set ADMIN_TOKEN to keep one)` : `admin token    from ADMIN_TOKEN`,
    `metrics        ${base}/metrics`,
    `database       ${databaseUrl.replace(/\/\/([^:@/]+):[^@/]*@/, '//$1:***@')}`,
  ]
  console.log(lines.join('\n'))
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    console.error('failed to start:', error instanceof Error ? error.message : error)
    process.exit(1)
  },
)
