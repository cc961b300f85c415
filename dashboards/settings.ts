/**
 * Build-time settings of `npm run dashboards`: where the links in the alerts
 * point. Read from the environment once, validated, frozen; a bad value stops
 * the build naming the variable. The committed files are built with the
 * defaults (test/dashboards/generated.test.ts checks them); build your own
 * copies with your URLs into another folder (docs/observability.md).
 */
import { DEFAULT_HOST, DEFAULT_PORT } from '../src/config'
import { DEFAULT_TTL_SECONDS } from '../src/core/policy'

/**
 * The TTL the generated dashboard and alert texts assume (thresholds such as
 * "oldest processing age above the TTL is stale", "30 s by default"): the
 * service's default, from the one policy module, never typed again here.
 */
export const ASSUMED_TTL_SECONDS = DEFAULT_TTL_SECONDS

/** The service as `npm start` serves it on this machine: right for a local try, to be overridden everywhere else. */
export const DEFAULT_ADMIN_URL = `http://${DEFAULT_HOST}:${DEFAULT_PORT}`
/**
 * The runbook as a path from the repository root: readable in a checkout and
 * resolved by code hosts that render relative links. Point it at your
 * rendered copy (a wiki, the repo's web view) for a clickable link.
 */
export const DEFAULT_RUNBOOK_BASE_URL = 'docs/operators.md'

export interface BuildSettings {
  /** External URL of the service (ADMIN_URL), without a trailing slash: alerts link to `${adminUrl}/admin?...`. */
  readonly adminUrl: string
  /** docs/operators.md as operators reach it (RUNBOOK_BASE_URL); alerts link to `${runbookBaseUrl}#<alert anchor>`. */
  readonly runbookBaseUrl: string
}

export const DEFAULT_SETTINGS: BuildSettings = Object.freeze({ adminUrl: DEFAULT_ADMIN_URL, runbookBaseUrl: DEFAULT_RUNBOOK_BASE_URL })

export class SettingsError extends Error {
  constructor(readonly variable: string, message: string) {
    super(`${variable} ${message}`)
    this.name = 'SettingsError'
  }
}

export function settingsFromEnv(env: Record<string, string | undefined> = process.env): BuildSettings {
  return Object.freeze({
    adminUrl: adminUrl(env.ADMIN_URL?.trim() || DEFAULT_ADMIN_URL),
    runbookBaseUrl: runbookBaseUrl(env.RUNBOOK_BASE_URL?.trim() || DEFAULT_RUNBOOK_BASE_URL),
  })
}

function adminUrl(raw: string): string {
  let url: URL
  try {
    url = new URL(raw)
  } catch {
    throw new SettingsError('ADMIN_URL', `must be the service's external http:// or https:// URL, got ${JSON.stringify(raw)}`)
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') throw new SettingsError('ADMIN_URL', `must be an http:// or https:// URL, got ${JSON.stringify(raw)}`)
  if (url.search || url.hash) throw new SettingsError('ADMIN_URL', `must have no query or fragment (the alerts add /admin?...), got ${JSON.stringify(raw)}`)
  return raw.replace(/\/+$/, '')
}

function runbookBaseUrl(raw: string): string {
  if (raw.includes('#')) throw new SettingsError('RUNBOOK_BASE_URL', `must have no #fragment (each alert adds its own anchor), got ${JSON.stringify(raw)}`)
  if (/\s/.test(raw)) throw new SettingsError('RUNBOOK_BASE_URL', `must contain no white space, got ${JSON.stringify(raw)}`)
  return raw
}
