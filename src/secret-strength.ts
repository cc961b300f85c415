/**
 * The floor a production secret (an API key, an admin or metrics token) must
 * clear: zxcvbn's estimate of the guesses an attacker needs, at least 2^83
 * (83 bits, about 10^25).
 *
 * Why zxcvbn (its maintained TypeScript port, @zxcvbn-ts/core, with the
 * common-password and diceware lists of @zxcvbn-ts/language-common): the
 * floor before it was length times the Shannon entropy of the characters,
 * which only sees how often each character occurs, so
 * `0123456789abcdef` three times (48 characters, 16 distinct: 192 "bits") and
 * `correcthorsebatterystaplecorrecthorse` (108) passed as production API keys
 * (issue 41). zxcvbn finds what a guesser tries first: repeats, sequences,
 * keyboard walks, dates, dictionary words and common passwords, and costs the
 * rest as brute force. Measured: the first is 10^4.7 guesses, the second
 * 10^21.6, `abcd` repeated 10^2.2; over 10,000 each, the least of 32 random
 * hex digits (`openssl rand -hex 16`) was 10^27.3, of 32 random base64url
 * characters 10^30.1, of a UUID 10^32: the floor at 10^25 leaves every
 * random secret of 32 characters a margin of 100x and more (in bits: the
 * two examples are 15 and 72, random hex 91 and more, random base64url 100), and refuses a
 * typed or patterned one. A compression test was the alternative; it finds
 * repetition but no dictionary word.
 *
 * The lists (about 2 MB of JavaScript) load on the first check, which only a
 * production start makes (about 0.3 s once); a check then takes 1 to 30 ms.
 */
import type { ZxcvbnFactory } from '@zxcvbn-ts/core'

/** The floor in bits: log2 of the guesses, 2^83 being about 10^25. */
export const MIN_SECRET_BITS = 83

/** The rule in one sentence, as a refusal and the docs say it. */
export const SECRET_FLOOR_RULE =
  `a production secret must take at least 2^${MIN_SECRET_BITS} guesses (${MIN_SECRET_BITS} bits, about 10^25) by zxcvbn's estimate, which counts repeats, sequences, keyboard patterns, dates, dictionary words and common passwords as the few guesses they are`

let estimator: ZxcvbnFactory | undefined

/** Loaded on the first call: a process that checks no production secret never pays for the lists. */
function zxcvbn(): ZxcvbnFactory {
  if (estimator) return estimator
  const { ZxcvbnFactory: Factory } = require('@zxcvbn-ts/core') as typeof import('@zxcvbn-ts/core')
  const common = require('@zxcvbn-ts/language-common') as typeof import('@zxcvbn-ts/language-common')
  estimator = new Factory({ dictionary: { ...common.dictionary }, graphs: common.adjacencyGraphs })
  return estimator
}

/** log10 of the guesses zxcvbn estimates `secret` takes. */
export function secretGuessesLog10(secret: string): number {
  return zxcvbn().check(secret).guessesLog10
}

/** zxcvbn's estimate in bits: log2 of the guesses `secret` takes. */
export function secretBits(secret: string): number {
  return secretGuessesLog10(secret) * Math.log2(10)
}

/** Whether `secret` falls under the floor (SECRET_FLOOR_RULE). */
export function weakSecret(secret: string): boolean {
  return secretBits(secret) < MIN_SECRET_BITS
}
