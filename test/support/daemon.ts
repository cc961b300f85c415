/**
 * A monitoring daemon of the suite's own (Prometheus, Alertmanager): started
 * on a free port with a folder of its own, its stderr kept for the failure
 * message, ready once its `/-/ready` answers; `stop` ends it and removes the
 * folder.
 */
import { rmSync } from 'node:fs'
import { waitUntil } from './wait'

export interface Daemon {
  readonly url: string
  /** What it printed on stderr so far. */
  log(): string
  stop(): Promise<void>
}

/** A port free at this moment on 127.0.0.1. */
export function freeLocalPort(): number {
  const probe = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: () => new Response(null) })
  const port = probe.port!
  probe.stop(true)
  return port
}

/** Spawns `argv` (which listens on `url`), owning `dir`; resolves once `/-/ready` answers, or fails with its log. */
export async function startDaemon(name: string, argv: string[], url: string, dir: string, pollMs: number): Promise<Daemon> {
  const proc = Bun.spawn(argv, { stdout: 'pipe', stderr: 'pipe' })
  let log = ''
  void (async () => {
    const reader = (proc.stderr as ReadableStream<Uint8Array>).getReader()
    for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) log += new TextDecoder().decode(chunk.value)
  })()
  const stop = async () => {
    proc.kill('SIGTERM')
    await proc.exited
    rmSync(dir, { recursive: true, force: true })
  }
  const ready = await waitUntil(async () => proc.exitCode !== null || await fetch(`${url}/-/ready`).then((r) => r.ok, () => false), 30_000, pollMs)
  if (!ready || proc.exitCode !== null) {
    await stop()
    throw new Error(`${name} did not get ready within 30 s\n--- ${name.toLowerCase()} log ---\n${log}`)
  }
  return { url, log: () => log, stop }
}
