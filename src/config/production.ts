/**
 * What NODE_ENV=production requires of the settings, beyond each one's own
 * rules: the settings it needs set (declared with `required` in
 * declarations.ts), said all at once.
 */
import { ConfigError, type Env } from './constants'
import { SETTING_NAMES, SETTINGS, type Setting, type SettingName } from './declarations'

const unset = (env: Env, name: string): boolean => !env[name]?.trim()

/** The settings production requires, in declaration order. */
export const REQUIRED_IN_PRODUCTION = SETTING_NAMES.flatMap((name) => {
  const { required } = SETTINGS[name] as Setting
  return required ? [{ name, ...required }] : []
}) as readonly { readonly name: SettingName; readonly because: string; readonly orElse?: string }[]

/**
 * What production needs and a first deployment most often lacks, said all at
 * once: one start that names DATABASE_URL, the next PAYMENT_PROVIDER_URL, the
 * next API_KEYS... cost an operator a restart per setting. One error (its
 * parts in `problems`), or undefined when nothing is missing.
 */
export function missingForProduction(env: Env): ConfigError | undefined {
  const missing = REQUIRED_IN_PRODUCTION
    .filter(({ name, orElse }) => unset(env, name) && (orElse === undefined || unset(env, orElse)))
    .map(({ name, because, orElse }) => orElse
      ? new ConfigError(name, `${name} or ${orElse} must be set (${because})`)
      : new ConfigError(name, `must be set (${because})`))
  if (missing.length === 0) return undefined
  if (missing.length === 1) {
    const [only] = missing as [ConfigError]
    return new ConfigError(only.variable, `${only.message.slice(only.variable.length + 2).replace(/ \(/, ' when NODE_ENV=production (')}`)
  }
  return new ConfigError(missing[0]!.variable, `NODE_ENV=production needs ${missing.length} more settings:\n${missing.map((error) => `  ${error.message}`).join('\n')}`, missing)
}

/** Production charges only over TLS, or to this host (a sidecar that adds TLS). */
export function refusePlainProvider(provider: URL | undefined, loopback: (host: string) => boolean): void {
  if (provider?.protocol === 'http:' && !loopback(provider.hostname))
    throw new ConfigError('PAYMENT_PROVIDER_URL', 'must be https:// when NODE_ENV=production (plain http:// only to this host, e.g. a sidecar that adds TLS)')
}
