/**
 * A real Alertmanager (Debian's `prometheus-alertmanager`, installed by
 * `.ci/run`) on its own port and storage, its cluster listener off, and a
 * webhook of the test's own that records every notification it receives.
 */
import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { freeLocalPort, startDaemon } from './daemon'

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

/** Starts Alertmanager with `config` (the YAML's object); resolves once it answers /-/ready. */
export async function startAlertmanager(config: unknown): Promise<RealAlertmanager> {
  const dir = mkdtempSync(join(tmpdir(), 'idem-alertmanager-'))
  await Bun.write(join(dir, 'alertmanager.yml'), Bun.YAML.stringify(config, null, 2))
  const host = `127.0.0.1:${freeLocalPort()}`
  const url = `http://${host}`
  const daemon = await startDaemon('Alertmanager', [ALERTMANAGER_BINARY, `--config.file=${join(dir, 'alertmanager.yml')}`, `--storage.path=${join(dir, 'data')}`,
    `--web.listen-address=${host}`, '--cluster.listen-address=', '--log.level=warn'], url, dir, 100)
  return {
    url,
    host,
    log: daemon.log,
    async alerts() {
      const answer = await fetch(`${url}/api/v2/alerts`)
      if (!answer.ok) throw new Error(`Alertmanager /api/v2/alerts: ${answer.status}`)
      return await answer.json() as AmAlert[]
    },
    stop: daemon.stop,
  }
}
