/**
 * The settings reference is generated from the declarations and committed;
 * it fails here when stale. And the near-miss rule: what it catches, and the
 * common variables it must leave alone.
 */
import { expect, test } from 'bun:test'
import { readFileSync } from 'node:fs'
import { relative } from 'node:path'
import { loadConfig, nearMisses, SETTING_NAMES, SETTINGS } from '../../src/config'
import { REFERENCE_COMMAND, REFERENCE_PATH, renderReference } from '../../src/config/reference'

test('docs/reference/settings.md is what the declarations render', () => {
  const committed = readFileSync(REFERENCE_PATH, 'utf8')
  if (committed !== renderReference()) throw new Error(`${relative(process.cwd(), REFERENCE_PATH)} is stale: run \`${REFERENCE_COMMAND}\` and commit the result`)
  for (const name of SETTING_NAMES) expect(committed).toContain(`| \`${name}\` |`)
})

test('every declaration has one line of help and, for a number, bounds that hold its default', () => {
  for (const name of SETTING_NAMES) {
    const setting = SETTINGS[name] as { help: string; kind: string; default?: unknown; min?: number; max?: number }
    expect({ name, help: setting.help.length > 10 && !setting.help.includes('\n') }).toEqual({ name, help: true })
    if (setting.kind === 'integer') expect({ name, within: setting.min! <= (setting.default as number) && (setting.default as number) <= setting.max! }).toEqual({ name, within: true })
  }
})

test('near misses: typos and undeclared names of our prefixes, each with the setting it probably means', () => {
  const meant = (env: Record<string, string>) => Object.fromEntries(nearMisses(env).map((miss) => [miss.name, miss.meant]))
  expect(meant({ DATABSE_URL: 'x', IDEMPOTENCY_TTL_SECOND: '5', API_KEY: 'x', WORKER: '2', PAYMENT_PROVIDER_DELAY: '5', METRICS_TOKN: 'x', Port: '1', EMBEDDED_PG_DATA: 'x', ADMIN_PASSWORD: 'x' })).toEqual({
    DATABSE_URL: 'DATABASE_URL', IDEMPOTENCY_TTL_SECOND: 'IDEMPOTENCY_TTL_SECONDS', API_KEY: 'API_KEYS', WORKER: 'WORKERS', PAYMENT_PROVIDER_DELAY: 'PAYMENT_PROVIDER_DELAY_MS',
    METRICS_TOKN: 'METRICS_TOKEN', Port: 'PORT', EMBEDDED_PG_DATA: 'EMBEDDED_PG_DIR', ADMIN_PASSWORD: 'ADMIN_TOKEN',
  })
})

// Catches: a refusal in production because the shell or the platform set something ordinary.
test('near misses leave alone the declared names, common variables and the platform\'s', () => {
  const common = ['PATH', 'HOME', 'PWD', 'OLDPWD', 'USER', 'SHELL', 'TERM', 'LANG', 'LC_ALL', 'TZ', 'HOSTNAME', 'LOGNAME', 'TMPDIR', 'SHLVL', 'EDITOR', 'PAGER', 'MAIL', 'COLUMNS', 'LINES', 'DISPLAY',
    'NODE_OPTIONS', 'NODE_PATH', 'BUN_INSTALL', 'CI', 'HTTP_PROXY', 'HTTPS_PROXY', 'NO_PROXY', 'PGHOST', 'PGPORT', 'PGUSER', 'PGPASSWORD', 'PGDATABASE', 'PGSSLMODE', 'DEBUG', 'POSH', 'HOST_IP',
    'IDEMPOTENT_POST_WORKER', 'ADMIN_URL', 'KUBERNETES_SERVICE_HOST', 'KUBERNETES_PORT', 'ADMIN_SERVICE_HOST', 'ADMIN_SERVICE_PORT_HTTP', 'ADMIN_PORT_80_TCP_ADDR', 'GITHUB_ACTIONS', 'RUNNER_OS']
  const env = Object.fromEntries([...common, ...SETTING_NAMES].map((name) => [name, '']))
  env.ADMIN_PORT = 'tcp://10.0.0.7:80'
  env.METRICS_PORT = 'tcp://10.0.0.8:9090'
  expect(nearMisses(env)).toEqual([])
  // Declared names in the environment are settings, whatever their value; the loader judges the value.
  expect(loadConfig({ PATH: '/usr/bin', HOME: '/root', PWD: '/', HOSTNAME: 'box' }).warnings).toEqual([])
})
