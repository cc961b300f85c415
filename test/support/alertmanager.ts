/**
 * A real Alertmanager (Debian's `prometheus-alertmanager`, installed by
 * `.ci/run`) on its own port and storage, its cluster listener off, and a
 * webhook of the test's own that records every notification it receives.
 */
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { waitUntil } from './wait'

/** Debian names the binary prometheus-alertmanager; upstream's tarball, alertmanager. */
export const ALERTMANAGER_BINARY = Bun.which('prometheus-alertmanager') ?? Bun.which('alertmanager') ?? 'prometheus-alertmanager'

export interface RealAlertmanager {
  readonly url: string
  /** host:port, for Prometheus' alertmanagers targets. */
  readonly host: string
  log(): string
  /** The alerts it holds (resolved ones are gone), with their state: active, suppressed (inhibited or silenced), unprocessed. */
  alerts(): Promise<AmAlert[]>
  stop(): Promise<void>
}

export interface AmAlert {
  labels: Record<string, string>
  status: { state: 'active' | 'suppressed' | 'unprocessed'; inhibitedBy: string[] }
}

/** One notification as the webhook got it (Alertmanager's webhook payload, version 4), and when. */
export interface Delivery {
  /** The webhook's path: the drills give each receiver its own (/page, /ticket). */
  readonly path: string
  readonly at: number
  readonly status: 'firing' | 'resolved'
  readonly receiver: string
  readonly groupLabels: Record<string, string>
  readonly alerts: readonly { status: 'firing' | 'resolved'; labels: Record<string, string> }[]
}

export interface Webhook {
  readonly url: string
  readonly deliveries: Delivery[]
  stop(): void
}

export function startWebhook(): Webhook {
  const deliveries: Delivery[] = []
  const server = Bun.serve({
    hostname: '127.0.0.1',
    port: 0,
    async fetch(request) {
      const body = await request.json() as Omit<Delivery, 'path' | 'at'>
      deliveries.push({ path: new URL(request.url).pathname, at: Date.now(), status: body.status, receiver: body.receiver, groupLabels: body.groupLabels, alerts: body.alerts.map((a) => ({ status: a.status, labels: a.labels })) })
      return new Response(null, { status: 200 })
    },
  })
  return { url: `http://127.0.0.1:${server.port}`, deliveries, stop: () => void server.stop(true) }
}

function freePort(): number {
  const probe = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: () => new Response(null) })
  const port = probe.port!
  probe.stop(true)
  return port
}

/** Starts Alertmanager with `config` (the YAML's object); resolves once it answers /-/ready. */
export async function startAlertmanager(config: unknown): Promise<RealAlertmanager> {
  const dir = mkdtempSync(join(tmpdir(), 'idem-alertmanager-'))
  await Bun.write(join(dir, 'alertmanager.yml'), Bun.YAML.stringify(config, null, 2))
  const port = freePort()
  const host = `127.0.0.1:${port}`
  const url = `http://${host}`
  const proc = Bun.spawn([ALERTMANAGER_BINARY, `--config.file=${join(dir, 'alertmanager.yml')}`, `--storage.path=${join(dir, 'data')}`,
    `--web.listen-address=${host}`, '--cluster.listen-address=', '--log.level=warn'], { stdout: 'pipe', stderr: 'pipe' })
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
  const ready = await waitUntil(async () => proc.exitCode !== null || await fetch(`${url}/-/ready`).then((r) => r.ok, () => false), 30_000, 100)
  if (!ready || proc.exitCode !== null) {
    await stop()
    throw new Error(`Alertmanager did not get ready within 30 s\n--- alertmanager log ---\n${log}`)
  }
  return {
    url,
    host,
    log: () => log,
    async alerts() {
      const answer = await fetch(`${url}/api/v2/alerts`)
      if (!answer.ok) throw new Error(`Alertmanager /api/v2/alerts: ${answer.status}`)
      return await answer.json() as AmAlert[]
    },
    stop,
  }
}
