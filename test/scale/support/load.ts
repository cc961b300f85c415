/** Load shapes for the scale scenarios, over real HTTP, and the figures they print. */
import { API_KEY } from './world'

export interface Answer {
  readonly status: number | 'network-error'
  readonly id?: string
  readonly replayed: boolean
  /** Client-side latency of this one request. */
  readonly ms: number
  /** performance.now() when the answer came. */
  readonly at: number
  /** The start of an error answer's body: who answered, and why. */
  readonly detail?: string
}

export interface PaymentRequest {
  readonly amount: number
  readonly currency: string
  readonly customer: string
}

export async function post(url: string, key: string, body: PaymentRequest, timeoutMs = 30_000): Promise<Answer> {
  const started = performance.now()
  try {
    const response = await fetch(`${url}/api/payments`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${API_KEY}`, 'idempotency-key': key },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(timeoutMs),
    })
    const text = await response.text()
    const ok = response.status >= 200 && response.status < 300
    const at = performance.now()
    return {
      status: response.status,
      replayed: response.headers.get('idempotent-replayed') === 'true',
      ms: at - started,
      at,
      ...(ok ? { id: (JSON.parse(text) as { id: string }).id } : { detail: text.slice(0, 160) }),
    }
  } catch (error) {
    const at = performance.now()
    return { status: 'network-error', replayed: false, ms: at - started, at, detail: String(error).slice(0, 160) }
  }
}

/** `n` requests with one key, all at once. */
export function storm(url: string, key: string, n: number, body: PaymentRequest): Promise<Answer[]> {
  return Promise.all(Array.from({ length: n }, () => post(url, key, body)))
}

/**
 * A careful client: retries network errors, 5xx and 409 (after at most
 * `pauseMs`, jittered) until a 2xx or the deadline. `url` is read before each
 * attempt. Returns every answer it saw (into `record` as they come, if given).
 */
export async function untilPaid(url: () => string, key: string, body: PaymentRequest, options: { pauseMs?: number; deadlineMs?: number; record?: Answer[] } = {}): Promise<Answer[]> {
  const answers: Answer[] = options.record ?? []
  const deadline = Date.now() + (options.deadlineMs ?? 90_000)
  while (Date.now() < deadline) {
    const answer = await post(url(), key, body, 15_000)
    answers.push(answer)
    if (answer.id !== undefined) return answers
    if (typeof answer.status === 'number' && answer.status >= 400 && answer.status < 500 && answer.status !== 409)
      throw new Error(`key ${key}: ${answer.status}, which no retry fixes`)
    await Bun.sleep(Math.random() * (options.pauseMs ?? 200))
  }
  throw new Error(`key ${key}: no 2xx in ${options.deadlineMs ?? 90_000} ms; saw ${answers.length} answers: ${JSON.stringify(tally(answers))}, the last: ${answers.at(-1)?.detail}`)
}

/** The 2xx id of a client's answers, if it got one. */
export function paidId(answers: Answer[]): string | undefined {
  return answers.find((a) => a.id !== undefined)?.id
}

/** How many answers of each kind: "201", "201 replay", "409", "network-error", ... */
export function tally(answers: Iterable<Answer>): Record<string, number> {
  const counts: Record<string, number> = {}
  for (const a of answers) {
    const label = a.replayed ? `${a.status} replay` : String(a.status)
    counts[label] = (counts[label] ?? 0) + 1
  }
  return counts
}

export function percentile(values: number[], p: number): number {
  if (values.length === 0) return Number.NaN
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)]!
}

export function ms(value: number): string {
  return `${value.toFixed(1)}ms`
}

/** One key of a continuous load: which path it went through and everything its client saw. */
export interface KeyRun {
  readonly key: string
  readonly customer: string
  readonly amount: number
  /** The target (path to the database) its client used. */
  readonly target: string
  readonly answers: Answer[]
  /** Why its client gave up (a 4xx no retry fixes, or its deadline), if it did. */
  error?: string
}

export interface LoadTarget {
  readonly name: string
  /** Read before each attempt (a restarted instance may move). */
  readonly url: () => string
}

export interface ContinuousLoadOptions {
  /** Concurrent careful clients (untilPaid), spread round robin over the targets. */
  readonly clients: number
  readonly targets: readonly LoadTarget[]
  /** Keys are `${prefix}-${client}-${n}`, customers `cus_${key}`: one customer per key, so charges count per key. */
  readonly prefix: string
  /** A client's pause between two keys. @default 100 */
  readonly thinkMs?: number
  /** A client's longest pause between two attempts of one key (jittered). @default 200 */
  readonly pauseMs?: number
  /** How long one key may take before its client gives up. @default 120000 */
  readonly keyDeadlineMs?: number
}

/**
 * Clients that pay one new key after another, each retrying it (network
 * errors, 5xx, 409) until a 2xx, until stopped; every answer is kept, with
 * the time it came, for the figures (gaps, first payment after a fault) and
 * for the ledger check at the end.
 */
export class ContinuousLoad {
  readonly keys: KeyRun[] = []
  #stopping = false
  #clients: Promise<void>[] = []

  constructor(readonly options: ContinuousLoadOptions) {}

  start(): this {
    const { clients, targets, prefix } = this.options
    this.#clients = Array.from({ length: clients }, async (_, client) => {
      const target = targets[client % targets.length]!
      for (let n = 0; !this.#stopping; n++) {
        const key = `${prefix}-${client}-${n}`
        const run: KeyRun = { key, customer: `cus_${key}`, amount: 100 + ((client * 7 + n) % 900), target: target.name, answers: [] }
        this.keys.push(run)
        try {
          await untilPaid(target.url, key, { amount: run.amount, currency: 'EUR', customer: run.customer }, {
            pauseMs: this.options.pauseMs ?? 200, deadlineMs: this.options.keyDeadlineMs ?? 120_000, record: run.answers,
          })
        } catch (error) {
          run.error = String(error).slice(0, 300)
        }
        await Bun.sleep(Math.random() * (this.options.thinkMs ?? 100))
      }
    })
    return this
  }

  /** Stops taking new keys; resolves when every client has its current key paid (or given up). */
  async stop(): Promise<void> {
    this.#stopping = true
    await Promise.all(this.#clients)
  }

  /** Fresh payments (201, not a replay) whose request was sent after `since`, by target (all when undefined). */
  fresh(since: number, target?: string): Answer[] {
    return this.keys.filter((k) => target === undefined || k.target === target)
      .flatMap((k) => k.answers.filter((a) => a.status === 201 && !a.replayed && a.at - a.ms > since))
  }

  /** Keys whose client got a 2xx. */
  paid(target?: string): number {
    return this.keys.filter((k) => (target === undefined || k.target === target) && paidId(k.answers) !== undefined).length
  }

  /** The longest stretch in [from, to] during which `target` answered no 2xx, in ms. */
  longestGap(from: number, to: number, target?: string): number {
    const times = this.keys.filter((k) => target === undefined || k.target === target)
      .flatMap((k) => k.answers.filter((a) => a.id !== undefined && a.at >= from && a.at <= to).map((a) => a.at))
      .sort((a, b) => a - b)
    let gap = 0
    let last = from
    for (const t of [...times, to]) { gap = Math.max(gap, t - last); last = t }
    return gap
  }

  /** The keys as checkLedgers takes them. */
  ledgerKeys(): Map<string, { customer: string; answeredId?: string }> {
    return new Map(this.keys.map((k) => {
      const id = paidId(k.answers)
      return [k.key, { customer: k.customer, ...(id ? { answeredId: id } : {}) }]
    }))
  }

  /** Keys with two different payment ids among their 2xx answers. */
  conflictingAnswers(): string[] {
    return this.keys.filter((k) => new Set(k.answers.flatMap((a) => (a.id ? [a.id] : []))).size > 1).map((k) => k.key)
  }

  answers(): Answer[] {
    return this.keys.flatMap((k) => k.answers)
  }

  /** The time of the last answer (the end of the load). */
  lastAnswerAt(): number {
    return Math.max(...this.answers().map((a) => a.at))
  }
}

/** One example body per status outside 2xx/409/503 (what went wrong, for the report). */
export function oddAnswers(answers: Iterable<Answer>): Record<string, string> {
  const examples: Record<string, string> = {}
  for (const a of answers) {
    const label = String(a.status)
    if (typeof a.status === 'number' && (a.status < 300 || a.status === 409 || a.status === 503)) continue
    examples[label] ??= (a.detail ?? '').slice(0, 200)
  }
  return examples
}
