/** Reading keys: list (in processing, stale first), counts, show (one key in any state). */
import type { Command } from 'commander'
import { parseKeyFilters } from '../../operations'
import { ownerText, previewText, summaryText } from '../../operations/describe'
import { formatAge, formatTime } from '../../operations/format'
import * as json from '../../operations/json'
import { MAX_PAGE_SIZE } from '../../operations/list'
import { keyFilterOptions, positiveInt } from '../arguments'
import type { CliContext } from '../context'
import { RefusedError, UsageError } from '../io'

export function addKeyCommands(program: Command, { out: { print, printJson, table }, withOperations }: CliContext): void {
  keyFilterOptions(program.command('list'))
    .description('list keys in processing, stale (older than the TTL) first')
    .option('--stale', 'only stale keys')
    .option('--limit <n>', `how many (at most ${MAX_PAGE_SIZE})`, positiveInt, 50)
    .option('--cursor <cursor>', 'the next page: the cursor a previous list printed')
    .option('--json', 'print JSON, as GET /admin/api/keys answers')
    .action((options: { tenant?: string; route?: string; key?: string; stale?: boolean; limit: number; cursor?: string; json?: boolean }) => withOperations(async (ops) => {
      if (options.limit > MAX_PAGE_SIZE) throw new UsageError(`--limit is at most ${MAX_PAGE_SIZE}`)
      const page = await ops.list(parseKeyFilters(options), { cursor: options.cursor, limit: options.limit })
      if (options.json) return printJson(json.keyPageJson(page))
      if (page.keys.length === 0) print(options.cursor ? 'no more keys' : 'no key in processing matches')
      else table([
        ['STATE', 'TENANT', 'KEY', 'ROUTE', 'AGE', 'ATTEMPTS', 'LEASE'],
        ...page.keys.map((key) => [key.stale ? 'stale' : key.workedOn ? 'running' : 'owner gone', key.tenant, key.key, `${key.method} ${key.path}`, formatAge(key.ageSeconds), String(key.attempts), key.lease]),
      ])
      if (page.nextCursor) print(`more: add --cursor ${page.nextCursor}`)
    }))

  keyFilterOptions(program.command('counts'))
    .description('count keys under the same filters as list: processing, stale, oldest, completed, past retention')
    .option('--json', 'print JSON, as GET /admin/api/counts answers')
    .action((options: { tenant?: string; route?: string; key?: string; json?: boolean }) => withOperations(async (ops) => {
      const counts = await ops.count(parseKeyFilters(options), { withDone: true })
      if (options.json) return printJson(json.countsJson(counts, ops))
      table([
        ['processing', String(counts.processing)],
        [`stale (> ${ops.ttlSeconds}s)`, String(counts.stale)],
        ['oldest processing', counts.oldestProcessingAgeSeconds === null ? '-' : formatAge(counts.oldestProcessingAgeSeconds)],
        ['completed', String(counts.done ?? 0)],
        [`past retention (> ${ops.retentionSeconds}s)`, String(counts.expired)],
      ])
    }))

  program.command('show')
    .description('one key in any state: lease, attempts, owner process, deadline, downstream key, payment')
    .argument('<tenant>', 'the key\'s tenant')
    .argument('<key>', 'the idempotency key')
    .option('--json', 'print JSON, as GET /admin/api/keys/{tenant}/{key} answers')
    .action((tenant: string, key: string, options: { json?: boolean }) => withOperations(async (ops) => {
      const detail = await ops.show(tenant, key)
      if (!detail) throw new RefusedError(`no key ${JSON.stringify(key)} of tenant ${JSON.stringify(tenant)}`)
      if (options.json) return printJson(json.keyDetailJson(detail))
      const time = (date: Date | null) => (date ? formatTime(date) : '-')
      table([
        ['tenant', detail.tenant],
        ['key', detail.key],
        ['status', detail.stale ? 'processing (stale)' : detail.status],
        ['request', `${detail.method} ${detail.path}`],
        ['attempts', String(detail.attempts)],
        ['lease', detail.lease],
        ['lease taken', `${time(detail.lockedAt)} (${formatAge(detail.ageSeconds)} ago)`],
        ['deadline', time(detail.deadline)],
        ['owner', ownerText(detail)],
        ['completed', time(detail.completedAt)],
        ['released', `${time(detail.releasedAt)}${detail.releaseReason ? ` (${detail.releaseReason})` : ''}`],
        ['summary', detail.summary ? summaryText(detail.summary) : '-'],
        ['replayed until', time(detail.retentionEndsAt)],
        ['request id', detail.httpRequestId ?? '-'],
        ['execution id', detail.requestId],
        ['downstream key', detail.downstreamKey],
        ['payment', detail.payment ? `${detail.payment.id}: ${detail.payment.amount} ${detail.payment.currency} for ${detail.payment.customer}, charge ${detail.payment.providerReference}` : '-'],
      ])
      print()
      print(previewText(detail))
    }))
}
