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

export interface Throughput {
  requests: number
  rps: number
  p50Ms: number
  p99Ms: number
  byStatus: Record<string, number>
  errors: number
  /** CPU per answered request, microseconds: the service process, its PostgreSQL backends, the provider simulator, the load generator. */
  cpuUs: { service: number; postgres: number; provider: number; loadGenerator: number }
  /** Share of the machine's CPU time that was busy, in % */
  machineBusyPercent: number
  /** CPUs' worth of work by other processes (not the run's) while this kind ran. */
  othersCpus: number
  /** The 1-minute load average (os.loadavg) at the start and end of its rounds: lowest and highest. */
  loadAverage: { min: number; max: number }
  /** Answers per second of each round, in the order run (round-by-round ratios show the noise). */
  roundRps: number[]
}

/** One measured round of one kind. */
export interface RoundResult {
  load: LoadResult
  cpu: CpuTotals
  /** os.loadavg()[0] when the round started and when it ended. */
  loadAverage: readonly [number, number]
}

/** Totals over the rounds of one kind: requests over seconds, percentiles over all answers, CPU per request. */
export function summarize(results: readonly RoundResult[]): Throughput {
  const requests = results.reduce((sum, r) => sum + r.load.requests, 0)
  const seconds = results.reduce((sum, r) => sum + r.load.seconds, 0)
  const all = results.flatMap((r) => [...r.load.latencies.values()].flat())
  const byStatus: Record<string, number> = {}
  for (const { load } of results) for (const [status, count] of Object.entries(load.byStatus)) byStatus[status] = (byStatus[status] ?? 0) + count
  const total = (field: keyof CpuTotals) => results.reduce((sum, r) => sum + r.cpu[field], 0)
  const cpu = (field: keyof CpuTotals) => Math.round(total(field) / Math.max(1, requests))
  const cpuSeconds = total('seconds')
  return {
    requests,
    rps: Math.round(requests / seconds),
    p50Ms: round2(percentile(all, 50)),
    p99Ms: round2(percentile(all, 99)),
    byStatus,
    errors: results.reduce((sum, r) => sum + r.load.errors, 0),
    cpuUs: { service: cpu('serviceUs'), postgres: cpu('postgresUs'), provider: cpu('providerUs'), loadGenerator: cpu('loadGeneratorUs') },
    machineBusyPercent: Math.round((results.reduce((sum, r) => sum + r.cpu.machineBusyShare * r.cpu.seconds, 0) / cpuSeconds) * 100),
    othersCpus: round2(total('othersUs') / 1e6 / cpuSeconds),
    loadAverage: { min: round2(Math.min(...results.flatMap((r) => r.loadAverage))), max: round2(Math.max(...results.flatMap((r) => r.loadAverage))) },
    roundRps: results.map((r) => Math.round(r.load.rps)),
  }
}

/** a's throughput over b's, from the same rounds: overall, per round, and the load average over both. */
export interface Ratio {
  ratio: number
  rounds: number[]
  loadAverage: { min: number; max: number }
}

export function ratio(a: Throughput, b: Throughput): Ratio {
  // A round that answered nothing (its requests all outlasted it) has no ratio.
  const over = (x: number, y: number | undefined) => (y === undefined || y === 0 ? Number.NaN : round2(x / y))
  return {
    ratio: over(a.rps, b.rps),
    rounds: a.roundRps.map((rps, i) => over(rps, b.roundRps[i])),
    loadAverage: { min: Math.min(a.loadAverage.min, b.loadAverage.min), max: Math.max(a.loadAverage.max, b.loadAverage.max) },
  }
}
