/**
 * A variable that is almost a setting's name (`DATABSE_URL`,
 * `IDEMPOTENCY_TTL_SECOND`) is a setting the operator believes is set and is
 * not: the service would run on the default. Production refuses such a start
 * (load.ts); elsewhere it is a warning. Only names are compared; a value is
 * never read (it may be a secret).
 */
import { ConfigError, type Env } from './constants'
import { NOT_SETTINGS, SETTING_NAMES, type SettingName } from './declarations'

/**
 * The prefixes only this project's settings carry: any other variable with
 * one is a setting that does not exist, however far from every name.
 */
export const PROJECT_PREFIXES = ['IDEMPOTENCY_', 'PAYMENT_PROVIDER_', 'EMBEDDED_PG_', 'ADMIN_', 'METRICS_'] as const
/**
 * The shortest declared name a near miss is looked for by distance alone:
 * at 4 characters (`PORT`, `HOST`) two edits turn a name into common
 * variables of every shell (`PWD`, `HOME`, `POSH`), so only the prefixes
 * catch those.
 */
export const MIN_NAME_LENGTH = 5
/** Up to 7 characters one edit (`WORKER`, `PGSSL_`), from 8 two (`DATABSE_URL`, `API_KEY`). */
const maxDistance = (length: number): number => (length >= 8 ? 2 : 1)

export interface NearMiss {
  /** The variable as set. */
  readonly name: string
  /** The setting it most likely means. */
  readonly meant: SettingName
}

/** Edit distance with adjacent transpositions (optimal string alignment): `DATABSAE` is one edit from `DATABASE`. */
export function editDistance(a: string, b: string): number {
  const rows = Array.from({ length: a.length + 1 }, (_, i) => Array.from({ length: b.length + 1 }, (_, j) => (i === 0 ? j : j === 0 ? i : 0)))
  for (let i = 1; i <= a.length; i++) {
    for (let j = 1; j <= b.length; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1
      let best = Math.min(rows[i - 1]![j]! + 1, rows[i]![j - 1]! + 1, rows[i - 1]![j - 1]! + cost)
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) best = Math.min(best, rows[i - 2]![j - 2]! + 1)
      rows[i]![j] = best
    }
  }
  return rows[a.length]![b.length]!
}

/**
 * Kubernetes puts a variable per service into every pod (`METRICS_PORT=tcp://10.0.0.7:9090`,
 * `ADMIN_SERVICE_HOST`): a service named like one of our prefixes is no typo of ours.
 */
function serviceLink(name: string, value: string | undefined): boolean {
  return /_SERVICE_(HOST|PORT)(_|$)|_PORT_\d+_(TCP|UDP|SCTP)(_|$)/.test(name) || (/_PORT$/.test(name) && /^(tcp|udp|sctp):\/\//.test(value?.trim() ?? ''))
}

function nearest(name: string, among: readonly SettingName[]): { meant: SettingName; distance: number } | undefined {
  let best: { meant: SettingName; distance: number } | undefined
  for (const meant of among) {
    const distance = editDistance(name, meant)
    if (!best || distance < best.distance) best = { meant, distance }
  }
  return best
}

/** Every variable of `env` that is no setting but looks meant as one, with the setting it probably means. */
export function nearMisses(env: Env): NearMiss[] {
  const known = new Set<string>([...SETTING_NAMES, ...NOT_SETTINGS])
  const found: NearMiss[] = []
  for (const [name, value] of Object.entries(env)) {
    if (value === undefined || known.has(name) || serviceLink(name, value)) continue
    const upper = name.toUpperCase()
    if (known.has(upper)) {
      if (SETTING_NAMES.includes(upper as SettingName)) found.push({ name, meant: upper as SettingName })
      continue
    }
    const prefix = PROJECT_PREFIXES.find((candidate) => upper.startsWith(candidate))
    if (prefix) {
      const sameFamily = SETTING_NAMES.filter((setting) => setting.startsWith(prefix))
      const guess = nearest(upper, SETTING_NAMES)!
      const family = nearest(upper, sameFamily)
      found.push({ name, meant: family && family.distance <= guess.distance + 2 ? family.meant : guess.meant })
      continue
    }
    const long = SETTING_NAMES.filter((setting) => setting.length >= MIN_NAME_LENGTH)
    const guess = nearest(upper, long)
    if (guess && guess.distance <= maxDistance(guess.meant.length)) found.push({ name, meant: guess.meant })
  }
  return found
}

export function describeNearMiss({ name, meant }: NearMiss): string {
  return `${name} is not a setting; did you mean ${meant}? Rename it to ${meant}, or unset it (bun src/main.ts --help lists every setting)`
}

/** Production: each near miss refuses the start, named by the variable as set. */
export function nearMissRefusals(env: Env): ConfigError[] {
  return nearMisses(env).map((miss) => new ConfigError(miss.name, `is not a setting, and NODE_ENV=production refuses a near miss of one: did you mean ${miss.meant}? Rename it to ${miss.meant}, or unset it`))
}
