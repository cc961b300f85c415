/**
 * Operator credentials as configuration holds them (config.ts: ADMIN_TOKENS,
 * ADMIN_TOKEN): a name and the SHA-256 of a token, never the token. Also the
 * hash the admin (admin/operators.ts) and the /metrics token check compare.
 *
 * A plain hash is enough here (no salt, no slow KDF): tokens are random
 * strings of 32 or more characters in production (~190 bits), not passwords
 * a dictionary could reach, and the hashes never leave the process.
 */
import { createHash } from 'node:crypto'

export interface OperatorCredential {
  /** Who this is, for the audit trail and the sessions list. */
  readonly name: string
  /** SHA-256 of the token (32 bytes). */
  readonly digest: Buffer
  /** True when given as a hash: its length cannot be checked. */
  readonly hashed: boolean
}

/** Operator names: short and plain, they end up in audit rows, logs and pages. */
export const OPERATOR_NAME = /^[A-Za-z0-9_.@-]{1,40}$/
/** The operator ADMIN_TOKEN stands for. */
export const DEFAULT_OPERATOR = 'admin'
/** `sha256:` then 64 hex digits: a token given by its hash. */
const HASHED = /^sha256:([0-9a-fA-F]{64})$/

export function tokenDigest(token: string): Buffer {
  return createHash('sha256').update(token, 'utf8').digest()
}

/** A credential from a name and a token, or a token's `sha256:<hex>` form. */
export function credential(name: string, secret: string): OperatorCredential {
  const hashed = HASHED.exec(secret)
  return hashed
    ? { name, digest: Buffer.from(hashed[1]!, 'hex'), hashed: true }
    : { name, digest: tokenDigest(secret), hashed: false }
}
