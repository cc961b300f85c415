/**
 * What changes keys: expire (one key), expire-stale, purge. Each shows what
 * it would do and asks (io.ts confirmed) unless --yes; --dry-run only shows;
 * the actor comes from the OS user (actor.ts), resolved before anything is done.
 */
import type { Command } from 'commander'
import { parseKeyFilters } from '../../operations'
import { ownerText, previewText } from '../../operations/describe'
import { formatAge, formatTime } from '../../operations/format'
import * as json from '../../operations/json'
import { resolveActor } from '../actor'
import { lease } from '../arguments'
import type { CliContext } from '../context'
import { confirmed, EXIT, RefusedError } from '../io'
import { printable } from '../output'

export function addActionCommands(program: Command, { io, state, out: { print, printJson }, withOperations }: CliContext): void {
  program.command('expire')
    .description('force-expire one processing key (refused while a live worker holds it within its deadline); asks first unless --yes')
    .argument('<tenant>', 'the key\'s tenant')
    .argument('<key>', 'the idempotency key')
    .option('--lease <lease>', 'act only if the key still has this lease (as listed); default: its current lease', lease)
    .option('--yes', 'do it without asking (needed when not run in a terminal)')
    .option('--dry-run', 'show what it would do, change nothing')
    .option('--actor <name>', 'who you are, noted in the audit trail beside your OS user')
    .option('--json', 'print JSON, as POST /admin/api/keys/expire answers (with --dry-run: the key, as GET /admin/api/keys/{tenant}/{key})')
    .action((tenant: string, key: string, options: { lease?: string; yes?: boolean; dryRun?: boolean; actor?: string; json?: boolean }) => {
      const actor = options.dryRun ? undefined : resolveActor(options.actor, io)
      return withOperations(async (ops) => {
        const detail = await ops.show(tenant, key)
        if (!detail || detail.status !== 'processing') throw new RefusedError(`no key ${JSON.stringify(key)} of tenant ${JSON.stringify(tenant)} is in processing; nothing done`)
        const seen = options.lease ?? detail.lease
        const what = [
          `tenant ${detail.tenant}, key ${detail.key}, ${detail.method} ${detail.path}, lease ${seen}${seen === detail.lease ? '' : ` (its current lease is ${detail.lease}: it would be left alone)`}`,
          `in processing for ${formatAge(detail.ageSeconds)}, attempts ${detail.attempts}; owner: ${ownerText(detail)}`,
          previewText(detail),
        ].map(printable).join('\n')
        if (options.dryRun) {
          if (options.json) return printJson({ dry_run: true, key: json.keyDetailJson(detail) })
          return print(`dry run, nothing done:\n${what}`)
        }
        await confirmed(io, options.yes, what)
        const result = await ops.forceExpire({ tenant, key, lease: seen }, actor!)
        if (options.json) printJson(json.forceExpireJson(result, seen))
        else print({
          expired: `expired: the key was released (lease ${seen}); the next retry runs the request again, with the same downstream key`,
          worker_alive: 'refused: a live worker holds this key within its deadline and is still processing it; nothing done',
          unchanged: `nothing done: the key completed, was released or changed hands (lease ${seen} is no longer current)`,
        }[result.outcome])
        if (result.outcome !== 'expired') state.exitCode = EXIT.refused
      })
    })

  program.command('expire-stale')
    .description('force-expire every stale processing key; keys whose completion is committing are skipped and listed')
    .option('--tenant <tenant>', 'only this tenant')
    .option('--yes', 'do it without asking (needed when not run in a terminal)')
    .option('--dry-run', 'show which keys it would expire, change nothing')
    .option('--actor <name>', 'who you are, noted in the audit trail beside your OS user')
    .option('--json', 'print JSON, as POST /admin/api/keys/expire-stale answers (with --dry-run: the preview)')
    .action((options: { tenant?: string; yes?: boolean; dryRun?: boolean; actor?: string; json?: boolean }) => {
      const actor = options.dryRun ? undefined : resolveActor(options.actor, io)
      return withOperations(async (ops) => {
        const tenant = parseKeyFilters({ tenant: options.tenant }).tenant
        const preview = await ops.previewExpireStale(tenant)
        const keys = preview.keys.map((key) => `  ${key.tenant} ${key.key} (${formatAge(key.ageSeconds)}, attempts ${key.attempts})`)
        const what = [
          `${preview.stale} key(s) in processing${tenant ? ` of tenant ${tenant}` : ''} are older than the server's TTL (${preview.ttlSeconds}s) at ${formatTime(preview.asOf)}:`,
          ...keys.map(printable),
          ...(preview.stale > keys.length ? [`  and ${preview.stale - keys.length} more`] : []),
          'Expiring releases each one: its client\'s next retry runs the request again, with the same downstream key.',
        ].join('\n')
        if (options.dryRun) {
          if (options.json) return printJson({ dry_run: true, ...json.expireStalePreviewJson(preview) })
          return print(`dry run, nothing done:\n${what}`)
        }
        await confirmed(io, options.yes, what)
        const result = await ops.expireStale({ asOf: preview.asOf, tenant }, actor!)
        if (options.json) return printJson(json.expireStaleJson(result))
        print(`expired ${result.expired} stale key(s); ${result.workerAlive} skipped because their completion was committing`)
        for (const key of result.aliveKeys) print(printable(`  skipped: ${key.tenant} ${key.key}`))
      })
    })

  program.command('purge')
    .description('delete keys past the server\'s retention now (the server also does this every minute)')
    .option('--yes', 'do it without asking (needed when not run in a terminal)')
    .option('--dry-run', 'show how many keys it would delete, change nothing')
    .option('--actor <name>', 'who you are, noted in the audit trail beside your OS user')
    .option('--json', 'print JSON, as POST /admin/api/purge answers (with --dry-run: the preview)')
    .action((options: { yes?: boolean; dryRun?: boolean; actor?: string; json?: boolean }) => {
      const actor = options.dryRun ? undefined : resolveActor(options.actor, io)
      return withOperations(async (ops) => {
        const preview = await ops.previewPurge()
        const what = [
          `${preview.done} completed and ${preview.released} released key(s) are past retention (${preview.retentionSeconds}s) at ${formatTime(preview.asOf)}.`,
          'A purge would delete them. None of them is replayed any more: a retry with one of them is already a new request.',
        ].join('\n')
        if (options.dryRun) {
          if (options.json) return printJson({ dry_run: true, ...json.purgePreviewJson(preview) })
          return print(`dry run, nothing done:\n${what}`)
        }
        await confirmed(io, options.yes, what)
        const result = await ops.purge(actor!)
        if (options.json) printJson(json.purgeJson(result))
        else print(`purged ${result.purged} expired key(s)`)
      })
    })
}
