import { mkdtempSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import type { prometheusRules } from '../../dashboards/alerts'
import { freeLocalPort, startDaemon } from '../support/daemon'

/** A real Prometheus (Debian's `prometheus`, installed by `.ci/run`), scraping one target with the given rules. */
export interface RealPrometheus {
  readonly url: string
  /** What it wrote to stderr so far: for a failure's message. */
  log(): string
  /** Its alerts of these names, as the API lists them. */
  alerts(names: readonly string[]): Promise<PromAlert[]>
  /** An instant query's first value. */
  instant(expr: string): Promise<string | undefined>
  /** An instant query's every series, with its labels and value. */
  query(expr: string): Promise<{ metric: Record<string, string>; value: number }[]>
  /** The scrape targets Prometheus has, with their last scrape (undefined before the first). */
  targets(): Promise<PromTarget[]>
  stop(): Promise<void>
}

export interface PromAlert { labels: Record<string, string>; annotations: Record<string, string>; state: 'pending' | 'firing'; activeAt?: string; value?: string }
export interface PromTarget { job: string; instance: string; health: string; lastScrape: number | undefined }

export interface PrometheusOptions {
  /** The rule file's contents (the project's rules, adjusted by the test). */
  readonly rules: ReturnType<typeof prometheusRules>
  /** host:port of /metrics. */
  readonly target: string
  readonly scrapeInterval: string
  readonly scrapeTimeout: string
}

export interface ScrapeJob {
  readonly job: string
  /** host:port of each target's /metrics. */
  readonly targets: readonly string[]
  readonly interval: string
  readonly timeout: string
}

/** Several scrape jobs, each at its own interval, and several rule files (each with its groups' own intervals). */
export interface PrometheusSetup {
  readonly ruleFiles: readonly ReturnType<typeof prometheusRules>[]
  readonly jobs: readonly ScrapeJob[]
  /** For rule groups without an `interval:` of their own. @default '1s' */
  readonly evaluationInterval?: string
  /** host:port of each Alertmanager it sends its alerts to. @default none */
  readonly alertmanagers?: readonly string[]
}

export async function startPrometheus(options: PrometheusOptions): Promise<RealPrometheus> {
  return startPrometheusWith({
    ruleFiles: [options.rules],
    jobs: [{ job: 'idempotent-post', targets: [options.target], interval: options.scrapeInterval, timeout: options.scrapeTimeout }],
  })
}

export async function startPrometheusWith(setup: PrometheusSetup): Promise<RealPrometheus> {
  const dir = mkdtempSync(join(tmpdir(), 'idem-prometheus-'))
  const ruleFiles = setup.ruleFiles.map((_, i) => `rules-${i}.yml`)
  for (const [i, rules] of setup.ruleFiles.entries()) await Bun.write(join(dir, ruleFiles[i]!), Bun.YAML.stringify(rules, null, 2))
  await Bun.write(join(dir, 'prometheus.yml'), Bun.YAML.stringify({
    global: { evaluation_interval: setup.evaluationInterval ?? '1s' },
    rule_files: ruleFiles,
    ...(setup.alertmanagers?.length ? { alerting: { alertmanagers: [{ api_version: 'v2', static_configs: [{ targets: setup.alertmanagers }] }] } } : {}),
    scrape_configs: setup.jobs.map((job) => ({ job_name: job.job, scrape_interval: job.interval, scrape_timeout: job.timeout, static_configs: [{ targets: job.targets }] })),
  }, null, 2))
  const port = freeLocalPort()
  const url = `http://127.0.0.1:${port}`
  const daemon = await startDaemon('Prometheus', ['prometheus', `--config.file=${join(dir, 'prometheus.yml')}`, `--storage.tsdb.path=${join(dir, 'data')}`,
    `--web.listen-address=127.0.0.1:${port}`, '--log.level=warn'], url, dir, 250)
  return {
    url,
    log: daemon.log,
    async alerts(names) {
      const body = await (await fetch(`${url}/api/v1/alerts`)).json() as { data: { alerts: PromAlert[] } }
      return body.data.alerts.filter((alert) => names.includes(alert.labels.alertname!))
    },
    async instant(expr) {
      const body = await (await fetch(`${url}/api/v1/query?query=${encodeURIComponent(expr)}`)).json() as any
      return body.data?.result?.[0]?.value?.[1]
    },
    async query(expr) {
      const body = await (await fetch(`${url}/api/v1/query?query=${encodeURIComponent(expr)}`)).json() as any
      if (body.status !== 'success') throw new Error(`${expr}: ${body.error}`)
      return (body.data.result as { metric: Record<string, string>; value: [number, string] }[]).map((r) => ({ metric: r.metric, value: Number(r.value[1]) }))
    },
    async targets() {
      const body = await (await fetch(`${url}/api/v1/targets?state=active`)).json() as any
      return (body.data.activeTargets as any[]).map((t) => {
        const at = Date.parse(t.lastScrape)
        return { job: t.labels.job, instance: t.labels.instance, health: t.health, lastScrape: at > 0 ? at : undefined }
      })
    },
    stop: daemon.stop,
  }
}
