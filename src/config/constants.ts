/**
 * The named defaults and floors of the configuration, the error it throws,
 * and the production switch: what every other file of src/config/ shares.
 */
import { DEFAULT_RETENTION_SECONDS, DEFAULT_TTL_SECONDS, MIN_TTL_SECONDS } from '../core/policy'

/** Listen address; loopback unless the operator opens it up. */
export const DEFAULT_HOST = '127.0.0.1'
export const DEFAULT_PORT = 3000
/** The key lifecycle defaults live with the rest of the policy (core/policy.ts); re-exported for existing importers. */
export { DEFAULT_RETENTION_SECONDS, DEFAULT_TTL_SECONDS, MIN_TTL_SECONDS }
/** 64 KiB: a payment is under 1 KiB; anything far larger is abuse. */
export const DEFAULT_MAX_BODY_BYTES = 65_536
export const MIN_MAX_BODY_BYTES = 1024
/** 5 s: see DEFAULT_GAUGE_CACHE_MS in metrics/gauges.ts for why. */
export const DEFAULT_METRICS_CACHE_MS = 5_000
/** 1 hour: see DUPLICATE_WINDOW_SECONDS in metrics/gauges.ts for why. */
export const DEFAULT_DUPLICATE_WINDOW_SECONDS = 3_600
/** 50,000 keys: see DUPLICATE_WINDOW_KEYS in metrics/gauges.ts for why. */
export const DEFAULT_DUPLICATE_WINDOW_KEYS = 50_000
/** One minute: expired keys are harmless (a claim treats them as new), so the purge need not hurry. */
export const DEFAULT_PURGE_INTERVAL_MS = 60_000
/** Relative to the working directory, like `npm start` is run from the checkout. */
export const DEFAULT_EMBEDDED_DIR = '.data/pg'
/** Off the standard 5432, so it never collides with a PostgreSQL already installed. */
export const DEFAULT_EMBEDDED_PORT = 54329
/** Where the bundled provider simulator listens when PAYMENT_PROVIDER_URL is unset (docs/reference/settings.md). */
export const DEFAULT_PROVIDER_PORT = 3001
/** The simulator's durable ledger, relative to the working directory like the embedded data. */
export const DEFAULT_PROVIDER_LEDGER = '.data/provider/ledger.sqlite'
/** 10 000 answers: at the 1 KiB a payment's answer takes, about 10 MB per process. */
export const DEFAULT_REPLAY_CACHE_ENTRIES = 10_000
/** Ten wrong secrets a minute from one address: more than a person mistyping, far less than a guesser needs. */
export const DEFAULT_AUTH_FAILURES_PER_MINUTE = 10
/**
 * NODE_ENV=production: secrets (API keys, admin and metrics tokens) must be
 * at least this long. 32 random characters of the base64url alphabet are
 * 192 bits: out of reach of any guessing, throttled or not.
 */
export const MIN_PRODUCTION_SECRET_LENGTH = 32
/** Outside production a short admin token is only refused below this (a typo, not a choice). */
export const MIN_DEV_TOKEN_LENGTH = 8
/** The least a production secret may carry, in bits of zxcvbn's estimate (src/secret-strength.ts). */
export { MIN_SECRET_BITS as MIN_PRODUCTION_SECRET_BITS, secretBits } from '../secret-strength'
/** The key of the dev-only demo tenant, refused in production even when given explicitly. */
export const DEMO_API_KEY = 'demo-key'
/**
 * 100 requests per second per tenant and process, with bursts of 200: five
 * times the 1.7 s that 200 keys took in the attack this limit answers, and at
 * the default in-flight cap (64) a provider answering within 640 ms is never
 * the reason for a 429 (100/s × 0.64 s = 64 in flight).
 */
export const DEFAULT_TENANT_RATE_LIMIT = 100
export const DEFAULT_TENANT_RATE_BURST = 200
/**
 * 64 requests of one tenant in processing at once, per process: 8 times the
 * 8 connections of each pool (store/db.ts), so one tenant keeps every pool
 * busy only with requests it really has in flight, and a provider that hangs
 * (up to the TTL, 30 s) strands at most 64 of its requests, not thousands.
 */
export const DEFAULT_TENANT_MAX_IN_FLIGHT = 64

export type Env = Record<string, string | undefined>

/**
 * A setting the start refuses, named by its variable. `problems` holds each
 * one when several are refused at once (the message lists them all).
 */
export class ConfigError extends Error {
  readonly problems: readonly ConfigError[]
  /** Made by combined(): a list of unrelated refusals, not one refusal of several parts. */
  merged = false
  constructor(readonly variable: string, message: string, problems: readonly ConfigError[] = []) {
    super(`${variable}: ${message}`)
    this.name = 'ConfigError'
    this.problems = problems
  }
}

/** Several refusals as one error: named by the first, every one listed (one restart per mistake costs an operator an afternoon). */
export function combined(refused: readonly ConfigError[]): ConfigError {
  if (refused.length === 1) return refused[0]!
  // A refusal of several parts (production's missing settings) is listed by its parts among the others.
  const problems = refused.flatMap((problem) => (problem.problems.length > 0 ? problem.problems : [problem]))
  const lines = problems.map((problem) => `  ${problem.message.replace(/\n/g, '\n  ')}`)
  const error = new ConfigError(problems[0]!.variable, '', problems)
  error.message = `${problems.length} settings are refused:\n${lines.join('\n')}`
  error.merged = true
  return error
}

/** NODE_ENV=production in any letter case (`Production` too): a near miss must not turn the checks off. */
export function isProduction(env: Env): boolean {
  return env.NODE_ENV?.trim().toLowerCase() === 'production'
}

