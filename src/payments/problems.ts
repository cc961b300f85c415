/**
 * The payments service's own problem codes, besides the plugin's generic ones
 * (http/problem.ts): what its payment provider can make it answer. The
 * provider client raises them as ProviderError codes (PROVIDER_FAILED is
 * `provider-failed`); the idempotent route answers them through its
 * `problems` (routes.ts), having released the key.
 */
import { defineProblems } from '../http/problem'

export const PAYMENT_PROBLEMS = defineProblems({
  'provider-failed': { status: 502, title: 'Payment provider failed', detail: 'The payment provider failed or refused the charge.' },
  'provider-key-conflict': { status: 502, title: 'Payment provider key conflict', detail: 'The payment provider saw our idempotency key with other parameters.' },
})
