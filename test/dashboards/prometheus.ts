import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { prometheusRules } from '../../dashboards/alerts'

/** A real Prometheus (Debian's `prometheus`, installed by `.ci/run`), scraping one target with the given rules. */
export interface RealPrometheus {
  readonly url: string
  /** What it wrote to stderr so far: for a failure's message. */
  log(): string
  /** Its alerts of these names, as the API lists them. */
  alerts(names: readonly string[]): Promise<PromAlert[]>
  /** An instant query's first value. */
  instant(expr: string): Promise<string | undefined>
  stop(): Promise<void>
}

export interface PromAlert { labels: Record<string, string>; annotations: Record<string, string>; state: 'pending' | 'firing' }

export interface PrometheusOptions {
  /** The rule file's contents (the project's rules, adjusted by the test). */
  readonly rules: ReturnType<typeof prometheusRules>
  /** host:port of /metrics. */
  readonly target: string
  readonly scrapeInterval: string
  readonly scrapeTimeout: string
}

function freePort(): number {
  const probe = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: () => new Response(null) })
  const port = probe.port!
  probe.stop(true)
  return port
}

export async function startPrometheus(options: PrometheusOptions): Promise<RealPrometheus> {
  const dir = mkdtempSync(join(tmpdir(), 'idem-prometheus-'))
  await Bun.write(join(dir, 'rules.yml'), Bun.YAML.stringify(options.rules, null, 2))
  await Bun.write(join(dir, 'prometheus.yml'), Bun.YAML.stringify({
    global: { scrape_interval: options.scrapeInterval, evaluation_interval: '1s', scrape_timeout: options.scrapeTimeout },
    rule_files: ['rules.yml'],
    scrape_configs: [{ job_name: 'idempotent-post', static_configs: [{ targets: [options.target] }] }],
  }, null, 2))
  const port = freePort()
  const url = `http://127.0.0.1:${port}`
  const proc = Bun.spawn(['prometheus', `--config.file=${join(dir, 'prometheus.yml')}`, `--storage.tsdb.path=${join(dir, 'data')}`,
    `--web.listen-address=127.0.0.1:${port}`, '--log.level=warn'], { stdout: 'pipe', stderr: 'pipe' })
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
  const deadline = Date.now() + 30_000
  while (!(await fetch(`${url}/-/ready`).then((r) => r.ok, () => false))) {
    if (Date.now() > deadline || proc.exitCode !== null) {
      await stop()
      throw new Error(`Prometheus did not get ready within 30 s\n--- prometheus log ---\n${log}`)
    }
    await Bun.sleep(250)
  }
  return {
    url,
    log: () => log,
    async alerts(names) {
      const body = await (await fetch(`${url}/api/v1/alerts`)).json() as { data: { alerts: PromAlert[] } }
      return body.data.alerts.filter((alert) => names.includes(alert.labels.alertname!))
    },
    async instant(expr) {
      const body = await (await fetch(`${url}/api/v1/query?query=${encodeURIComponent(expr)}`)).json() as any
      return body.data?.result?.[0]?.value?.[1]
    },
    stop,
  }
}
