/**
 * The secrets: API keys, operator tokens, the metrics token. None is ever
 * part of a message: an entry is named by its position and its tenant or
 * operator, never by its text.
 */
import { credential, DEFAULT_OPERATOR, OPERATOR_NAME, tokenDigest, type OperatorCredential } from '../credentials'
import { ConfigError, DEMO_API_KEY, MIN_DEV_TOKEN_LENGTH, MIN_PRODUCTION_SECRET_BITS, MIN_PRODUCTION_SECRET_LENGTH, secretBits, type Env } from './constants'

const LOW_ENTROPY = `looks typed or patterned (fewer than ${MIN_PRODUCTION_SECRET_BITS} bits by zxcvbn's estimate: repeats, sequences and words count as few guesses); NODE_ENV=production needs a random one, e.g. openssl rand -base64 32`
export function apiKeys(env: Env, production: boolean): { keys: Map<string, string>; demo: boolean } {
  const raw = env.API_KEYS
  if (raw === undefined || raw.trim() === '') {
    if (production) throw new ConfigError('API_KEYS', 'must be set when NODE_ENV=production (the demo key is dev-only)')
    return { keys: new Map([[DEMO_API_KEY, 'demo']]), demo: true }
  }
  const keys = new Map<string, string>()
  for (const [index, entry] of raw.split(',').entries()) {
    const match = /^([A-Za-z0-9_.-]{1,64}):([!-~]{1,256})$/.exec(entry.trim())
    // The entry is named by its position, never shown: it holds a key.
    if (!match) throw new ConfigError('API_KEYS', `every entry must be tenant:key (tenant of letters, digits, _ . -; key of 1 to 256 printable characters), entry ${index + 1} is not`)
    const [, tenant, key] = match as unknown as [string, string, string]
    if (keys.has(key)) throw new ConfigError('API_KEYS', `the same key is given twice`)
    if (production && key === DEMO_API_KEY) throw new ConfigError('API_KEYS', `tenant "${tenant}" has the demo key, which NODE_ENV=production refuses`)
    if (production && key.length < MIN_PRODUCTION_SECRET_LENGTH)
      throw new ConfigError('API_KEYS', `tenant "${tenant}"'s key is ${key.length} characters; NODE_ENV=production needs at least ${MIN_PRODUCTION_SECRET_LENGTH}`)
    if (production && secretBits(key) < MIN_PRODUCTION_SECRET_BITS) throw new ConfigError('API_KEYS', `tenant "${tenant}"'s key ${LOW_ENTROPY}`)
    keys.set(key, tenant)
  }
  return { keys, demo: false }
}

/**
 * ADMIN_TOKENS (`name:token,...`, a token also as `sha256:<hex>`) and
 * ADMIN_TOKEN (operator "admin"). Names and tokens must be distinct: the
 * token alone says who signs in.
 */
export function operators(env: Env, production: boolean): { operators: OperatorCredential[]; generated: string | undefined } {
  const list: OperatorCredential[] = []
  const short = (variable: string, name: string, length: number) => {
    const min = production ? MIN_PRODUCTION_SECRET_LENGTH : MIN_DEV_TOKEN_LENGTH
    if (length < min)
      throw new ConfigError(variable, `operator "${name}"'s token is ${length} characters; ${production ? 'NODE_ENV=production needs' : 'the minimum is'} at least ${min}`)
  }
  const add = (variable: string, name: string, secret: string) => {
    const entry = credential(name, secret)
    if (!entry.hashed) short(variable, name, secret.length)
    if (!entry.hashed && production && secretBits(secret) < MIN_PRODUCTION_SECRET_BITS) throw new ConfigError(variable, `operator "${name}"'s token ${LOW_ENTROPY}`)
    if (list.some((other) => other.name === name)) throw new ConfigError(variable, `operator "${name}" is given twice`)
    if (list.some((other) => other.digest.equals(entry.digest))) throw new ConfigError(variable, `operator "${name}" has the same token as another operator`)
    list.push(entry)
  }
  const single = env.ADMIN_TOKEN?.trim()
  if (single) add('ADMIN_TOKEN', DEFAULT_OPERATOR, single)
  const named = env.ADMIN_TOKENS?.trim()
  if (named) {
    for (const [index, entry] of named.split(',').entries()) {
      const match = /^([^:]+):([!-~]{1,512})$/.exec(entry.trim())
      // Named by its position (and its operator, when that part is a name), never shown: it holds a token.
      if (!match || !OPERATOR_NAME.test(match[1]!)) {
        const name = /^([A-Za-z0-9_.@-]{1,40}):/.exec(entry.trim())?.[1]
        throw new ConfigError('ADMIN_TOKENS', `every entry must be name:token or name:sha256:<64 hex digits> (name of letters, digits, _ . @ -), entry ${index + 1}${name ? ` (operator "${name}")` : ''} is not`)
      }
      add('ADMIN_TOKENS', match[1]!, match[2]!)
    }
  }
  if (list.length > 0) return { operators: list, generated: undefined }
  if (production) throw new ConfigError('ADMIN_TOKEN', 'ADMIN_TOKEN or ADMIN_TOKENS must be set when NODE_ENV=production (no random token is made)')
  const generated = randomToken()
  return { operators: [credential(DEFAULT_OPERATOR, generated)], generated }
}

export function secret(env: Env, name: string, production: boolean): string | undefined {
  const raw = env[name]?.trim()
  if (!raw) return undefined
  const min = production ? MIN_PRODUCTION_SECRET_LENGTH : MIN_DEV_TOKEN_LENGTH
  if (raw.length < min || !/^[!-~]+$/.test(raw))
    throw new ConfigError(name, `must be at least ${min} printable characters${production ? ' when NODE_ENV=production' : ''}, got ${raw.length}`)
  if (production && secretBits(raw) < MIN_PRODUCTION_SECRET_BITS) throw new ConfigError(name, LOW_ENTROPY)
  return raw
}

/**
 * One secret in two roles (a tenant's API key that is also an operator's
 * token, or the metrics token): whoever holds it for one role holds the
 * other, and rotating it for one breaks the other. Compared by digest.
 */
export function refuseSharedRoles(apiKeys: ReadonlyMap<string, string>, operators: readonly OperatorCredential[], metricsToken: string | undefined): void {
  const tenantOf = new Map([...apiKeys].map(([key, tenant]) => [tokenDigest(key).toString('hex'), tenant]))
  for (const operator of operators) {
    const tenant = tenantOf.get(operator.digest.toString('hex'))
    if (tenant !== undefined) throw new ConfigError(operator.name === DEFAULT_OPERATOR ? 'ADMIN_TOKEN' : 'ADMIN_TOKENS', `operator "${operator.name}"'s token is tenant "${tenant}"'s API key: one secret, one role`)
  }
  if (metricsToken === undefined) return
  const digest = tokenDigest(metricsToken).toString('hex')
  const tenant = tenantOf.get(digest)
  if (tenant !== undefined) throw new ConfigError('METRICS_TOKEN', `is tenant "${tenant}"'s API key: one secret, one role`)
  const operator = operators.find((candidate) => candidate.digest.toString('hex') === digest)
  if (operator) throw new ConfigError('METRICS_TOKEN', `is operator "${operator.name}"'s token: one secret, one role`)
}

function randomToken(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(24))
  return Buffer.from(bytes).toString('base64url')
}

