import { Counter, type Registry } from 'prom-client'
import { errorText, log as rootLog, type Logger } from './log'

/**
 * The last resort: an error nobody handled is logged and counted, and the
 * process keeps serving (invariant 9). Bun, like Node, exits on an unhandled
 * rejection; one bad connection must not end every request of the process.
 *
 * Nothing may rely on this: every path handles its own promises, and the
 * fault tests assert that `idempotency_unhandled_errors_total` stays 0. A
 * non-zero value is a bug to fix, which is why it is counted, not hidden.
 */
export function installLastResort(registry: Registry, log: Logger = rootLog): () => void {
  const counter = new Counter({
    name: 'idempotency_unhandled_errors_total',
    help: 'Errors no code path handled (an unhandled rejection or an uncaught exception); the process logged them and kept serving. Always a bug.',
    labelNames: ['kind'] as const,
    registers: [registry],
  })
  counter.inc({ kind: 'rejection' }, 0)
  counter.inc({ kind: 'exception' }, 0)
  const onRejection = (reason: unknown) => {
    counter.inc({ kind: 'rejection' })
    log.error('unhandled rejection (kept serving)', { error: reason instanceof Error ? reason : errorText(reason) })
  }
  const onException = (error: Error) => {
    counter.inc({ kind: 'exception' })
    log.error('uncaught exception (kept serving)', { error })
  }
  process.on('unhandledRejection', onRejection)
  process.on('uncaughtException', onException)
  return () => {
    process.off('unhandledRejection', onRejection)
    process.off('uncaughtException', onException)
  }
}
