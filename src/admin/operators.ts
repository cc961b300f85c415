/**
 * Named operators: who is signing in, decided by the token alone.
 *
 * ADMIN_TOKENS holds `name:token` pairs (or `name:sha256:<hex>`, the token's
 * SHA-256, so no plaintext token need sit in the environment); ADMIN_TOKEN is
 * one more operator, named "admin" (config.ts, credentials.ts). Only the
 * SHA-256 of each token is kept in memory. A presented token is hashed and
 * compared with every credential's hash in constant time, all of them every
 * time, so neither the answer's timing nor its position in the list tells
 * how close a guess came.
 */
import { createHash, timingSafeEqual } from 'node:crypto'
import { tokenDigest, type OperatorCredential } from '../credentials'

export { credential, DEFAULT_OPERATOR, tokenDigest, type OperatorCredential } from '../credentials'

export class Operators {
  readonly #credentials: readonly OperatorCredential[]

  constructor(credentials: readonly OperatorCredential[]) {
    if (credentials.length === 0) throw new Error('Operators: at least one credential is needed')
    this.#credentials = credentials
  }

  /** The operator whose token this is, or undefined. Constant time in the token and in the list. */
  identify(token: string): string | undefined {
    const digest = tokenDigest(token)
    let found: string | undefined
    for (const candidate of this.#credentials) {
      // No early exit: every credential is compared, whichever matches.
      if (timingSafeEqual(digest, candidate.digest) && found === undefined) found = candidate.name
    }
    return found
  }

  /**
   * The tag of the credential `name` signs in with now: a session keeps the
   * tag it was opened with, so it outlives neither its operator (removed from
   * ADMIN_TOKENS) nor its token (rotated). 16 bytes of a SHA-256 of the
   * token's digest: it names the credential, it opens nothing.
   */
  bindingOf(name: string): Buffer | undefined {
    const credential = this.#credentials.find((candidate) => candidate.name === name)
    return credential ? bindingTag(credential.digest) : undefined
  }

  /** Why a session of `name` opened under `binding` is no longer valid here; undefined while that credential is configured. */
  revocation(name: string, binding: Buffer | null): Revocation | undefined {
    const current = this.bindingOf(name)
    if (current === undefined) return 'operator-removed'
    if (binding === null || binding.length !== current.length || !timingSafeEqual(binding, current)) return 'token-changed'
    return undefined
  }
}

/** Why a session ended without anyone ending it: its operator left the configuration, or their token changed (or it predates the binding). */
export type Revocation = 'operator-removed' | 'token-changed'

const bindingTag = (digest: Buffer): Buffer => createHash('sha256').update('idempotent-post session binding v1\u0000').update(digest).digest().subarray(0, 16)
