/**
 * Reading one variable by its declaration (declarations.ts): its default
 * when unset or empty, else its value within its bounds, else a ConfigError
 * naming it. And Problems, which gathers every refusal of one start.
 */
import { combined, ConfigError, type Env } from './constants'
import { SETTINGS, type NamesOf } from './declarations'

const WHOLE = /^-?\d+$/
const FRACTION = /^\s*(\d+(\.\d*)?|\.\d+)\s*$/

function given(env: Env, name: string): string | undefined {
  const raw = env[name]
  return raw === undefined || raw.trim() === '' ? undefined : raw
}

function whole(name: string, raw: string, min: number, max: number): number {
  if (!WHOLE.test(raw.trim())) throw new ConfigError(name, `must be a whole number, got ${JSON.stringify(raw)}`)
  const value = Number(raw.trim())
  if (!Number.isSafeInteger(value) || value < min || value > max)
    throw new ConfigError(name, `must be ${max === Number.MAX_SAFE_INTEGER ? `at least ${min}` : `between ${min} and ${max}`}, got ${raw.trim()}`)
  return value
}

export function integer(env: Env, name: NamesOf<'integer'>): number {
  const setting = SETTINGS[name]
  const raw = given(env, name)
  return raw === undefined ? setting.default : whole(name, raw, setting.min, setting.max)
}

/**
 * A port, 1..65535. 0 (any free port) only where the declaration allows it
 * in tests and TEST_ALLOW_PORT_0=1; for a port that is off by default
 * (METRICS_PORT), 0 is off.
 */
export function port(env: Env, name: NamesOf<'port'>): number | undefined {
  const setting = SETTINGS[name]
  const raw = given(env, name)
  if (raw === undefined) return setting.default
  const value = whole(name, raw, 0, 65535)
  if (value !== 0) return value
  if (setting.default === undefined) return undefined
  if ('anyInTests' in setting && env.TEST_ALLOW_PORT_0 === '1') return 0
  throw new ConfigError(name, 'must be between 1 and 65535, got 0')
}

export function fraction(env: Env, name: NamesOf<'fraction'>): number {
  const raw = given(env, name)
  if (raw === undefined) return SETTINGS[name].default
  if (!FRACTION.test(raw)) throw new ConfigError(name, `must be a number from 0 to 1, got ${JSON.stringify(raw)}`)
  const value = Number(raw)
  if (value > 1) throw new ConfigError(name, `must be from 0 to 1, got ${raw.trim()}`)
  return value
}

/** 0 or 1 (unset: 0). */
export function flag(env: Env, name: NamesOf<'flag'>): boolean {
  const raw = given(env, name)
  return raw !== undefined && whole(name, raw, 0, 1) === 1
}

/** Trimmed, or the declared default when unset or blank. */
export function text(env: Env, name: NamesOf<'text'>): string | undefined {
  const setting = SETTINGS[name]
  const raw = env[name]?.trim()
  if (raw) {
    if ('choices' in setting && !(setting.choices as readonly string[]).includes(raw.toLowerCase())) throw new ConfigError(name, `must be one of ${setting.choices.join(', ')}, got ${JSON.stringify(raw.slice(0, 32))}`)
    return raw
  }
  return setting.default
}

/** A removed setting set to anything but 0 refuses the start: a script of an older release fails loudly instead of going on without it. */
export function refuseRemoved(env: Env, name: NamesOf<'removed'>): void {
  const raw = env[name]?.trim()
  if (raw && raw !== '0') throw new ConfigError(name, `was removed: ${SETTINGS[name].help.replace(/^Removed: /, '').replace(/; set, it refuses the start\.$/, '')}`)
}

/**
 * Every refusal of one start, at most one per variable (the first said of
 * it), thrown together at the end: fixing one setting and restarting to
 * learn of the next costs a restart per mistake.
 */
export class Problems {
  readonly list: ConfigError[] = []
  private readonly named = new Set<string>()

  add(error: ConfigError): void {
    if (error.merged) {
      for (const problem of error.problems) this.add(problem)
      return
    }
    const variables = [error.variable, ...error.problems.map((problem) => problem.variable)]
    if (variables.some((variable) => this.named.has(variable))) return
    for (const variable of variables) this.named.add(variable)
    this.list.push(error)
  }

  /** Whether `variable` is refused already (a check that depends on it is moot). */
  has(variable: string): boolean {
    return this.named.has(variable)
  }

  /** `read()`, or `fallback` with its refusal noted. */
  take<T>(read: () => T, fallback: T): T {
    try {
      return read()
    } catch (error) {
      if (!(error instanceof ConfigError)) throw error
      this.add(error)
      return fallback
    }
  }

  throwIfAny(): void {
    if (this.list.length > 0) throw combined(this.list)
  }
}
