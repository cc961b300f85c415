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
import { timingSafeEqual } from 'node:crypto'
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
}
