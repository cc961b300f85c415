/**
 * A picture of the dashboard with real data, without a Grafana: starts a
 * server and a Prometheus (1 s scrapes), drives a mix of traffic for a while
 * (fresh payments, replays, 409s, 422s, 400s, provider failures, a worker
 * killed mid-request, a client that makes a new key per retry), then draws
 * every panel of idempotency-dashboard.json from Prometheus' answers to its
 * own queries and screenshots the page with chromium.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/test bun dashboards/preview.ts [seconds]
 *
 * Writes docs/dashboard-preview.png. This is our drawing of the panels, not
 * Grafana's: same layout, queries, units and thresholds, simpler looks.
 */
import { mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { chromium } from 'playwright-core'
import { createTestDatabase } from '../test/support/db'
import { payment, postPayment } from '../test/support/http'
import { startServer } from '../test/support/server'
import { OUTPUTS } from './build'

const SECONDS = Number(process.argv[2] ?? 120)
const OUT = join(import.meta.dir, '..', 'docs', 'dashboard-preview.png')
const COLORS = ['#73bf69', '#f2cc0c', '#5794f2', '#ff9830', '#f2495c', '#b877d9', '#8ab8ff', '#ffcb7d']

interface Target { expr: string; legendFormat?: string }
interface Panel {
  type: string; title: string; gridPos: { x: number; y: number; w: number; h: number }; targets?: Target[]
  fieldConfig?: { defaults?: { unit?: string; thresholds?: { steps: { value: number | null; color: string }[] } } }
}

function freePort(): number {
  const probe = Bun.serve({ hostname: '127.0.0.1', port: 0, fetch: () => new Response(null) })
  const port = probe.port!
  probe.stop(true)
  return port
}

function format(value: number, unit = 'none'): string {
  if (!Number.isFinite(value)) return String(value)
  if (unit === 'percentunit') return `${(value * 100).toFixed(1)}%`
  if (unit === 's') return value < 1 ? `${(value * 1000).toFixed(value < 0.01 ? 2 : 0)} ms` : `${value.toFixed(1)} s`
  const n = Number.isInteger(value) ? String(value) : Math.abs(value) >= 100 ? value.toFixed(0) : Math.abs(value) >= 10 ? value.toFixed(1) : value.toFixed(2)
  return unit === 'reqps' ? `${n} req/s` : unit === 'ops' ? `${n} ops/s` : n.replace(/\.00$/, '')
}

const escape = (text: string) => text.replace(/[&<>"]/g, (c) => `&#${c.charCodeAt(0)};`)

async function main() {
  const db = await createTestDatabase('dashboard_preview')
  const dir = mkdtempSync(join(tmpdir(), 'idem-preview-'))
  const env = { IDEMPOTENCY_TTL_SECONDS: '5', PAYMENT_PROVIDER_DELAY_MS: '30', PAYMENT_PROVIDER_FAILURE_RATE: '0.03', METRICS_CACHE_MS: '500' }
  const server = await startServer(db.url, env)
  const port = freePort()
  const prometheusUrl = `http://127.0.0.1:${port}`
  await Bun.write(join(dir, 'prometheus.yml'), Bun.YAML.stringify({
    global: { scrape_interval: '1s', evaluation_interval: '1s' },
    scrape_configs: [{ job_name: 'idempotent-post', static_configs: [{ targets: [new URL(server.url).host] }] }],
  }))
  const prometheus = Bun.spawn(['prometheus', `--config.file=${join(dir, 'prometheus.yml')}`, `--storage.tsdb.path=${join(dir, 'data')}`,
    `--web.listen-address=127.0.0.1:${port}`, '--log.level=warn'], { stdout: 'ignore', stderr: 'ignore' })
  try {
    for (let i = 0; i < 120 && !(await fetch(`${prometheusUrl}/-/ready`).then((r) => r.ok, () => false)); i++) await Bun.sleep(250)
    const start = Date.now() / 1000
    await traffic(server.url, db.url, SECONDS * 1000)
    await Bun.sleep(3000)
    const end = Date.now() / 1000
    const html = await render(prometheusUrl, start, end)
    const browser = await chromium.launch({ executablePath: process.env.CHROMIUM_PATH ?? '/usr/bin/chromium', args: ['--headless', '--no-sandbox', '--disable-gpu'] })
    try {
      const page = await browser.newPage({ viewport: { width: 1600, height: 1000 } })
      await page.setContent(html)
      await page.screenshot({ path: OUT, fullPage: true })
    } finally {
      await browser.close()
    }
    console.log(`wrote ${OUT}`)
  } finally {
    prometheus.kill('SIGTERM')
    await prometheus.exited
    await server.stop()
    await db.drop()
    rmSync(dir, { recursive: true, force: true })
  }
}

/** A mix of what a real service sees, at a few dozen requests per second. */
async function traffic(url: string, databaseUrl: string, ms: number): Promise<void> {
  const until = Date.now() + ms
  let victimKilled = false
  const keys: string[] = []
  let n = 0
  while (Date.now() < until) {
    const phase = 1 - (until - Date.now()) / ms
    const batch: Promise<unknown>[] = []
    for (let i = 0; i < 6; i++) {
      const key = crypto.randomUUID()
      keys.push(key)
      batch.push(postPayment(url, payment({ amount: 100 + (n++ % 5000) }), { key }))
    }
    const old = keys[Math.floor(Math.random() * keys.length)]!
    batch.push(postPayment(url, payment({ amount: 100 + keys.indexOf(old) }), { key: old })) // a retry: replay (or 422)
    if (n % 30 < 6) { // a double tap: the second is a 409 while the first runs
      const key = crypto.randomUUID()
      const body = payment({ customer: 'tap', amount: n })
      batch.push(postPayment(url, body, { key }), Bun.sleep(5).then(() => postPayment(url, body, { key })))
    }
    if (n % 60 < 6) batch.push(postPayment(url, { amount: -1 }), postPayment(url, payment(), { apiKey: 'wrong' }))
    if (phase > 0.5 && n % 90 < 6) // a client that makes a new key per retry
      for (let r = 0; r < 2; r++) batch.push(postPayment(url, payment({ customer: `new-key-per-retry-${n}` }), { key: crypto.randomUUID() }))
    if (!victimKilled && phase > 0.25) {
      victimKilled = true
      void strandKey(databaseUrl)
    }
    await Promise.all(batch)
    await Bun.sleep(150)
  }
}

/** A second server takes a payment whose provider never answers, and is SIGKILLed. */
async function strandKey(databaseUrl: string): Promise<void> {
  const victim = await startServer(databaseUrl, { IDEMPOTENCY_TTL_SECONDS: '5', PAYMENT_PROVIDER_DELAY_MS: '600000' })
  for (const customer of ['stranded-1', 'stranded-2']) void postPayment(victim.url, payment({ customer }), { apiKey: 'globex-key' }).catch(() => undefined)
  await Bun.sleep(500)
  victim.proc.kill('SIGKILL')
}

async function render(prometheusUrl: string, start: number, end: number): Promise<string> {
  const dashboard = JSON.parse(readFileSync(OUTPUTS.dashboard, 'utf8')) as { title: string; panels: Panel[] }
  const COL = 1600 / 24
  const ROW = 30
  const step = Math.max(1, Math.round((end - start) / 200))
  const parts: string[] = []
  let height = 0
  for (const panel of dashboard.panels) {
    const { x, y, w, h } = panel.gridPos
    const box = { left: x * COL + 4, top: y * ROW + 4, width: w * COL - 8, height: h * ROW - 8 }
    height = Math.max(height, box.top + box.height)
    const style = `left:${box.left}px;top:${box.top}px;width:${box.width}px;height:${box.height}px`
    if (panel.type === 'row') {
      parts.push(`<div class="row" style="${style}">${escape(panel.title)}</div>`)
      continue
    }
    const unit = panel.fieldConfig?.defaults?.unit
    const queries = (panel.targets ?? []).map((t) => ({ ...t, expr: t.expr.replaceAll('$__rate_interval', '15s').replaceAll('$job', '.*').replaceAll('$instance', '.*') }))
    if (panel.type === 'stat') {
      const body = await (await fetch(`${prometheusUrl}/api/v1/query?query=${encodeURIComponent(queries[0]!.expr)}&time=${end}`)).json() as any
      const value = Number(body.data.result[0]?.value[1] ?? 0)
      const steps = panel.fieldConfig?.defaults?.thresholds?.steps ?? []
      const color = steps.filter((s) => s.value === null || value >= s.value).at(-1)?.color ?? 'green'
      parts.push(`<div class="panel stat ${color}" style="${style}"><div class="title">${escape(panel.title)}</div><div class="big">${format(value, unit)}</div></div>`)
      continue
    }
    const series: { name: string; points: [number, number][] }[] = []
    for (const query of queries) {
      const body = await (await fetch(`${prometheusUrl}/api/v1/query_range?query=${encodeURIComponent(query.expr)}&start=${start}&end=${end}&step=${step}`)).json() as any
      for (const result of body.data?.result ?? []) {
        const name = (query.legendFormat ?? '').replace(/\{\{(\w+)\}\}/g, (_: string, label: string) => result.metric[label] ?? '')
        series.push({ name, points: result.values.map(([t, v]: [number, string]) => [t, Number(v)]).filter(([, v]: [number, number]) => Number.isFinite(v)) })
      }
    }
    parts.push(`<div class="panel" style="${style}"><div class="title">${escape(panel.title)}</div>${chart(series, start, end, box.width - 16, box.height - 58, unit)}</div>`)
  }
  return `<!doctype html><meta charset="utf-8"><style>
    body{margin:0;background:#111217;font:13px system-ui,sans-serif;color:#ccccdc}
    h1{font-size:18px;font-weight:500;margin:0;padding:16px 12px;height:28px}
    .vars{position:absolute;right:12px;top:18px;color:#8e8e9e}
    .panel,.row{position:absolute;box-sizing:border-box}
    .panel{background:#181b1f;border:1px solid #2b2f36;border-radius:3px;padding:6px 8px}
    .row{font-size:15px;font-weight:500;padding-top:6px;border-bottom:1px solid #2b2f36}
    .title{font-weight:500;margin-bottom:4px}
    .stat .big{font-size:44px;font-weight:600;text-align:center;margin-top:24px;color:#fff}
    .stat.green{background:#1a7f4b}.stat.red{background:#c4162a}
    .legend{font-size:11px;margin-top:2px}.legend span{margin-right:12px;white-space:nowrap}
  </style><h1>${escape(dashboard.title)}</h1><div class="vars">datasource: Prometheus · job: All · instance: All · last ${Math.round(end - start)} s</div>
  <div style="position:relative;height:${height + 10}px">${parts.join('\n')}</div>`
}

function chart(series: { name: string; points: [number, number][] }[], start: number, end: number, width: number, height: number, unit?: string): string {
  if (series.length === 0) return `<svg width="${width}" height="${height}"><text x="${width / 2}" y="${height / 2}" fill="#8e8e9e" text-anchor="middle">No data</text></svg>`
  const max = Math.max(1e-3, ...series.flatMap((s) => s.points.map(([, v]) => v))) * 1.1
  const X = (t: number) => 72 + ((t - start) / (end - start)) * (width - 78)
  const Y = (v: number) => 4 + (1 - v / max) * (height - 20)
  const grid = [0, 0.5, 1].map((f) => `<line x1="72" x2="${width}" y1="${Y(max * f / 1.1)}" y2="${Y(max * f / 1.1)}" stroke="#2b2f36"/><text x="68" y="${Y(max * f / 1.1) + 4}" fill="#8e8e9e" font-size="10" text-anchor="end">${format(max * f / 1.1, unit)}</text>`).join('')
  const lines = series.map((s, i) => `<polyline fill="none" stroke="${COLORS[i % COLORS.length]}" stroke-width="1.5" points="${s.points.map(([t, v]) => `${X(t).toFixed(1)},${Y(v).toFixed(1)}`).join(' ')}"/>`).join('')
  const legend = series.map((s, i) => `<span style="color:${COLORS[i % COLORS.length]}">■</span><span>${escape(s.name || 'value')}</span>`).join('')
  return `<svg width="${width}" height="${height}">${grid}${lines}</svg><div class="legend">${legend}</div>`
}

await main()
