/**
 * The product's own processes for the scale scenarios: the provider simulator
 * (durable ledger in a temp file) and service instances, each in a process
 * group of its own and registered for cleanup. Plus the database checks every
 * scenario ends with: payments per key in the database, charges per key at
 * the provider.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import postgres from 'postgres'
import { spawnService } from '../../support/process'
import { bounded, freePort, killGroup, tempDir, track } from './processes'

export const API_KEY = 'acme-key'
export const TENANT = 'acme'
const ADMIN_TOKEN = 'test-admin-token-123'

export interface Provider {
  readonly url: string
  /** Its process (group leader). */
  readonly pid: number
  stop(): Promise<void>
  /** Every charge the provider recorded for `customer`. */
  charges(customer: string): Promise<Charge[]>
  /** Every charge the provider recorded, in one listing. */
  allCharges(): Promise<Charge[]>
}

export interface Charge {
  readonly id: string
  readonly amount: number
  readonly currency: string
  readonly customer: string
}

export async function startProvider(delayMs: number): Promise<Provider> {
  const { spawnSimulator } = await import('../../../src/provider/spawn')
  const dir = tempDir('provider')
  const simulator = await spawnSimulator({
    detached: true,
    quiet: true,
    env: {
      PAYMENT_PROVIDER_PORT: '0',
      TEST_ALLOW_PORT_0: '1',
      PAYMENT_PROVIDER_DELAY_MS: String(delayMs),
      PAYMENT_PROVIDER_FAILURE_RATE: '0',
      PAYMENT_PROVIDER_LOST_RESPONSE_RATE: '0',
      PAYMENT_PROVIDER_LEDGER: join(dir, 'ledger.sqlite'),
    },
  } as Parameters<typeof spawnSimulator>[0])
  track(simulator.proc.pid)
  return {
    url: simulator.url,
    pid: simulator.proc.pid,
    async stop() { await simulator.stop() },
    async charges(customer) {
      const response = await fetch(`${simulator.url}/v1/charges?customer=${encodeURIComponent(customer)}`)
      if (!response.ok) throw new Error(`GET /v1/charges: ${response.status} ${await response.text()}`)
      return ((await response.json()) as { data: Charge[] }).data
    },
    async allCharges() {
      const response = await fetch(`${simulator.url}/v1/charges`)
      if (!response.ok) throw new Error(`GET /v1/charges: ${response.status} ${await response.text()}`)
      return ((await response.json()) as { data: Charge[] }).data
    },
  }
}

/**
 * Whether the service calls the provider yet (the engine that does is
 * landing): until then charges are printed but not asserted.
 */
export function providerWired(): boolean {
  const dir = join(import.meta.dir, '..', '..', '..', 'src', 'payments')
  if (!existsSync(dir)) return false
  return readdirSync(dir).some((file) => file.endsWith('.ts') && /providerClient|provider\/client/.test(readFileSync(join(dir, file), 'utf8')))
}

export interface Instance {
  readonly name: string
  readonly port: number
  readonly url: string
  readonly pid: number
  output(): string
  /** A host crash: the whole process group at once. */
  kill(): Promise<void>
  /**
   * SIGTERM and wait for the exit: the drain. Bounded: past `timeoutMs` it
   * throws, naming the instance and quoting its last lines (the process is
   * left to the scope's cleanup, which SIGKILLs it). @default STOP_DEADLINE_MS
   */
  stop(timeoutMs?: number): Promise<number>
  readonly exited: Promise<number>
}

export interface InstanceOptions {
  readonly databaseUrl: string
  readonly providerUrl: string
  readonly ttlSeconds?: number
  readonly pgbouncer?: boolean
  /** A fixed port, so a restarted instance is where the load balancer expects it. @default a free one */
  readonly port?: number
  readonly env?: Record<string, string>
}

/**
 * How long a service instance may take to exit after SIGTERM: its drain is at
 * most DRAIN_TIMEOUT_MS + ABORTED_DRAIN_MS (10 + 3 s), the last scrape's wait
 * LAST_SCRAPE_WAIT_MS (15 s), then a second for the listeners and 5 s for the
 * pools (src/lifecycle.ts): 34 s, and a margin for a loaded machine.
 */
export const STOP_DEADLINE_MS = 45_000

/** The last `n` lines of a process's output, for an error message. */
export function lastLines(output: string, n = 15): string {
  return output.trimEnd().split('\n').slice(-n).map((line) => `    ${line.slice(0, 400)}`).join('\n')
}

export async function startInstance(name: string, options: InstanceOptions): Promise<Instance> {
  const port = options.port ?? freePort()
  const { proc, url, output } = await spawnService({
    detached: true,
    timeoutMs: 30_000,
    env: {
      DATABASE_URL: options.databaseUrl,
      PORT: String(port),
      API_KEYS: `${TENANT}:${API_KEY}`,
      ADMIN_TOKEN,
      NODE_ENV: 'test',
      IDEMPOTENCY_TTL_SECONDS: String(options.ttlSeconds ?? 3),
      PAYMENT_PROVIDER_URL: options.providerUrl,
      DATABASE_PGBOUNCER: options.pgbouncer ? '1' : undefined,
      WORKERS: '1',
      ...options.env,
    },
  })
  track(proc.pid)
  return {
    name,
    port,
    url,
    pid: proc.pid,
    output,
    exited: proc.exited,
    async kill() {
      killGroup(proc.pid)
      await proc.exited
    },
    async stop(timeoutMs = STOP_DEADLINE_MS) {
      if (proc.exitCode === null) proc.kill('SIGTERM')
      try {
        return await bounded(`service instance ${name} (pid ${proc.pid}) to exit after SIGTERM (its drain)`, proc.exited, timeoutMs)
      } catch (error) {
        throw new Error(`${(error as Error).message}; its last lines:\n${lastLines(output())}`)
      }
    },
  }
}

/** A client for assertions, outside the service's pools. */
export function adminClient(url: string, pgbouncer = false): postgres.Sql {
  return postgres(url, { max: 2, onnotice: () => undefined, ...(pgbouncer ? { prepare: false } : {}), connect_timeout: 5 })
}

export interface LedgerCheck {
  /** Payments in the database for these keys. */
  readonly payments: number
  /** Charges at the provider for these keys (by customer). */
  readonly charges: number
  /** Keys with more than one payment. */
  readonly duplicatedPayments: number
  /** Keys with more than one charge. */
  readonly duplicatedCharges: number
  /** Keys a client saw a 2xx for whose payment is not in the database (or is another one). */
  readonly lost: number
  /** Keys without any payment. */
  readonly missing: number
  /** Payments whose provider_reference is not a charge of the provider. */
  readonly unmatchedReferences: number
}

/**
 * The end-of-scenario check. `keys` maps each idempotency key to its
 * customer (one customer per key, so charges count per key) and the payment
 * id a client was answered with (2xx), if any.
 */
export async function checkLedgers(sql: postgres.Sql, provider: Provider | undefined, keys: Map<string, { customer: string; answeredId?: string }>): Promise<LedgerCheck> {
  // The column's name follows the schema (provider_ref in sql/); none before the provider landed.
  const [column] = await sql<{ name: string }[]>`
    select column_name as name from information_schema.columns
     where table_name = 'payments' and column_name in ('provider_ref', 'provider_reference') and table_schema = current_schema()`
  const reference = column ? sql(column.name) : sql`null::text`
  const rows = await sql<{ idempotency_key: string; id: string; provider_reference: string | null }[]>`
    select idempotency_key, id::text, ${reference} as provider_reference from payments
     where tenant = ${TENANT} and idempotency_key in ${sql([...keys.keys()])}`
  const byKey = new Map<string, { id: string; ref: string | null }[]>()
  for (const row of rows) byKey.set(row.idempotency_key, [...(byKey.get(row.idempotency_key) ?? []), { id: row.id, ref: row.provider_reference }])
  let lost = 0
  let missing = 0
  let duplicatedPayments = 0
  for (const [key, { answeredId }] of keys) {
    const found = byKey.get(key) ?? []
    if (found.length === 0) missing++
    if (found.length > 1) duplicatedPayments++
    if (answeredId !== undefined && !found.some((p) => p.id === answeredId)) lost++
  }
  let charges = 0
  let duplicatedCharges = 0
  let unmatchedReferences = 0
  if (provider) {
    // One listing, grouped by customer (one customer per key): thousands of keys in one request.
    const byCustomer = new Map<string, Charge[]>()
    for (const charge of await provider.allCharges()) byCustomer.set(charge.customer, [...(byCustomer.get(charge.customer) ?? []), charge])
    const all = [...keys].map(([key, { customer }]) => [key, byCustomer.get(customer) ?? []] as const)
    for (const [key, list] of all) {
      charges += list.length
      if (list.length > 1) duplicatedCharges++
      const ids = new Set(list.map((c) => c.id))
      for (const payment of byKey.get(key) ?? []) if (payment.ref === null || !ids.has(payment.ref)) unmatchedReferences++
    }
  }
  return { payments: rows.length, charges, duplicatedPayments, duplicatedCharges, lost, missing, unmatchedReferences }
}

/** One line per scenario, the same shape everywhere: what the docs quote. */
export function report(scenario: string, figures: Record<string, string | number | boolean | undefined>): void {
  const text = Object.entries(figures).filter(([, v]) => v !== undefined).map(([k, v]) => `${k}=${v}`).join(' ')
  console.log(`[scale] ${scenario}: ${text}`)
}
