/**
 * Fresh payments at full speed for the day-of-traffic bench: wrk (bench/wrk.ts,
 * a closed loop in C that costs the services next to no CPU), or autocannon in
 * this process (bench/load.ts) where wrk is not installed (CI, the test of the
 * quick mode). Both send `${prefix}${n}` as keys and the round's customer in
 * every body, so exactly once can be counted per round.
 */
import { percentile, round2, runLoad } from './load'
import { BENCH_API_KEY } from './service'
import { benchBody, runWrk, wrkAvailable } from './wrk'

export type LoadTool = 'wrk' | 'autocannon'

export interface FreshLoad {
  readonly requests: number
  readonly rps: number
  readonly p50: number
  readonly p99: number
  /** Answers not 2xx, and socket errors. */
  readonly failed: number
}

export interface FreshLoadOptions {
  readonly url: string
  readonly connections: number
  readonly seconds: number
  readonly customer: string
  /** Keys are `${prefix}${n}`, n = 0, 1, ...: each load's prefix is new. */
  readonly prefix: string
}

const headers = { authorization: `Bearer ${BENCH_API_KEY}`, 'content-type': 'application/json' }

export function defaultLoadTool(): LoadTool {
  return wrkAvailable() ? 'wrk' : 'autocannon'
}

export async function freshLoad(tool: LoadTool, options: FreshLoadOptions): Promise<FreshLoad> {
  const url = `${options.url}/api/payments`
  if (tool === 'wrk') {
    const r = await runWrk({ url, connections: options.connections, seconds: options.seconds, headers, customer: options.customer, keys: { kind: 'fresh', prefix: options.prefix } })
    return { requests: r.requests, rps: r.rps, p50: r.p50, p99: r.p99, failed: r.non2xx + r.socketErrors }
  }
  const r = await runLoad({
    url, connections: options.connections, durationS: options.seconds, headers,
    request: (n) => ({ body: benchBody(n, options.customer), key: `${options.prefix}${n}` }),
  })
  const ok = [...r.latencies].filter(([status]) => status >= 200 && status < 300).flatMap(([, ms]) => ms)
  return { requests: r.requests, rps: r.rps, p50: round2(percentile(ok, 50)), p99: round2(percentile(ok, 99)), failed: r.requests - ok.length + r.errors }
}
