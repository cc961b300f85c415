/** Keys released after a failed execution, by reason (above all after their deadline: the provider may have charged). */
import type { Command } from 'commander'
import { RELEASE_REASONS } from '../../core/release'
import { parseReleaseReason } from '../../operations'
import { summaryText } from '../../operations/describe'
import { formatTime } from '../../operations/format'
import * as json from '../../operations/json'
import { MAX_PAGE_SIZE } from '../../operations/list'
import { positiveInt } from '../arguments'
import type { CliContext } from '../context'
import { UsageError } from '../io'

export function addReleasedCommand(program: Command, { out: { print, printJson, table }, withOperations }: CliContext): void {
  program.command('released')
    .description('keys released after a failed execution, newest first; by default those released after their deadline, whose provider call may have charged (ask the provider with the downstream key)')
    .option('--reason <reason>', `${RELEASE_REASONS.join(', ')} (default: deadline)`)
    .option('--tenant <tenant>', 'only this tenant')
    .option('--limit <n>', `how many (at most ${MAX_PAGE_SIZE})`, positiveInt, 50)
    .option('--cursor <cursor>', 'the next page: the cursor a previous run printed')
    .option('--json', 'print JSON, as GET /admin/api/released answers')
    .action((options: { reason?: string; tenant?: string; limit: number; cursor?: string; json?: boolean }) => withOperations(async (ops) => {
      if (options.limit > MAX_PAGE_SIZE) throw new UsageError(`--limit is at most ${MAX_PAGE_SIZE}`)
      const reason = parseReleaseReason(options.reason)
      const tenant = options.tenant?.trim() || undefined
      const [page, counts] = await Promise.all([ops.listReleased({ reason, tenant }, { cursor: options.cursor, limit: options.limit }), ops.countReleased(tenant)])
      if (options.json) return printJson(json.releasedPageJson(page, counts))
      if (page.keys.length === 0) print(`no key released with reason ${reason}`)
      else table([
        ['RELEASED (UTC)', 'TENANT', 'KEY', 'ATTEMPTS', 'SUMMARY', 'DOWNSTREAM KEY'],
        ...page.keys.map((key) => [formatTime(key.releasedAt), key.tenant, key.key, String(key.attempts), key.summary ? summaryText(key.summary) : '-', key.downstreamKey]),
      ])
      if (page.nextCursor) print(`more: add --cursor ${page.nextCursor}`)
    }))
}
