/**
 * Every alert leads somewhere: its runbook section (which must exist), the
 * admin page (filtered by tenant when it has one), its labels and value in
 * the text, and in Grafana the dashboard panel it belongs to.
 */
import { expect, test } from 'bun:test'
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ALERTS, ASSUMED_SCRAPE_INTERVAL_SECONDS, EVALUATION_INTERVAL_SECONDS, GRAFANA_PROVIDER_SCRAPE_INTERVAL_SECONDS, OUTAGE_FOR_SECONDS, PROVIDER_SLOW_SLACK_SECONDS, RULE_GROUPS, providerSlowDetection, providerSlowThreshold, OUTAGE_PAGE_WITHIN_SECONDS, STALE_KEYS_FOR_SECONDS, outageDetection, staleKeyDetection } from '../../dashboards/alert-definitions'
import { OUTPUTS } from '../../dashboards/build'
import { DEFAULT_ADMIN_URL, SettingsError, settingsFromEnv } from '../../dashboards/settings'
import { loadRunbooks, OPERATORS_GUIDE } from '../../src/admin/runbooks'
import { DEFAULT_TTL_SECONDS } from '../../src/config'
import { executionBudgetMs } from '../../src/core/policy'
import { metricNames } from './promql'

const ROOT = join(import.meta.dir, '..', '..')
const RUNBOOK = OPERATORS_GUIDE

/** GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens. */
function anchors(markdown: string): Map<string, string> {
  const sections = new Map<string, string>()
  const lines = markdown.split('\n')
  lines.forEach((line, index) => {
    const heading = /^(#{1,6})\s+(.*)$/.exec(line)
    if (!heading) return
    const level = heading[1]!.length
    const end = lines.findIndex((next, i) => i > index && /^#{1,6}\s/.test(next) && /^#+/.exec(next)![0].length <= level)
    const slug = heading[2]!.trim().toLowerCase().replace(/[^\p{L}\p{N}\s_-]/gu, '').replace(/\s/g, '-')
    sections.set(slug, lines.slice(index + 1, end === -1 ? undefined : end).join('\n'))
  })
  return sections
}

/** Every rule of every group (the provider alert has a group of its own). */
const prometheusRules = () => (Bun.YAML.parse(readFileSync(OUTPUTS.prometheusRules, 'utf8')) as any).groups.flatMap((group: any) => group.rules) as any[]
const grafanaRules = () => (Bun.YAML.parse(readFileSync(OUTPUTS.grafanaAlerts, 'utf8')) as any).groups.flatMap((group: any) => group.rules) as any[]

test('every rule, Prometheus and Grafana, has an absolute runbook_url: the page the service serves from its runbook section in docs/how-to/on-call.md', () => {
  const sections = anchors(readFileSync(RUNBOOK, 'utf8'))
  const served = loadRunbooks(readFileSync(RUNBOOK, 'utf8'))
  const rules = [
    ...prometheusRules().map((rule) => ({ name: `Prometheus ${rule.alert}`, annotations: rule.annotations })),
    ...grafanaRules().map((rule) => ({ name: `Grafana ${rule.title}`, annotations: rule.annotations })),
  ]
  expect(rules).toHaveLength(ALERTS.length * 2)
  for (const { name, annotations } of rules) {
    const url: string | undefined = annotations?.runbook_url
    const alert = /^http:\/\/127\.0\.0\.1:3000\/admin\/runbooks\/([A-Za-z]+)$/.exec(url ?? '')?.[1]
    expect({ name, url, absolute: alert !== undefined }).toEqual({ name, url, absolute: true })
    expect({ name, served: served.has(alert!) }).toEqual({ name, served: true })
    const anchor = alert!.toLowerCase()
    expect({ name, anchor, exists: sections.has(anchor) }).toEqual({ name, anchor, exists: true })
    const section = sections.get(anchor)!
    for (const part of ['What it means', 'What to check', 'What to click'])
      expect({ name, part, present: section.includes(`**${part}`) }).toEqual({ name, part, present: true })
  }
})

/** The labels each alert carries when it fires, as the promtool tests pin them (severity aside). */
function firedLabels(): Map<string, Set<string>> {
  const file = Bun.YAML.parse(readFileSync(join(ROOT, 'dashboards', 'prometheus-rules.test.yml'), 'utf8')) as any
  const labels = new Map<string, Set<string>>()
  for (const t of file.tests) for (const check of t.alert_rule_test ?? []) for (const alert of check.exp_alerts) {
    const names = labels.get(check.alertname) ?? new Set<string>()
    for (const label of Object.keys(alert.exp_labels)) if (label !== 'severity') names.add(label)
    labels.set(check.alertname, names)
  }
  return labels
}

test('every alert links to the admin page (filtered by tenant when it has one) and says its labels and value', () => {
  const labelsOf = firedLabels()
  for (const [system, rules, value] of [['Prometheus', prometheusRules(), '$value'], ['Grafana', grafanaRules(), '$values.B.Value']] as const) {
    for (const rule of rules) {
      const name = `${system} ${rule.alert ?? rule.title}`
      const { admin_url: admin, description, summary, runbook_url: runbook } = rule.annotations
      const expr: string = rule.expr ?? rule.data[0].model.expr
      expect({ name, admin: admin.startsWith(`${DEFAULT_ADMIN_URL}/admin`) }).toEqual({ name, admin: true })
      if (/by \([^)]*tenant/.test(expr)) expect({ name, admin }).toEqual({ name, admin: expect.stringContaining('?tenant={{ $labels.tenant }}') })
      expect({ name, links: description.includes(admin) && description.includes(runbook) }).toEqual({ name, links: true })
      const text = `${summary} ${description}`
      expect({ name, value: text.includes(value) }).toEqual({ name, value: true })
      for (const label of labelsOf.get(rule.alert ?? rule.title) ?? [])
        expect({ name, label, said: text.includes(`$labels.${label}`) }).toEqual({ name, label, said: true })
    }
  }
  const stale = prometheusRules().find((rule) => rule.alert === 'IdempotencyStaleProcessingKeys')
  expect(stale.annotations.admin_url).toBe(`${DEFAULT_ADMIN_URL}/admin?tenant={{ $labels.tenant }}&stale=1`)
})

test('every Grafana alert carries the dashboard and the panel it belongs to, and that panel shows what it measures', () => {
  const dashboard = JSON.parse(readFileSync(OUTPUTS.dashboard, 'utf8'))
  const panels = new Map<number, any>(dashboard.panels.filter((panel: any) => panel.type !== 'row').map((panel: any) => [panel.id, panel]))
  for (const rule of grafanaRules()) {
    const { __dashboardUid__: uid, __panelId__: id } = rule.annotations
    expect({ alert: rule.title, uid, fileUid: rule.dashboardUid }).toEqual({ alert: rule.title, uid: dashboard.uid, fileUid: dashboard.uid })
    expect({ alert: rule.title, id, fileId: rule.panelId }).toEqual({ alert: rule.title, id: String(rule.panelId), fileId: expect.any(Number) })
    const panel = panels.get(Number(id))
    expect({ alert: rule.title, panel: panel?.title }).toEqual({ alert: rule.title, panel: ALERTS.find((alert) => alert.name === rule.title)!.panel })
    const shown = new Set(panel.targets.flatMap((target: any) => metricNames(target.expr)))
    for (const name of metricNames(rule.data[0].model.expr)) expect({ alert: rule.title, metric: name, shown: shown.has(name) }).toEqual({ alert: rule.title, metric: name, shown: true })
  }
})

test('with the defaults, a stale key alerts within TTL + 2 minutes of its worker\'s death, as its runbook says', () => {
  const time = staleKeyDetection()
  expect(time.ttlSeconds).toBe(DEFAULT_TTL_SECONDS)
  expect(time.firingSeconds).toBeLessThanOrEqual(DEFAULT_TTL_SECONDS + 120)
  expect(time.notifiedSeconds).toBeLessThanOrEqual(DEFAULT_TTL_SECONDS + 120)
  // The rule files hold the timings the computation assumes.
  const prometheus = (Bun.YAML.parse(readFileSync(OUTPUTS.prometheusRules, 'utf8')) as any).groups.find((group: any) => group.name === RULE_GROUPS.main.name)
  expect(prometheus.interval).toBe(`${EVALUATION_INTERVAL_SECONDS}s`)
  expect(prometheus.rules.find((rule: any) => rule.alert === 'IdempotencyStaleProcessingKeys').for).toBe(`${STALE_KEYS_FOR_SECONDS}s`)
  const runbook = anchors(readFileSync(RUNBOOK, 'utf8')).get('idempotencystaleprocessingkeys')!
  expect(runbook).toContain(`at most **${time.firingSeconds} s**`)
  expect(runbook).toContain(`at most **${time.notifiedSeconds} s**`)
})

test('the outage alerts (5xx share, readiness) page within 2 minutes of a database outage with the defaults, as their runbooks say', () => {
  const time = outageDetection()
  expect(time.notifiedSeconds).toBeLessThanOrEqual(OUTAGE_PAGE_WITHIN_SECONDS)
  const rules = prometheusRules()
  for (const name of ['IdempotencyServerErrorsHigh', 'IdempotencyNotReady']) {
    const rule = rules.find((candidate: any) => candidate.alert === name)
    expect({ name, for: rule.for, severity: rule.labels.severity }).toEqual({ name, for: `${OUTAGE_FOR_SECONDS}s`, severity: 'page' })
    const runbook = anchors(readFileSync(RUNBOOK, 'utf8')).get(name.toLowerCase())!
    expect({ name, said: runbook.includes(`at most **${time.notifiedSeconds} s**`) }).toEqual({ name, said: true })
  }
})

test('one setting, ADMIN_URL or --admin-url, is validated, and `npm run dashboards -- [--admin-url URL] <folder>` writes every link from it', async () => {
  expect(settingsFromEnv({})).toEqual({ adminUrl: DEFAULT_ADMIN_URL, job: 'idempotent-post' })
  expect(settingsFromEnv({ SCRAPE_JOB: 'payments-eu' }, { job: 'payments-us' }).job).toBe('payments-us')
  expect(() => settingsFromEnv({ SCRAPE_JOB: 'a"b' })).toThrow(/^SCRAPE_JOB /)
  expect(settingsFromEnv({ ADMIN_URL: 'https://pay.example.com/' }).adminUrl).toBe('https://pay.example.com')
  expect(settingsFromEnv({ ADMIN_URL: 'https://a.example' }, { adminUrl: 'https://b.example' }).adminUrl).toBe('https://b.example')
  expect(() => settingsFromEnv({ ADMIN_URL: 'pay.example.com' })).toThrow(SettingsError)
  expect(() => settingsFromEnv({ ADMIN_URL: 'ftp://pay.example.com' })).toThrow(/^ADMIN_URL /)
  expect(() => settingsFromEnv({}, { adminUrl: 'https://pay.example.com/{{ x }}' })).toThrow(/^--admin-url /)
  expect(() => settingsFromEnv({ RUNBOOK_BASE_URL: 'https://wiki/ops' })).toThrow(/^RUNBOOK_BASE_URL /)

  const folder = mkdtempSync(join(tmpdir(), 'idem-dashboards-'))
  try {
    const committed = readFileSync(OUTPUTS.prometheusRules, 'utf8')
    for (const [how, args, env] of [
      ['env', [folder], { ...process.env, ADMIN_URL: 'https://pay.example.com' }],
      ['flag', ['--admin-url', 'https://pay.example.com', folder], { ...process.env, ADMIN_URL: '' }],
    ] as const) {
      const build = Bun.spawn(['bun', join(ROOT, 'dashboards', 'build.ts'), ...args], { env, stdout: 'pipe', stderr: 'pipe' })
      expect({ how, code: await build.exited }).toEqual({ how, code: 0 })
      const rules = Bun.YAML.parse(readFileSync(join(folder, 'prometheus-rules.yml'), 'utf8')) as any
      const stale = rules.groups.flatMap((group: any) => group.rules).find((rule: any) => rule.alert === 'IdempotencyStaleProcessingKeys')
      expect(stale.annotations.admin_url).toBe('https://pay.example.com/admin?tenant={{ $labels.tenant }}&stale=1')
      expect(stale.annotations.runbook_url).toBe('https://pay.example.com/admin/runbooks/IdempotencyStaleProcessingKeys')
      expect(readFileSync(join(folder, 'grafana-alerts.yml'), 'utf8')).toContain('https://pay.example.com/admin/runbooks/IdempotencyNotReady')
      const board = JSON.parse(readFileSync(join(folder, 'idempotency-dashboard.json'), 'utf8'))
      expect(board.links.map((link: any) => link.url)).toEqual(['https://pay.example.com/admin', 'https://pay.example.com/admin/released?reason=deadline', 'https://pay.example.com/admin/runbooks'])
      expect(readFileSync(join(folder, 'prometheus-rules.yml'), 'utf8')).not.toContain('127.0.0.1')
    }
    expect(readFileSync(OUTPUTS.prometheusRules, 'utf8')).toBe(committed) // the committed files keep the defaults

    const bad = Bun.spawn(['bun', join(ROOT, 'dashboards', 'build.ts'), folder], { env: { ...process.env, ADMIN_URL: 'nope' }, stdout: 'pipe', stderr: 'pipe' })
    expect(await bad.exited).toBe(2)
    expect(await new Response(bad.stderr).text()).toContain('ADMIN_URL')
  } finally {
    rmSync(folder, { recursive: true, force: true })
  }
})

// Catches: a threshold, a scrape or an evaluation interval that lets the provider alert fire after the
// first request waiting on a hung provider has reached its deadline (it used to fire 30-50 s into a hang,
// against a 28 s deadline).
test('IdempotencyProviderSlow fires before the first deadline by construction: threshold + scrape + evaluation + slack < deadline, read from the generated rules, for every TTL from 25 s', () => {
  const prometheus = Bun.YAML.parse(readFileSync(OUTPUTS.prometheusRules, 'utf8')) as any
  const grafana = Bun.YAML.parse(readFileSync(OUTPUTS.grafanaAlerts, 'utf8')) as any
  const groupOf = (file: any) => file.groups.find((group: any) => group.rules.some((rule: any) => (rule.alert ?? rule.title) === 'IdempotencyProviderSlow'))
  const seconds = (duration: string) => Number(/^(\d+)s$/.exec(duration)![1])
  // The threshold as each file computes it: clamp(TTL * share - headroom, min, max), per instance.
  const THRESHOLD = /^max by \(job, instance\) \(idempotency_provider_oldest_call_seconds\{job="idempotent-post"\}\) > on \(job, instance\) clamp\(max by \(job, instance\) \(idempotency_ttl_seconds\{job="idempotent-post"\}\) \* ([\d.]+) - ([\d.]+), ([\d.]+), ([\d.]+)\)$/
  const systems = [
    { system: 'prometheus' as const, group: groupOf(prometheus), expr: (rule: any) => rule.expr, scrape: ASSUMED_SCRAPE_INTERVAL_SECONDS },
    { system: 'grafana' as const, group: groupOf(grafana), expr: (rule: any) => rule.data[0].model.expr, scrape: GRAFANA_PROVIDER_SCRAPE_INTERVAL_SECONDS },
  ]
  for (const { system, group, expr, scrape } of systems) {
    const rule = group.rules.find((candidate: any) => (candidate.alert ?? candidate.title) === 'IdempotencyProviderSlow')
    expect({ system, for: rule.for }).toEqual({ system, for: '0s' })
    const [share, headroom, min, max] = THRESHOLD.exec(expr(rule))!.slice(1).map(Number) as [number, number, number, number]
    const evaluation = seconds(group.interval)
    const holds: number[] = []
    for (let ttl = 1; ttl <= 3600; ttl++) {
      const threshold = Math.min(max, Math.max(min, ttl * share - headroom))
      const firing = threshold + scrape + evaluation + PROVIDER_SLOW_SLACK_SECONDS
      if (firing < executionBudgetMs(ttl) / 1000) holds.push(ttl)
      expect({ system, ttl, threshold }).toEqual({ system, ttl, threshold: providerSlowThreshold(ttl) })
    }
    // It holds from 25 s on, for every TTL (the runbook says so), and not below (the floor of 1 s takes over).
    expect({ system, from: holds[0], every: holds.length }).toEqual({ system, from: 25, every: 3600 - 25 + 1 })
    // The default TTL, as the runbook's table adds it up.
    const time = providerSlowDetection(DEFAULT_TTL_SECONDS, system)
    expect({ system, evaluation, scrape }).toEqual({ system, evaluation: time.evaluationSeconds, scrape: time.scrapeSeconds })
    expect(time.marginSeconds).toBeGreaterThan(0)
  }
  const time = providerSlowDetection()
  expect({ threshold: time.thresholdSeconds, firing: time.firingSeconds, deadline: time.deadlineSeconds }).toEqual({ threshold: 5, firing: 26, deadline: 28 })
  const runbook = anchors(readFileSync(RUNBOOK, 'utf8')).get('idempotencyproviderslow')!
  for (const said of [`at most **${time.firingSeconds} s**`, `**${time.deadlineSeconds} s**`, `**${time.thresholdSeconds} s**`, 'every TTL of **25 s** or more'])
    expect({ said, in: runbook.includes(said) }).toEqual({ said, in: true })
  // The documented scrape interval the construction counts on: the example config in docs/how-to/monitoring.md.
  expect(readFileSync(join(ROOT, 'docs', 'how-to', 'monitoring.md'), 'utf8')).toContain(`scrape_interval: ${ASSUMED_SCRAPE_INTERVAL_SECONDS}s`)
})
