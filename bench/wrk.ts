/**
 * Load from `wrk` (the Debian package): a closed loop in C, so the load
 * generator costs the services next to no CPU on a two-core machine (a Bun
 * loop took a core of its own). A Lua script, written per run, gives every
 * request its body and Idempotency-Key and prints the summary as JSON.
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'

export const WRK_INSTALL_HINT = 'apt-get install wrk'

export function wrkAvailable(): boolean {
  return Bun.which('wrk') !== null
}

export interface WrkOptions {
  readonly url: string
  readonly connections: number
  readonly seconds: number
  readonly headers: Readonly<Record<string, string>>
  /**
   * The keys: `fresh` sends `${prefix}${n}` for n = 0, 1, ... (a new key each
   * time); `cycle` sends keys 0 .. count-1 of the prefix over and over (replays
   * of completed keys, or retries of one in flight with count 1); `none` sends no key.
   */
  readonly keys: { readonly kind: 'fresh' | 'cycle'; readonly prefix: string; readonly count?: number } | { readonly kind: 'none' }
  /** Every body names this customer: the provider's ledger is read by it. */
  readonly customer: string
}

export interface WrkResult {
  readonly requests: number
  readonly seconds: number
  readonly rps: number
  /** Answers that were not 2xx or 3xx. */
  readonly non2xx: number
  /** Connect, read, write and timeout errors. */
  readonly socketErrors: number
  /** Latency percentiles, in ms. */
  readonly p50: number
  readonly p90: number
  readonly p99: number
  readonly max: number
  /** wrk's own CPU, µs. */
  readonly cpuUs: number
}

/** The n-th request's body: deterministic, so a replay of key n sends the body its first request had. */
export function benchBody(n: number, customer: string): string {
  return JSON.stringify({ amount: 1000 + (n % 9000), currency: 'EUR', customer })
}

const lua = (options: WrkOptions) => {
  const headers = Object.entries(options.headers).map(([name, value]) => `wrk.headers[${JSON.stringify(name)}] = ${JSON.stringify(value)}`).join('\n')
  const keys = options.keys
  const key = keys.kind === 'none' ? 'nil'
    : keys.kind === 'fresh' ? `${JSON.stringify(keys.prefix)} .. n`
    : `${JSON.stringify(keys.prefix)} .. (n % ${keys.count ?? 1})`
  const index = keys.kind === 'cycle' ? `(n % ${keys.count ?? 1})` : 'n'
  return `
wrk.method = "POST"
${headers}
local n = -1
request = function()
  n = n + 1
  local i = ${index}
  local body = '{"amount":' .. (1000 + (i % 9000)) .. ',"currency":"EUR","customer":${JSON.stringify(options.customer)}}'
  local key = ${key}
  if key then wrk.headers["Idempotency-Key"] = key end
  return wrk.format(nil, nil, nil, body)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRK_JSON {"requests":%d,"micros":%d,"non2xx":%d,"socketErrors":%d,"p50":%d,"p90":%d,"p99":%d,"max":%d}\\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
`
}

/** One wrk run: one thread (two would take the services' second core), `connections` connections. */
export async function runWrk(options: WrkOptions): Promise<WrkResult> {
  const dir = mkdtempSync(join(tmpdir(), 'idem-wrk-'))
  try {
    const script = join(dir, 'load.lua')
    writeFileSync(script, lua(options))
    const proc = Bun.spawn(['wrk', '-t1', `-c${options.connections}`, `-d${options.seconds}s`, '--timeout', '30s', '-s', script, options.url], { stdout: 'pipe', stderr: 'pipe' })
    const [out, err, code] = await Promise.all([new Response(proc.stdout).text(), new Response(proc.stderr).text(), proc.exited])
    const line = out.split('\n').find((l) => l.startsWith('WRK_JSON '))
    if (code !== 0 || !line) throw new Error(`wrk exited with ${code}:\n${out}\n${err}`)
    const raw = JSON.parse(line.slice('WRK_JSON '.length)) as { requests: number; micros: number; non2xx: number; socketErrors: number; p50: number; p90: number; p99: number; max: number }
    const seconds = raw.micros / 1e6
    const usage = proc.resourceUsage()?.cpuTime
    const cpuUs = usage ? Number(usage.user) + Number(usage.system) : Number.NaN
    const ms = (us: number) => Math.round(us / 10) / 100
    return {
      requests: raw.requests, seconds, rps: raw.requests / seconds, non2xx: raw.non2xx, socketErrors: raw.socketErrors,
      p50: ms(raw.p50), p90: ms(raw.p90), p99: ms(raw.p99), max: ms(raw.max), cpuUs,
    }
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
}
