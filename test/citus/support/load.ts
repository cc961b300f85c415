/**
 * Load for the Citus fault tests: careful clients (one key per logical
 * payment, each key paying a customer of its own, retried on network errors,
 * 5xx and 409 until a 2xx), every attempt recorded with its tenant and when
 * it started and ended, so a test can ask what the tenants of one worker saw
 * while another worker was down. And the checks that count: one payment per
 * key, every 2xx carrying its id, one charge per key at the provider's
 * ledger, nothing left processing.
 */
import type postgres from 'postgres'
import { chargesAt } from '../../support/server'
import { apiKeyOf } from './tenants'

export interface Attempt {
  readonly tenant: string
  readonly key: string
  readonly status: number | 'network-error'
  /** performance.now() when it was sent and when its answer (or error) came. */
  readonly started: number
  readonly ended: number
  readonly replayed: boolean
  readonly paymentId?: string
  /** A non-2xx answer's problem code and detail, or the network error. */
  readonly problem?: string
}

export interface PayTarget {
  /** Read before every attempt: the service may have been restarted on another port. */
  readonly url: () => string
  /** Every attempt of every key, in the order answered. */
  readonly attempts: Attempt[]
  /** Upper bound of the pause between attempts of one key (full jitter below it). @default 100 */
  readonly pauseMs?: number
  /** Bounds one attempt: a hung request shows as a network error. @default 15_000 */
  readonly attemptTimeoutMs?: number
}

export const customerOf = (key: string) => `cus_${key}`

/** One attempt of a payment, recorded in `target.attempts`. */
async function attempt(target: PayTarget, tenant: string, key: string, amount: number): Promise<Attempt> {
  const started = performance.now()
  let seen: Attempt
  try {
    const response = await fetch(`${target.url()}/api/payments`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${apiKeyOf(tenant)}`, 'idempotency-key': key },
      body: JSON.stringify({ amount, currency: 'EUR', customer: customerOf(key) }),
      signal: AbortSignal.timeout(target.attemptTimeoutMs ?? 15_000),
    })
    const text = await response.text()
    const parsed = (() => { try { return JSON.parse(text) as { id?: string; code?: string; detail?: string } } catch { return {} } })()
    seen = {
      tenant, key, status: response.status, started, ended: performance.now(),
      replayed: response.headers.get('idempotent-replayed') === 'true',
      ...(response.ok ? { paymentId: parsed.id! } : { problem: `${parsed.code}: ${parsed.detail ?? text.slice(0, 200)}` }),
    }
  } catch (error) {
    seen = { tenant, key, status: 'network-error', started, ended: performance.now(), replayed: false, problem: String(error) }
  }
  target.attempts.push(seen)
  return seen
}

/** POSTs until a 2xx (fresh or replay); throws when `deadlineMs` passes first. */
export async function payUntilAnswered(target: PayTarget, tenant: string, key: string, amount: number, deadlineMs = 60_000): Promise<void> {
  const deadline = Date.now() + deadlineMs
  while (Date.now() < deadline) {
    const seen = await attempt(target, tenant, key, amount)
    if (typeof seen.status === 'number' && seen.status >= 200 && seen.status < 300) return
    await Bun.sleep(Math.random() * (target.pauseMs ?? 100)) // a retrying client's pause: the load's shape
  }
  const mine = target.attempts.filter((a) => a.key === key).slice(-5).map((a) => `${a.status} ${a.problem ?? ''}`)
  throw new Error(`${tenant}/${key}: no 2xx in ${deadlineMs} ms; last attempts: ${mine.join(' | ')}`)
}

export interface Load {
  /** Every key asked for so far, with its tenant. */
  readonly keys: Map<string, string>
  /** 2xx answers so far, per tenant. */
  paid(tenant: string): number
  /** Stops starting new keys; resolves when every key started has its 2xx (rejects if one never does). */
  stop(): Promise<void>
}

/**
 * `clientsPerTenant` clients for each tenant, each paying one new key after
 * another until stop(): a steady stream of fresh payments per tenant.
 */
export function runLoad(target: PayTarget, tenants: readonly string[], clientsPerTenant: number, prefix: string): Load {
  const keys = new Map<string, string>()
  const paid = new Map<string, number>()
  let running = true
  let next = 0
  const clients = tenants.flatMap((tenant) => Array.from({ length: clientsPerTenant }, async () => {
    while (running) {
      const n = next++
      const key = `${prefix}-${n}-${crypto.randomUUID().slice(0, 8)}`
      keys.set(key, tenant)
      await payUntilAnswered(target, tenant, key, 100 + n)
      paid.set(tenant, (paid.get(tenant) ?? 0) + 1)
    }
  }))
  const done = Promise.all(clients)
  done.catch(() => undefined) // read by stop(); a failure before it is not unhandled
  return {
    keys,
    paid: (tenant) => paid.get(tenant) ?? 0,
    async stop() {
      running = false
      await done
    },
  }
}

/**
 * Exactly once for each key, where it counts: one payment row, every 2xx
 * for the key carried that payment's id, and one charge for the key's
 * customer at the provider's ledger, the one the payment refers to; no
 * payment nobody asked for (but under keys `ignore` says are another
 * scenario's). Returns the failures (empty when it holds).
 */
export async function exactlyOnceProblems(sql: postgres.Sql, providerUrl: string, keys: Map<string, string>, attempts: readonly Attempt[],
  /** Keys of earlier scenarios of the same tenants, not this one's: payments under them are not this scenario's to count. */
  ignore: (key: string) => boolean = () => false): Promise<string[]> {
  const problems: string[] = []
  const tenants = [...new Set(keys.values())]
  const rows = await sql<{ tenant: string; key: string; id: string; provider_ref: string }[]>`
    select tenant, idempotency_key as key, id::text, provider_ref from payments where tenant in ${sql(tenants)}`
  const payments = new Map<string, { id: string; provider_ref: string }[]>()
  for (const row of rows) payments.set(`${row.tenant}/${row.key}`, [...(payments.get(`${row.tenant}/${row.key}`) ?? []), row])
  const charges = new Map<string, { id: string }[]>()
  for (const charge of await chargesAt(providerUrl)) charges.set(charge.customer, [...(charges.get(charge.customer) ?? []), charge])
  const answered = new Map<string, Set<string>>()
  for (const a of attempts) if (a.paymentId) answered.set(a.key, (answered.get(a.key) ?? new Set()).add(a.paymentId))

  for (const [key, tenant] of keys) {
    const paid = payments.get(`${tenant}/${key}`) ?? []
    if (paid.length !== 1) { problems.push(`${tenant}/${key}: ${paid.length} payments`); continue }
    const ids = [...(answered.get(key) ?? [])]
    if (ids.length !== 1 || ids[0] !== paid[0]!.id) problems.push(`${tenant}/${key}: 2xx answers carried ${JSON.stringify(ids)}, the payment is ${paid[0]!.id}`)
    const charged = charges.get(customerOf(key)) ?? []
    if (charged.length !== 1) problems.push(`${tenant}/${key}: ${charged.length} charges at the provider`)
    else if (charged[0]!.id !== paid[0]!.provider_ref) problems.push(`${tenant}/${key}: the payment refers to ${paid[0]!.provider_ref}, the provider charged ${charged[0]!.id}`)
  }
  for (const row of rows) if (!keys.has(row.key) && !ignore(row.key)) problems.push(`${row.tenant}/${row.key}: a payment nobody asked for`)
  return problems
}

/** Keys still processing, and entries left on the processing list, over the whole cluster. */
export async function leftProcessing(sql: postgres.Sql): Promise<{ keys: number; listed: number }> {
  const [row] = await sql<{ keys: number; listed: number }[]>`
    select (select count(*)::int from idempotency_key_states where status = 'processing') as keys,
           (select count(*)::int from idempotency_processing) as listed`
  return row!
}

/** Answers by status (a replay counted apart), for the log. */
export function tally(attempts: readonly Attempt[]): Record<string, number> {
  const counts: Record<string, number> = {}
  for (const a of attempts) {
    const label = a.replayed ? `${a.status} replay` : String(a.status)
    counts[label] = (counts[label] ?? 0) + 1
  }
  return counts
}

/** 5xx answers (and network errors when `withNetwork`), as "status tenant: problem" lines for a failure message. */
export function serverErrors(attempts: readonly Attempt[], withNetwork = false): string[] {
  return attempts.filter((a) => (typeof a.status === 'number' && a.status >= 500) || (withNetwork && a.status === 'network-error'))
    .map((a) => `${a.status} ${a.tenant}: ${a.problem}`)
}
