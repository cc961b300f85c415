/**
 * A port another process holds is the operator's setting to change: the
 * refusal names the setting (PORT, METRICS_PORT, PAYMENT_PROVIDER_PORT,
 * EMBEDDED_PG_PORT) and a port that was free a moment ago, so the fix is one
 * copy and paste.
 */
import { ConfigError } from './constants'

/** How far above the taken port a free one is looked for, before asking the kernel for any. */
const NEARBY = 50

/** Whether `port` on `host` can be bound right now (a listener opened and closed at once). */
export function portIsFree(host: string, port: number): boolean {
  try {
    Bun.listen({ hostname: host, port, socket: { data() {} } }).stop(true)
    return true
  } catch {
    return false
  }
}

/**
 * A port free on `host` now: the first above `taken` (a neighbour is easy to
 * remember and to open in a firewall) that is neither bound nor one of
 * `avoid` (the other ports this start will take), else any the kernel gives.
 */
export function freePort(host: string, taken: number, avoid: readonly number[] = []): number | undefined {
  for (let port = taken + 1; port <= Math.min(taken + NEARBY, 65535); port++) {
    if (!avoid.includes(port) && portIsFree(host, port)) return port
  }
  try {
    const any = Bun.listen({ hostname: host, port: 0, socket: { data() {} } })
    const port = any.port
    any.stop(true)
    return port
  } catch {
    return undefined
  }
}

/** The refusal for `variable`'s port taken on `host`, with a free one to set instead. */
export function portTaken(variable: string, host: string, port: number, avoid: readonly number[] = []): ConfigError {
  const free = freePort(host, port, avoid)
  return new ConfigError(variable, `port ${port} on ${host} is in use by another process: stop that process, or set ${variable} to a free port${free === undefined ? '' : `, e.g. ${variable}=${free} (free just now)`}`)
}

/** EADDRINUSE, as Bun.serve, Bun.listen and node:net report it. */
export function isPortTaken(error: unknown): boolean {
  return (error as { code?: unknown } | null)?.code === 'EADDRINUSE'
}
