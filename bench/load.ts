import autocannon from 'autocannon'

export interface LoadOptions {
  readonly url: string
  readonly connections: number
  /** Seconds; or give `amount`. */
  readonly durationS?: number
  /** Total requests; or give `durationS`. */
  readonly amount?: number
  readonly headers: Record<string, string>
  /** The n-th request's body and Idempotency-Key (undefined: none). */
  readonly request: (n: number) => { body: string; key?: string | undefined }
}

export interface LoadResult {
  readonly requests: number
  readonly seconds: number
  /** Answers per second, all statuses. */
  readonly rps: number
  readonly byStatus: Readonly<Record<string, number>>
  readonly errors: number
  /** Milliseconds per status, for percentiles. */
  readonly latencies: ReadonlyMap<number, number[]>
}

/**
 * One autocannon run (closed loop: each connection sends its next request
 * when the answer to the last one arrived). Latencies are taken per answer
 * from autocannon's 'response' event, in fractional milliseconds and per
 * status, since its own histogram keeps only 2xx at 1 ms resolution.
 */
export async function runLoad(options: LoadOptions): Promise<LoadResult> {
  let n = 0
  const latencies = new Map<number, number[]>()
  const started = performance.now()
  const instance = autocannon({
    url: options.url,
    connections: options.connections,
    ...(options.durationS !== undefined ? { duration: options.durationS } : {}),
    ...(options.amount !== undefined ? { amount: options.amount } : {}),
    timeout: 30,
    requests: [{
      method: 'POST',
      setupRequest(request) {
        const { body, key } = options.request(n++)
        return { ...request, method: 'POST', body, headers: { ...options.headers, ...(key !== undefined ? { 'idempotency-key': key } : {}) } }
      },
    }],
  })
  instance.on('response', (_client, status, _bytes, ms) => {
    let list = latencies.get(status)
    if (!list) latencies.set(status, (list = []))
    list.push(ms)
  })
  const result = await instance
  const seconds = (performance.now() - started) / 1000
  const byStatus = Object.fromEntries(Object.entries(result.statusCodeStats).map(([status, stats]) => [status, stats.count]))
  const requests = Object.values(byStatus).reduce((sum, count) => sum + count, 0)
  return { requests, seconds, rps: requests / seconds, byStatus, errors: result.errors, latencies }
}

/** The p-th percentile (0..100) by nearest rank. */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return Number.NaN
  const sorted = [...values].sort((a, b) => a - b)
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!
}

export const round2 = (x: number) => Math.round(x * 100) / 100

/** CPU microseconds spent by each side during a run (bench/cpu.ts). */
export interface CpuTotals {
  readonly serviceUs: number
  readonly postgresUs: number
  readonly providerUs: number
  /** This process: autocannon. */
  readonly loadGeneratorUs: number
  /** Busy CPU of the whole machine that none of the above used: other work on a shared machine. */
  readonly othersUs: number
  /** Share (0..1) of all CPUs' time that was busy. */
  readonly machineBusyShare: number
  readonly seconds: number
}
