import { IdempotencyError } from '../core/errors'

/** The payment provider refused or failed: answered 502, the key released for a retry. */
export class ProviderError extends IdempotencyError {
  constructor() {
    super('PROVIDER_FAILED', 502, 'the payment provider failed')
  }
}

export interface ProviderOptions {
  /** Simulated latency of every call. */
  readonly delayMs: number
  /** Share (0..1) of calls that fail. */
  readonly failureRate: number
  /** Injectable for tests. @default Math.random */
  readonly random?: () => number
}

/** A simulated payment provider: the external side effect that must happen once. */
export function createProvider(options: ProviderOptions) {
  const random = options.random ?? Math.random
  return async function charge(): Promise<{ reference: string }> {
    if (options.delayMs > 0) await Bun.sleep(options.delayMs)
    if (options.failureRate > 0 && random() < options.failureRate) throw new ProviderError()
    return { reference: `ch_${crypto.randomUUID().replaceAll('-', '')}` }
  }
}

export type Charge = ReturnType<typeof createProvider>
