/** The audit trail: newest first, filtered, paged by entry id; or one entry. */
import type { Command } from 'commander'
import { parseAuditFilters } from '../../operations'
import { formatTime } from '../../operations/format'
import * as json from '../../operations/json'
import { positiveInt } from '../arguments'
import type { CliContext } from '../context'
import { RefusedError } from '../io'
import { visibleJson } from '../../characters'

export function addAuditCommand(program: Command, { out: { print, printJson, table }, withOperations }: CliContext): void {
  program.command('audit')
    .description('the audit trail, newest first; with an id, that one entry')
    .argument('[id]', 'one entry\'s id')
    .option('--by <actor>', 'only actors starting with this, e.g. "cli:" or "admin:alice"')
    .option('--action <action>', 'only this action: force_expire, expire_all_stale, purge_expired')
    .option('--tenant <tenant>', 'only this tenant')
    .option('--key <key>', 'only this key (exact)')
    .option('--before <id>', 'the next (older) page: the id a previous audit printed')
    .option('--limit <n>', 'how many entries', positiveInt, 20)
    .option('--json', 'print JSON, as GET /admin/api/audit (or /admin/api/audit/{id}) answers')
    .action((id: string | undefined, options: { by?: string; action?: string; tenant?: string; key?: string; before?: string; limit: number; json?: boolean }) => withOperations(async (ops) => {
      if (id !== undefined) {
        const entry = await ops.auditEntry(id)
        if (!entry) throw new RefusedError(`no audit entry ${id}`)
        if (options.json) return printJson(json.auditJson(entry))
        table([['id', entry.id], ['when', formatTime(entry.at)], ['who', entry.actor], ['action', entry.action], ['tenant', entry.tenant ?? '-'], ['key', entry.key ?? '-'], ['outcome', entry.outcome]])
        print(visibleJson(JSON.stringify(entry.detail ?? {}, null, 2)))
        return
      }
      const filters = parseAuditFilters({ actor: options.by, action: options.action, tenant: options.tenant, key: options.key, before: options.before })
      const page = await ops.audit({ ...filters, limit: options.limit })
      if (options.json) return printJson(json.auditPageJson(page))
      if (page.entries.length === 0) return print('no operator action recorded')
      table([['ID', 'WHEN (UTC)', 'WHO', 'ACTION', 'TENANT', 'KEY', 'OUTCOME'], ...page.entries.map((entry) => [
        entry.id, formatTime(entry.at), entry.actor, entry.action, entry.tenant ?? '', entry.key ?? '', entry.outcome,
      ])])
      if (page.nextBefore) print(`older: add --before ${page.nextBefore}`)
    }))
}
