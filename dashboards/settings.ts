/**
 * Build-time settings of `npm run dashboards`: where the links in the alerts
 * and the dashboard point. One setting, the service's external URL
 * (ADMIN_URL, or `--admin-url`), validated once, frozen; a bad value stops the
 * build naming it. The committed files are built with the default
 * (test/dashboards/generated.test.ts checks them); build your copies with
 * your URL into another folder (docs/how-to/monitoring.md).
 */
import { DEFAULT_HOST, DEFAULT_PORT } from '../src/config'
import { SCRAPE_JOB } from './queries'

/** The service as `npm start` serves it on this machine: right for a local try, to be overridden everywhere else. */
export const DEFAULT_ADMIN_URL = `http://${DEFAULT_HOST}:${DEFAULT_PORT}`

export interface BuildSettings {
  /**
   * External URL of the service (ADMIN_URL or --admin-url), without a
   * trailing slash. The one setting every link derives from: the admin page
   * (`${adminUrl}/admin?...`) and the runbooks the service serves
   * (`${adminUrl}/admin/runbooks/<alert>`), so an alert client can open both.
   */
  readonly adminUrl: string
  /**
   * The `job` label of the scrape job that scrapes this service (SCRAPE_JOB
   * or --job, default `idempotent-post`): every alert reads this job only,
   * and keeps it (and the instance, where one instance is the cause) as a
   * label, so another service's 5xx never pages for this one; the dashboard's
   * Job variable starts on it.
   */
  readonly job: string
}

export const DEFAULT_SETTINGS: BuildSettings = Object.freeze({ adminUrl: DEFAULT_ADMIN_URL, job: SCRAPE_JOB })

export class SettingsError extends Error {
  constructor(readonly variable: string, message: string) {
    super(`${variable} ${message}`)
    this.name = 'SettingsError'
  }
}

/** The runbook of `alert` as the service serves it (src/admin/runbooks.ts), absolute. */
export function runbookUrl(settings: BuildSettings, alert: string): string {
  return `${settings.adminUrl}/admin/runbooks/${alert}`
}

export function settingsFromEnv(env: Record<string, string | undefined> = process.env, flags: { adminUrl?: string | undefined; job?: string | undefined } = {}): BuildSettings {
  if (env.RUNBOOK_BASE_URL?.trim())
    throw new SettingsError('RUNBOOK_BASE_URL', 'is gone: the service serves the runbooks at ADMIN_URL/admin/runbooks/<alert>; set ADMIN_URL (or --admin-url) only')
  const [name, raw] = flags.adminUrl !== undefined ? ['--admin-url', flags.adminUrl.trim()] : ['ADMIN_URL', env.ADMIN_URL?.trim() || DEFAULT_ADMIN_URL]
  const [jobName, jobRaw] = flags.job !== undefined ? ['--job', flags.job.trim()] : ['SCRAPE_JOB', env.SCRAPE_JOB?.trim() || SCRAPE_JOB]
  return Object.freeze({ adminUrl: adminUrl(raw, name), job: scrapeJob(jobRaw, jobName) })
}

/** A label value we put in PromQL between double quotes and in templates: no quoting needed, none allowed. */
function scrapeJob(raw: string, name: string): string {
  if (!/^[A-Za-z0-9_.:/-]{1,128}$/.test(raw))
    throw new SettingsError(name, `must be a scrape job name of letters, digits and _ . : / - (up to 128), got ${JSON.stringify(raw)}`)
  return raw
}

function adminUrl(raw: string, name: string): string {
  let url: URL
  try {
    url = new URL(raw)
  } catch {
    throw new SettingsError(name, `must be the service's external http:// or https:// URL, got ${JSON.stringify(raw)}`)
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new SettingsError(name, `must be an http:// or https:// URL, got ${JSON.stringify(raw)}`)
  if (url.search || url.hash) throw new SettingsError(name, `must have no query or fragment (the alerts add /admin?...), got ${JSON.stringify(raw)}`)
  if (/[\s"'<>{}]/.test(raw)) throw new SettingsError(name, `must contain no white space, quotes, angle brackets or braces (it goes into alert templates), got ${JSON.stringify(raw)}`)
  return raw.replace(/\/+$/, '')
}
