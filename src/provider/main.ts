/**
 * The provider simulator as a process of its own, as `npm start` runs it:
 * a provider is another machine, so a crash of the service must not take the
 * provider's ledger (or its in-flight charges) with it, and vice versa.
 *
 * Prints exactly one line, `provider simulator listening on URL`, once it
 * accepts connections (spawn.ts waits for it). SIGTERM or SIGINT stops it, exit 0.
 * A bad setting exits 2 with a message naming the variable.
 */
import { ConfigError, loadConfig } from '../config'
import { isPortTaken, portTaken } from '../config/port-taken'
import { startSimulator } from './simulator'

/**
 * Only the simulator's own variables go to loadConfig: the rules for them stay
 * in one place (config.ts), while a setting only the service uses (API_KEYS
 * under NODE_ENV=production, DATABASE_URL, ...) cannot stop the simulator.
 */
const OWN_VARIABLES = [
  'PAYMENT_PROVIDER_PORT',
  'PAYMENT_PROVIDER_DELAY_MS',
  'PAYMENT_PROVIDER_FAILURE_RATE',
  'PAYMENT_PROVIDER_LOST_RESPONSE_RATE',
  'PAYMENT_PROVIDER_LEDGER',
  'TEST_ALLOW_PORT_0',
] as const

function settings(env: Record<string, string | undefined>) {
  const config = loadConfig(Object.fromEntries(OWN_VARIABLES.map((name) => [name, env[name]])))
  return {
    // Loopback unless asked: the simulator has no authentication. HOST is the service's, not ours.
    hostname: env.PAYMENT_PROVIDER_HOST?.trim() || '127.0.0.1',
    port: config.providerPort,
    ledgerPath: config.providerLedger,
    delayMs: config.providerDelayMs,
    failureRate: config.providerFailureRate,
    lostResponseRate: config.providerLostResponseRate,
  }
}

let options: ReturnType<typeof settings>
try {
  options = settings(process.env)
} catch (error) {
  if (!(error instanceof ConfigError)) throw error
  console.error(`provider simulator: ${error.message}`)
  process.exit(2)
}

const simulator = await startSimulator(options).catch((error: unknown) => {
  // A taken port is the operator's setting to change: named, with a free port, and exit 2 like any bad setting.
  if (isPortTaken(error)) {
    console.error(`provider simulator: ${portTaken('PAYMENT_PROVIDER_PORT', options.hostname, options.port).message}`)
    process.exit(2)
  }
  console.error(`provider simulator: cannot start on ${options.hostname}:${options.port} (ledger ${options.ledgerPath}): ${error instanceof Error ? error.message : String(error)}`)
  process.exit(1)
})
console.log(`provider simulator listening on ${simulator.url}`)

let stopping = false
for (const signal of ['SIGTERM', 'SIGINT'] as const) {
  process.on(signal, () => {
    if (stopping) return
    stopping = true
    void simulator.stop().then(() => process.exit(0), (error: unknown) => {
      console.error('provider simulator: stop failed:', error)
      process.exit(1)
    })
  })
}
