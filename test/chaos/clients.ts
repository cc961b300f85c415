/**
 * A client that behaves like a careful real one: one key per logical payment,
 * retried on network errors, 5xx and 409 until it gets a 2xx (fresh or replay).
 * It records every answer, so tests can check what each attempt saw.
 */
import type { PaymentBody } from '../support/http'

export interface Attempt {
  readonly status: number | 'network-error'
  readonly replayed: boolean
  readonly paymentId?: string
  readonly contentType?: string | null
  readonly retryAfter?: string | null
  readonly ms: number
  readonly error?: string
}

export interface RetryOptions {
  /** Read before every attempt: the server may have been restarted on another port. */
  readonly url: () => string
  readonly apiKey?: string
  /** Upper bound of the pause between attempts (full jitter below it). @default 200 */
  readonly pauseMs?: number
  /** Give up (and fail the test) after this long. @default 45_000 */
  readonly deadlineMs?: number
  /** Bounds a single attempt: a hung request shows as a network error. @default 15_000 */
  readonly attemptTimeoutMs?: number
}

/** POSTs until a 2xx; returns every attempt. Throws when the deadline passes. */
export async function payUntilAnswered(key: string, body: PaymentBody, options: RetryOptions): Promise<Attempt[]> {
  const attempts: Attempt[] = []
  const deadline = Date.now() + (options.deadlineMs ?? 45_000)
  while (Date.now() < deadline) {
    const started = performance.now()
    try {
      const response = await fetch(`${options.url()}/api/payments`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${options.apiKey ?? 'acme-key'}`, 'idempotency-key': key },
        body: JSON.stringify(body),
        signal: AbortSignal.timeout(options.attemptTimeoutMs ?? 15_000),
      })
      const text = await response.text()
      const ok = response.status >= 200 && response.status < 300
      attempts.push({
        status: response.status,
        replayed: response.headers.get('idempotent-replayed') === 'true',
        contentType: response.headers.get('content-type'),
        retryAfter: response.headers.get('retry-after'),
        ms: performance.now() - started,
        ...(ok ? { paymentId: (JSON.parse(text) as { id: string }).id } : {}),
        // A 5xx's problem, so a test that counts them can say which they were.
        ...(response.status >= 500 ? { error: text.slice(0, 300) } : {}),
      })
      if (ok) return attempts
    } catch (error) {
      attempts.push({ status: 'network-error', replayed: false, ms: performance.now() - started, error: String(error) })
    }
    await Bun.sleep(Math.random() * (options.pauseMs ?? 200))
  }
  throw new Error(`key ${key}: no 2xx before the deadline; attempts: ${JSON.stringify(attempts.slice(0, 10).map((a) => [a.status, Math.round(a.ms), a.error]))}`)
}

/** Payments per idempotency key of one tenant, from the database: the side effects that count. */
export async function paymentsByKey(sql: import('postgres').Sql, tenant = 'acme'): Promise<Map<string, string[]>> {
  const rows = await sql<{ idempotency_key: string; id: string }[]>`
    select idempotency_key, id::text from payments where tenant = ${tenant} order by created_at`
  const byKey = new Map<string, string[]>()
  for (const row of rows) byKey.set(row.idempotency_key, [...(byKey.get(row.idempotency_key) ?? []), row.id])
  return byKey
}

/** Checks Exactly once (docs/explanation/invariants.md) for each key: one payment, and every 2xx carried its id. Returns the failures. */
export function exactlyOnce(results: Map<string, Attempt[]>, payments: Map<string, string[]>): string[] {
  const problems: string[] = []
  for (const [key, attempts] of results) {
    const ids = payments.get(key) ?? []
    if (ids.length !== 1) problems.push(`${key}: ${ids.length} payments`)
    for (const attempt of attempts)
      if (attempt.paymentId !== undefined && attempt.paymentId !== ids[0]) problems.push(`${key}: a 2xx carried ${attempt.paymentId}, stored ${ids[0]}`)
  }
  for (const key of payments.keys()) if (!results.has(key)) problems.push(`${key}: a payment nobody asked for`)
  return problems
}

/**
 * Checks Exactly once at the provider for each key, at the provider's ledger: exactly one
 * charge for the key's customer (each key pays for a customer of its own),
 * and it is the one the payment refers to. Returns the failures.
 */
export async function chargedOnce(sql: import('postgres').Sql, provider: { charges(customer?: string): Promise<{ id: string }[]> }, customers: Map<string, string>, tenant = 'acme'): Promise<string[]> {
  const problems: string[] = []
  const refs = new Map((await sql<{ idempotency_key: string; provider_ref: string }[]>`
    select idempotency_key, provider_ref from payments where tenant = ${tenant}`).map((row) => [row.idempotency_key, row.provider_ref]))
  for (const [key, customer] of customers) {
    const charges = await provider.charges(customer)
    if (charges.length !== 1) problems.push(`${key}: ${charges.length} charges at the provider`)
    else if (refs.has(key) && charges[0]!.id !== refs.get(key)) problems.push(`${key}: the payment refers to ${refs.get(key)}, the provider charged ${charges[0]!.id}`)
  }
  return problems
}

export function tally(results: Iterable<Attempt[]>): Record<string, number> {
  const counts: Record<string, number> = {}
  for (const attempts of results)
    for (const a of attempts) {
      const label = a.replayed ? `${a.status} replay` : String(a.status)
      counts[label] = (counts[label] ?? 0) + 1
    }
  return counts
}

/** A TCP port nobody listens on right now. */
export function freePort(): number {
  const probe = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: () => new Response(null) })
  const port = probe.port!
  probe.stop(true)
  return port
}
