/**
 * dashboards/alertmanager.yml as Alertmanager's own tool reads it: valid
 * (`amtool check-config`), and routing each alert of ours to the receiver of
 * its severity (`amtool config routes test`). Its staleness is checked with
 * the other generated files (generated.test.ts); the drills with a real
 * Alertmanager are in prometheus-drills.test.ts.
 */
import { expect, test } from 'bun:test'
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { ALERTS, providerSlowDetection } from '../../dashboards/alert-definitions'
import { INHIBITIONS, PAGE_GROUP_WAIT_SECONDS, RECEIVERS, RECEIVER_PLACEHOLDERS, UNROUTED_RECEIVER } from '../../dashboards/alertmanager'
import { OUTPUTS } from '../../dashboards/build'
import { SCRAPE_JOB } from '../../dashboards/queries'
import { drillAlertmanagerConfig, type Variant } from './alertmanager-variants'

const FILE = OUTPUTS.alertmanager

/** amtool's exit code and standard output (its warnings, on stderr, are left out). */
function amtool(...args: string[]): { code: number; out: string } {
  const run = Bun.spawnSync(['amtool', ...args], { stdout: 'pipe', stderr: 'pipe' })
  return { code: run.exitCode, out: run.stdout.toString() }
}

test('amtool check-config accepts dashboards/alertmanager.yml', () => {
  const { code, out } = amtool('check-config', FILE)
  expect({ code, out }).toEqual({ code: 0, out: expect.stringContaining('SUCCESS') })
  expect(out).toContain(`${INHIBITIONS.length} inhibit rules`)
})

test('every alert of ours reaches the receiver of its severity; another job\'s alerts reach none of ours', () => {
  const routed = ALERTS.map((alert) => {
    const labels = [`job=${SCRAPE_JOB}`, `alertname=${alert.name}`, `severity=${alert.severity}`, 'instance=10.0.0.1:3000', 'tenant=acme']
    return { alert: alert.name, receiver: amtool('config', 'routes', 'test', `--config.file=${FILE}`, ...labels).out.trim() }
  })
  expect(routed).toEqual(ALERTS.map((alert) => ({ alert: alert.name, receiver: RECEIVERS[alert.severity] })))
  expect(amtool('config', 'routes', 'test', `--config.file=${FILE}`, 'job=another-team', 'severity=page', 'alertname=IdempotencyNotReady').out.trim()).toBe(UNROUTED_RECEIVER)
})

test('pages wait less than the provider page\'s margin before its deadline; resolutions are sent; receivers are placeholders to fill in', () => {
  const config = Bun.YAML.parse(readFileSync(FILE, 'utf8')) as any
  const page = config.route.routes[0].routes.find((route: any) => route.receiver === RECEIVERS.page)
  expect(page.group_wait).toBe(`${PAGE_GROUP_WAIT_SECONDS}s`)
  expect(PAGE_GROUP_WAIT_SECONDS).toBeLessThanOrEqual(providerSlowDetection().marginSeconds)
  const hooks = config.receivers.flatMap((receiver: any) => receiver.webhook_configs ?? [])
  expect(hooks).toEqual([{ url: RECEIVER_PLACEHOLDERS.page, send_resolved: true }, { url: RECEIVER_PLACEHOLDERS.ticket, send_resolved: true }])
  for (const hook of hooks) expect(new URL(hook.url).hostname.endsWith('.invalid')).toBe(true)
})

test('the drills\' copies, shipped and broken, are configurations Alertmanager accepts: a drill fails for their routing, not for a typo', () => {
  const dir = mkdtempSync(join(tmpdir(), 'idem-am-variants-'))
  try {
    const checked = (['shipped', 'no-inhibition', 'default-timings', 'defaults', 'one-route'] as Variant[]).map((variant) => {
      const file = join(dir, `${variant}.yml`)
      writeFileSync(file, Bun.YAML.stringify(drillAlertmanagerConfig('http://127.0.0.1:9', [SCRAPE_JOB, 'idempotent-post-at-15s'], variant), null, 2))
      return { variant, code: amtool('check-config', file).code }
    })
    expect(checked.filter((c) => c.code !== 0)).toEqual([])
  } finally {
    rmSync(dir, { recursive: true, force: true })
  }
})
